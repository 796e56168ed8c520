#include "dtrain/checkpoint/tensor_bundle.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "checkpoint/bundle_index.h"
#include "checkpoint/object_graph.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "testutil/flip_byte.h"
#include "testutil/temp_dir.h"

namespace dtrain::checkpoint {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(DTRAIN_SOURCE_DIR) + "/../shared/fixtures/tf_checkpoints";

class BundleTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testutil::make_temp_dir("dtrain_bundle_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string dir_;
};

float scalar_f32(const BundleReader& r, const std::string& key) {
  Tensor t = r.read(key);
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.rank(), 0);
  return t.data<float>()[0];
}

// --- Fixtures written by TensorFlow --------------------------------------------------------

TEST_F(BundleTest, ReadsHalfPlusThree) {
  BundleReader r(kFixtures + "/half_plus_three/variables");
  EXPECT_EQ(r.num_shards(), 1);
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(scalar_f32(r, "a"), 0.5f);
  EXPECT_EQ(scalar_f32(r, "b"), 3.0f);
  EXPECT_EQ(scalar_f32(r, "c"), 3.0f);
  EXPECT_EQ(r.entry("b").offset, 4);
  EXPECT_EQ(r.entry("c").offset, 8);
  EXPECT_EQ(r.entry("a").masked_crc32c, 0x1f273806u);
  EXPECT_THROW(r.read("d"), NotFoundError);
}

TEST_F(BundleTest, ReadsCounter) {
  BundleReader r(kFixtures + "/counter/variables");
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"counter"}));
  EXPECT_EQ(scalar_f32(r, "counter"), 0.0f);
}

TEST_F(BundleTest, ReadsSnappyCompressedIndex) {
  BundleReader r(kFixtures + "/half_plus_two_snappy/variables");
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"a", "a2", "b", "c", "c2"}));
  EXPECT_EQ(scalar_f32(r, "a"), 0.5f);
  EXPECT_EQ(scalar_f32(r, "a2"), 0.5f);
  EXPECT_EQ(scalar_f32(r, "b"), 2.0f);
  EXPECT_EQ(scalar_f32(r, "c"), 3.0f);
  EXPECT_EQ(scalar_f32(r, "c2"), 3.0f);
}

TEST_F(BundleTest, ReadsTf2ObjectBasedSnappyBundle) {
  BundleReader r(kFixtures + "/half_plus_two_tf2_snappy/variables");
  EXPECT_EQ(scalar_f32(r, "a/.ATTRIBUTES/VARIABLE_VALUE"), 0.5f);
  EXPECT_EQ(scalar_f32(r, "b/.ATTRIBUTES/VARIABLE_VALUE"), 2.0f);
  EXPECT_EQ(scalar_f32(r, "c/.ATTRIBUTES/VARIABLE_VALUE"), 3.0f);
  const std::vector<std::string> graph = r.read_strings(std::string(kObjectGraphKey));
  ASSERT_EQ(graph.size(), 1u);
  const ObjectGraph g = ObjectGraph::parse(graph[0], "fixture");
  ASSERT_FALSE(g.nodes.empty());
  std::vector<std::string> keys;
  for (const auto& n : g.nodes) {
    for (const auto& a : n.attributes) keys.push_back(a.checkpoint_key);
  }
  EXPECT_NE(std::find(keys.begin(), keys.end(), "a/.ATTRIBUTES/VARIABLE_VALUE"), keys.end());
}

