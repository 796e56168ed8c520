// Partitioned tensors in TensorBundles: TF's slice keys, AddSlice's entries, reading a tensor or
// a row range assembled from the slices of one bundle or of several data shards (a sharded
// bundle whose index was merged from per-shard entries), and corrupt slice layouts.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dtrain/checkpoint/merge_bundles.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "testutil/temp_dir.h"

namespace dtrain::checkpoint {
namespace {

namespace fs = std::filesystem;

class SliceTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testutil::make_temp_dir("dtrain_slice_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string dir_;
};

// A [rows, cols] float tensor with element (r, c) = r * 100 + c.
Tensor matrix(int64_t rows, int64_t cols, int64_t first_row = 0) {
  Tensor t(DType::kFloat32, Shape{rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t.data<float>()[r * cols + c] = static_cast<float>((first_row + r) * 100 + c);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(SliceKeyTest, EncodesAsTensorFlowsEncodeTensorNameSlice) {
  // OrderedCode: NumIncreasing(0) = 00; String("foo") = "foo" 00 01; NumIncreasing(2) = 01 02;
  // SignedNumIncreasing: 1 -> 81, 2 -> 82, full dimension (0, -1) -> 80 7f.
  EXPECT_EQ(encode_tensor_name_slice("foo", TensorSlice::rows(2, 1, 3)), std::string("\x00"
                                                                                     "foo\x00\x01"
                                                                                     "\x01\x02"
                                                                                     "\x81\x82"
                                                                                     "\x80\x7f",
                                                                                     12));
  // Two-byte signed numbers (64 <= |x| < 8192): header bits 110 then the value; bytes 00 and ff
  // in the name are escaped.
  EXPECT_EQ(encode_tensor_name_slice(std::string("a\x00\xff", 3), TensorSlice::rows(1, 100, 300)),
            std::string("\x00"
                        "a\x00\xff\xff\x00\x00\x01"
                        "\x01\x01"
                        "\xc0\x64"
                        "\xc0\xc8",
                        14));
  // 8192 needs three bytes (header 1110).
  EXPECT_EQ(encode_tensor_name_slice("x", TensorSlice::rows(1, 0, 8192)),
            std::string("\x00"
                        "x\x00\x01"
                        "\x01\x01"
                        "\x80"
                        "\xe0\x20\x00",
                        10));
  EXPECT_EQ(TensorSlice::rows(3, 4, 6).to_string(), "4,2:-:-");
}

TEST_F(SliceTest, AddSliceWritesTensorFlowsEntries) {
  const Tensor full = matrix(5, 3);
  {
    BundleWriter w(path("b"));
    w.add("plain", matrix(2, 2));
    w.add_slice("w", Shape{5, 3}, TensorSlice::rows(2, 0, 2), matrix(2, 3, 0));
    w.add_slice("w", Shape{5, 3}, TensorSlice::rows(2, 2, 5), matrix(3, 3, 2));
    EXPECT_THROW(w.add_slice("w", Shape{5, 3}, TensorSlice::rows(2, 4, 6), matrix(2, 3)),
                 InvalidArgumentError);  // outside the shape
    EXPECT_THROW(w.add_slice("w", Shape{5, 3}, TensorSlice::rows(2, 0, 2), matrix(3, 3)),
                 InvalidArgumentError);  // wrong slice shape
    EXPECT_THROW(w.add_slice("plain", Shape{2, 2}, TensorSlice::rows(2, 0, 1), matrix(1, 2)),
                 InvalidArgumentError);  // already a plain tensor
    w.finish();
  }
  BundleReader r(path("b"));
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"plain", "w"}));  // slice entries hidden
  EXPECT_EQ(r.entries().size(), 4u);
  const BundleEntry& e = r.entry("w");
  EXPECT_TRUE(e.partitioned);
  EXPECT_EQ(e.shape, (Shape{5, 3}));
  EXPECT_EQ(e.dtype, DType::kFloat32);
  ASSERT_EQ(e.slices.size(), 2u);
  EXPECT_EQ(e.slices[1].to_string(), "2,3:-");
  EXPECT_EQ(e.size, 0);  // the full entry has no location, as in TF
  const BundleEntry& s1 = r.slice_entry("w", e.slices[1]);
  EXPECT_EQ(s1.shape, (Shape{3, 3}));
  EXPECT_EQ(s1.size, 36);
  EXPECT_NE(s1.masked_crc32c, 0u);
  EXPECT_TRUE(same_bytes(r.read("w"), full));
  EXPECT_TRUE(same_bytes(r.read_rows("w", 1, 4), matrix(3, 3, 1)));  // spans both slices
  EXPECT_TRUE(same_bytes(r.read_rows("w", 3, 3), matrix(0, 3, 3)));
  EXPECT_TRUE(same_bytes(r.read_rows("plain", 1, 2), matrix(1, 2, 1)));
  EXPECT_THROW(r.read_rows("w", 4, 6), InvalidArgumentError);
}

TEST_F(SliceTest, ShardedBundleReadsAcrossShards) {
  // Three shards, as three workers of a sharded save write them: shard k holds rows of "w" and
  // shard 0 also the plain tensor; the index is merged from the shards' entries.
  const int n = 3;
  const int64_t bounds[] = {0, 3, 4, 7};
  BundleEntries merged;
  for (int k = 0; k < n; ++k) {
    BundleWriter w(path("s"), BundleWriterOptions{.shard = k, .num_shards = n});
    if (k == 0) w.add("step", Tensor::from_vector<int64_t>({42}, Shape{}));
    w.add_slice("w", Shape{7, 4}, TensorSlice::rows(2, bounds[k], bounds[k + 1]),
                matrix(bounds[k + 1] - bounds[k], 4, bounds[k]));
    // The entries travel as bytes (to the chief, over the collective channel).
    const BundleEntries mine =
        parse_bundle_entries(serialize_bundle_entries(w.finish_shard()), "t");
    merge_bundle_entries(merged, mine, "test");
  }
  EXPECT_FALSE(fs::exists(path("s.index")));
  write_bundle_index(path("s"), n, merged, true);
  for (int k = 0; k < n; ++k) EXPECT_TRUE(fs::exists(data_filename(path("s"), k, n)));
  BundleReader r(path("s"));
  EXPECT_EQ(r.num_shards(), 3);
  EXPECT_EQ(r.entry("w").slices.size(), 3u);
  EXPECT_EQ(r.slice_entry("w", r.entry("w").slices[2]).shard_id, 2);
  EXPECT_TRUE(same_bytes(r.read("w"), matrix(7, 4)));
  for (int64_t b = 0; b <= 7; ++b)
    for (int64_t e = b; e <= 7; ++e)
      EXPECT_TRUE(same_bytes(r.read_rows("w", b, e), matrix(e - b, 4, b)));
  EXPECT_EQ(r.read("step").data<int64_t>()[0], 42);
}

// TensorFlow may partition along any dimension: column slices are not one contiguous run of the
// full tensor, so they are copied into place; row slices are read straight into it. Both give
// the full tensor, alone and mixed in one read.
TEST_F(SliceTest, ColumnSlicesAssembleLikeRowSlices) {
  const Tensor full = matrix(4, 5);
  auto columns = [&](int64_t c0, int64_t c1) {
    Tensor t(DType::kFloat32, Shape{4, c1 - c0});
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = c0; c < c1; ++c) t.data<float>()[r * (c1 - c0) + c - c0] = r * 100 + c;
    return t;
  };
  {
    BundleWriter w(path("cols"));
    TensorSlice left, right;
    left.extents = {{0, -1}, {0, 2}};
    right.extents = {{0, -1}, {2, 3}};
    w.add_slice("w", Shape{4, 5}, left, columns(0, 2));
    w.add_slice("w", Shape{4, 5}, right, columns(2, 5));
    w.finish();
  }
  BundleReader r(path("cols"));
  EXPECT_TRUE(same_bytes(r.read("w"), full));
  for (int64_t b = 0; b <= 4; ++b)
    for (int64_t e = b; e <= 4; ++e)
      EXPECT_TRUE(same_bytes(r.read_rows("w", b, e), matrix(e - b, 5, b)));
}

TEST_F(SliceTest, MergeBundlesUnitesSlicesOfOneTensor) {
  for (int k = 0; k < 2; ++k) {
    BundleWriter w(path("part" + std::to_string(k)));
    w.add_slice("w", Shape{4, 2}, TensorSlice::rows(2, 2 * k, 2 * k + 2), matrix(2, 2, 2 * k));
    w.finish();
  }
  const std::vector<std::string> parts{path("part0"), path("part1")};
  merge_bundles(parts, path("merged"));
  BundleReader r(path("merged"));
  EXPECT_EQ(r.num_shards(), 2);
  EXPECT_TRUE(same_bytes(r.read("w"), matrix(4, 2)));
}

TEST_F(SliceTest, MissingOrOverlappingSlicesAreDataLoss) {
  BundleEntries merged;
  {
    BundleWriter w(path("gap"), BundleWriterOptions{.shard = 0, .num_shards = 2});
    w.add_slice("w", Shape{4, 2}, TensorSlice::rows(2, 0, 2), matrix(2, 2));
    merge_bundle_entries(merged, w.finish_shard(), "test");
  }
  // Shard 1 never reports its rows [2, 4): the index cannot be written for it...
  BundleEntries claimed = merged;
  claimed["w"].slices.push_back(TensorSlice::rows(2, 2, 4));
  EXPECT_THROW(write_bundle_index(path("gap"), 2, claimed, false), InvalidArgumentError);
  // ...and an index that lacks them (shard 1 wrote nothing) reads as data loss, naming the
  // tensor.
  BundleWriter(path("gap"), BundleWriterOptions{.shard = 1, .num_shards = 2}).finish_shard();
  write_bundle_index(path("gap"), 2, merged, false);
  BundleReader r(path("gap"));
  EXPECT_TRUE(same_bytes(r.read_rows("w", 0, 2), matrix(2, 2)));
  try {
    r.read("w");
    FAIL() << "read a tensor with a missing slice";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  // Two shards claiming the same rows are rejected when merging.
  BundleEntries twice = merged;
  EXPECT_THROW(merge_bundle_entries(twice, merged, "test"), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::checkpoint