TEST_F(BundleTest, ReadsTwoShardKerasCheckpoint) {
  BundleReader r(kFixtures + "/keras_lso_two_shards/ckpt");
  EXPECT_EQ(r.num_shards(), 2);
  const Tensor kernel = r.read("layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE");
  EXPECT_EQ(kernel.shape(), (Shape{2, 2}));
  EXPECT_EQ(kernel.to_vector<float>(),
            (std::vector<float>{9.229685f, 10.901115f, 10.370763f, 9.757362f}));
  EXPECT_EQ(r.read("layer_with_weights-0/bias/.ATTRIBUTES/VARIABLE_VALUE").to_vector<float>(),
            (std::vector<float>{10.049943f, 9.917691f}));
  EXPECT_EQ(r.read("layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/base_optimizer/"
                   "momentum/.ATTRIBUTES/VARIABLE_VALUE")
                .to_vector<float>(),
            (std::vector<float>{10.049943f, 9.917691f, 10.049943f, 9.917691f}));
  const Tensor iter = r.read("optimizer/base_optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE");
  EXPECT_EQ(iter.dtype(), DType::kInt64);
  EXPECT_EQ(iter.data<int64_t>()[0], 1);
  EXPECT_EQ(r.read("optimizer/loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE").data<int64_t>()[0],
            1);
  EXPECT_EQ(scalar_f32(r, "optimizer/base_optimizer/learning_rate/.ATTRIBUTES/VARIABLE_VALUE"),
            0.1f);
  EXPECT_EQ(scalar_f32(r, "optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE"),
            32768.0f);
  EXPECT_EQ(r.entry(std::string(kObjectGraphKey)).shard_id, 0);
  EXPECT_EQ(r.entry(std::string(kObjectGraphKey)).size, 1360);
  const ObjectGraph g =
      ObjectGraph::parse(r.read_strings(std::string(kObjectGraphKey))[0], "fixture");
  // node 0: layer_with_weights-0 -> 1, layer-0 -> 1, optimizer -> 2 (formats.md §1.6).
  ASSERT_GE(g.nodes.size(), 15u);
  ASSERT_EQ(g.nodes[0].children.size(), 3u);
  EXPECT_EQ(g.nodes[0].children[0].local_name, "layer_with_weights-0");
  EXPECT_EQ(g.nodes[0].children[0].node_id, 1);
  EXPECT_EQ(g.nodes[0].children[1].local_name, "layer-0");
  EXPECT_EQ(g.nodes[0].children[1].node_id, 1);
  EXPECT_EQ(g.nodes[3].attributes.at(0).full_name, "sequential/dense/kernel");
  ASSERT_EQ(g.nodes[5].slot_variables.size(), 2u);
  EXPECT_EQ(g.nodes[5].slot_variables[0].slot_name, "momentum");
  EXPECT_EQ(g.nodes[5].slot_variables[0].original_variable_node_id, 3);
  EXPECT_EQ(g.nodes[5].slot_variables[0].slot_variable_node_id, 13);
}

// --- Byte identity with TF ------------------------------------------------------------------

TEST_F(BundleTest, HalfPlusThreeIndexAndDataAreByteIdenticalToTensorFlows) {
  {
    BundleWriter w(path("variables"));
    w.add("a", Tensor::scalar(0.5f));
    w.add("b", Tensor::scalar(3.0f));
    w.add("c", Tensor::scalar(3.0f));
    w.finish();
  }
  EXPECT_EQ(read_file(path("variables.index")),
            read_file(kFixtures + "/half_plus_three/variables.index"));
  EXPECT_EQ(read_file(path("variables.data-00000-of-00001")),
            read_file(kFixtures + "/half_plus_three/variables.data-00000-of-00001"));
  {
    BundleWriter w(path("counter"));
    w.add("counter", Tensor::scalar(0.0f));
    w.finish();
  }
  EXPECT_EQ(read_file(path("counter.index")), read_file(kFixtures + "/counter/variables.index"));
}

// --- Round trips ----------------------------------------------------------------------------

TEST_F(BundleTest, EveryDtypeRoundTripsBitwise) {
  const std::vector<DType> dtypes = {
      DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kUInt8,    DType::kInt16,
      DType::kInt8,    DType::kInt64,   DType::kBool,  DType::kBFloat16, DType::kUInt16,
      DType::kFloat16, DType::kUInt32,  DType::kUInt64};
  std::vector<std::pair<std::string, Tensor>> saved;
  uint64_t x = 88172645463325252ull;
  for (DType d : dtypes) {
    for (const Shape& s : {Shape{}, Shape{0}, Shape{3, 5}, Shape{2, 0, 4}, Shape{1, 2, 3, 4}}) {
      Tensor t(d, s);
      auto* p = static_cast<uint8_t*>(t.raw_data());
      for (size_t i = 0; i < t.nbytes(); ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = static_cast<uint8_t>(d == DType::kBool ? (x & 1) : x);
      }
      saved.emplace_back(std::string(dtype_name(d)) + "/" + s.to_string(), t);
    }
  }
  // NaN payloads and signed zeros survive (bitwise, not by value).
  Tensor special = Tensor::from_vector<float>({NAN, -0.0f, INFINITY, -NAN, 1e-45f}, Shape{5});
  uint32_t payload = 0x7fc01234u;
  std::memcpy(special.data<float>(), &payload, 4);
  saved.emplace_back("special", special);
  {
    BundleWriter w(path("ckpt"));
    for (const auto& [k, t] : saved) w.add(k, t);
    w.add_strings("strings", {"", "x", std::string("\0\xff\n", 3), std::string(300, 'q')},
                  Shape{2, 2});
    w.add_strings("no_strings", {}, Shape{0});
    w.finish();
  }
  BundleReader r(path("ckpt"));
  for (const auto& [k, t] : saved) {
    const Tensor back = r.read(k);
    EXPECT_TRUE(back.equals(t)) << k;
  }
  EXPECT_EQ(r.read_strings("strings"),
            (std::vector<std::string>{"", "x", std::string("\0\xff\n", 3), std::string(300, 'q')}));
  EXPECT_EQ(r.entry("strings").shape, (Shape{2, 2}));
  EXPECT_TRUE(r.read_strings("no_strings").empty());
  EXPECT_THROW(r.read("strings"), InvalidArgumentError);
  EXPECT_THROW(r.read_strings("special"), InvalidArgumentError);
}

TEST_F(BundleTest, LargeTensorAndManyKeysSpanSeveralIndexBlocks) {
  Tensor big(DType::kFloat32, Shape{3, 1000003});
  float* p = big.data<float>();
  for (int64_t i = 0; i < big.num_elements(); ++i) p[i] = static_cast<float>(i) * 0.25f;
  const int n = 6000;  // ~100-byte keys: more than 256 KiB of index, so several data blocks
  {
    BundleWriter w(path("ckpt"));
    for (int i = n - 1; i >= 0; --i) {  // any order; the index is sorted
      w.add(std::to_string(100000 + i) + std::string(90, 'k'),
            Tensor::scalar(static_cast<float>(i)));
    }
    w.add("big", big);
    w.finish();
  }
  EXPECT_GT(fs::file_size(path("ckpt.index")), 2 * 262144u);
  BundleReader r(path("ckpt"));
  EXPECT_EQ(r.keys().size(), static_cast<size_t>(n + 1));
  for (int i = 0; i < n; i += 997) {
    EXPECT_EQ(scalar_f32(r, std::to_string(100000 + i) + std::string(90, 'k')),
              static_cast<float>(i));
  }
  EXPECT_TRUE(r.read("big").equals(big));
}

// --- Errors and corruption --------------------------------------------------------------------

TEST_F(BundleTest, WriterRejectsDuplicateAndEmptyKeysAndLeavesNothingWhenAbandoned) {
  {
    BundleWriter w(path("ckpt"));
    w.add("a", Tensor::scalar(1.0f));
    EXPECT_THROW(w.add("a", Tensor::scalar(2.0f)), InvalidArgumentError);
    EXPECT_THROW(w.add("", Tensor::scalar(2.0f)), InvalidArgumentError);
    EXPECT_THROW(w.add_strings("s", {"x"}, Shape{2}), InvalidArgumentError);
  }  // never finished
  EXPECT_TRUE(fs::is_empty(dir_));
  EXPECT_THROW(BundleReader(path("ckpt")), NotFoundError);
}

TEST_F(BundleTest, EveryFlippedDataByteIsDetectedNamingFileAndTensor) {
  {
    BundleWriter w(path("ckpt"));
    w.add("w", Tensor::from_vector<float>({1, 2, 3, 4, 5}, Shape{5}));
    w.add("step", Tensor::from_vector<int64_t>({7}, Shape{}));
    w.add_strings("s", {"hello", "world"}, Shape{2});
    w.finish();
  }
  const std::string data = path("ckpt.data-00000-of-00001");
  const size_t size = fs::file_size(data);
  for (size_t off = 0; off < size; ++off) {
    testutil::flip_byte(data, off);
    BundleReader r(path("ckpt"));
    int detected = 0;
    for (const std::string& key : r.keys()) {
      try {
        if (key == "s") {
          r.read_strings(key);
        } else {
          r.read(key);
        }
      } catch (const DataLossError& e) {
        ++detected;
        EXPECT_NE(std::string(e.what()).find(data), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("'" + key + "'"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(detected, 1) << "offset " << off;
    testutil::flip_byte(data, off);  // restore
  }
}

TEST_F(BundleTest, TruncationIsDetected) {
  {
    BundleWriter w(path("ckpt"));
    w.add("w", Tensor::from_vector<float>({1, 2, 3, 4, 5}, Shape{5}));
    w.add("v", Tensor::from_vector<float>({6, 7}, Shape{2}));
    w.finish();
  }
  const std::string data = path("ckpt.data-00000-of-00001");
  fs::resize_file(data, fs::file_size(data) - 1);
  try {
    BundleReader r(path("ckpt"));
    FAIL() << "truncated data file accepted";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'v'"), std::string::npos) << e.what();
  }
  const std::string index = read_file(path("ckpt.index"));
  for (size_t len : {size_t{0}, size_t{10}, index.size() / 2, index.size() - 1}) {
    write_file_atomically(path("ckpt.index"), index.substr(0, len));
    EXPECT_THROW(BundleReader(path("ckpt")), DataLossError) << len;
  }
  write_file_atomically(path("ckpt.index"), index);
  fs::remove(data);
  EXPECT_THROW(BundleReader(path("ckpt")), DataLossError);
}

// The index's LevelDB footer has no checksum, and LevelDB allocates a block at the size the
// footer gives before reading it: a footer asking for 1 TiB was a std::bad_alloc (or a
// multi-gigabyte allocation) out of BundleReader (found by fuzzing). It is DataLoss now.
TEST_F(BundleTest, AFooterPointingPastTheIndexIsDataLoss) {
  const std::string prefix = kFixtures + "/counter/variables";
  std::string index = read_file(index_filename(prefix));
  ASSERT_GT(index.size(), 48u);
  // meta-index handle (0, 0); index handle (0, 2^40) as varints; zero padding; the magic stays.
  std::string footer = {'\0', '\0', '\0', '\x80', '\x80', '\x80', '\x80', '\x80', '\x20'};
  footer.resize(40, '\0');
  index.replace(index.size() - 48, 40, footer);
  const std::string shard = read_file(data_filename(prefix, 0, 1));
  try {
    BundleReader r("corrupt", {.index = index, .shards = {shard}});
    FAIL() << "accepted";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find("footer puts the index block at [0, +1099511627776)"),
              std::string::npos)
        << e.what();
  }
}

// --- A bundle in memory --------------------------------------------------------------------

// The files' bytes read into memory read as the files do: TF's two-shard fixture, every value.
TEST_F(BundleTest, BytesInMemoryReadAsTheFilesDo) {
  const std::string prefix = kFixtures + "/keras_lso_two_shards/ckpt";
  const std::string index = read_file(index_filename(prefix));
  const std::string shard0 = read_file(data_filename(prefix, 0, 2));
  const std::string shard1 = read_file(data_filename(prefix, 1, 2));
  BundleReader files(prefix);
  BundleReader memory("received", BundleBytes{.index = index, .shards = {shard0, shard1}});
  EXPECT_EQ(memory.num_shards(), 2);
  EXPECT_EQ(memory.keys(), files.keys());
  EXPECT_FALSE(memory.files_replaced());
  for (const std::string& key : files.keys()) {
    if (files.entry(key).dtype == DType::kString) {
      EXPECT_EQ(memory.read_strings(key), files.read_strings(key)) << key;
      continue;
    }
    const Tensor a = files.read(key), b = memory.read(key);
    ASSERT_EQ(a.nbytes(), b.nbytes()) << key;
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << key;
  }
}

// Damaged bytes in memory are reported as damaged files are, naming the bundle and the tensor.
TEST_F(BundleTest, DamagedBytesInMemoryAreDataLoss) {
  {
    BundleWriter w(path("ckpt"));
    w.add("w", Tensor::from_vector<float>({1, 2, 3, 4, 5}, Shape{5}));
    w.add("v", Tensor::from_vector<float>({6, 7}, Shape{2}));
    w.finish();
  }
  const std::string index = read_file(path("ckpt.index"));
  std::string data = read_file(path("ckpt.data-00000-of-00001"));
  data[2] ^= 0x10;  // inside "w"
  {
    BundleReader r("snap-7", BundleBytes{.index = index, .shards = {data}});
    EXPECT_EQ(r.read("v").to_vector<float>(), (std::vector<float>{6, 7}));
    try {
      r.read("w");
      FAIL() << "a flipped byte was read";
    } catch (const DataLossError& e) {
      EXPECT_NE(std::string(e.what()).find("snap-7"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
    }
  }
  data[2] ^= 0x10;
  const std::string_view short_data(data.data(), data.size() - 1);
  try {
    BundleReader r("snap-7", BundleBytes{.index = index, .shards = {short_data}});
    FAIL() << "a short shard was accepted";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'v'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(BundleReader("snap-7", BundleBytes{.index = index, .shards = {}}), DataLossError);
  // An index whose entry lies past the end by an offset so large that offset + size overflows:
  // refused before any byte is read (in memory, such a read would leave the shard's bytes).
  BundleEntries far;
  BundleEntry& e = far["w"];
  e.dtype = DType::kFloat32;
  e.shape = Shape{2};
  e.offset = std::numeric_limits<int64_t>::max() - 4;
  e.size = 8;
  const std::string far_index = detail::build_index(1, far, "test");
  try {
    BundleReader r("snap-7", BundleBytes{.index = far_index, .shards = {data}});
    FAIL() << "an entry past the shard's end was accepted";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(BundleReader("snap-7", BundleBytes{.index = index, .shards = {data, data}}),
               DataLossError);
  EXPECT_THROW(BundleReader("snap-7", BundleBytes{.index = std::string_view(index).substr(
                                                      0, index.size() / 2),
                                                  .shards = {data}}),
               DataLossError);
}

// A flipped index byte either raises DataLossError or changes nothing that matters (LevelDB
// ignores the footer's padding and, without a filter policy, the metaindex): never wrong values.
TEST_F(BundleTest, FlippedIndexBytesNeverYieldWrongValues) {
  const Tensor w = Tensor::from_vector<float>({1, 2, 3, 4, 5}, Shape{5});
  const Tensor v = Tensor::from_vector<int64_t>({-6, 7}, Shape{2});
  {
    BundleWriter bw(path("ckpt"));
    bw.add("w", w);
    bw.add("v", v);
    bw.finish();
  }
  const std::string index = read_file(path("ckpt.index"));
  int detected = 0;
  for (size_t off = 0; off < index.size(); ++off) {
    std::string bad = index;
    bad[off] = static_cast<char>(bad[off] ^ 0x10);
    write_file_atomically(path("ckpt.index"), bad, {.sync = false});
    try {
      BundleReader r(path("ckpt"));
      EXPECT_TRUE(r.read("w").equals(w)) << off;
      EXPECT_TRUE(r.read("v").equals(v)) << off;
    } catch (const DataLossError&) {
      ++detected;
    }
  }
  EXPECT_GT(detected, static_cast<int>(index.size()) / 2);
}

}  // namespace
}  // namespace dtrain::checkpoint
