#include "dtrain/data/idx.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "testutil/temp_dir.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testutil::make_temp_dir("dtrain_idx_test"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  static void write_plain(const std::string& p, const std::vector<uint8_t>& bytes) {
    FILE* f = std::fopen(p.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    if (!bytes.empty()) {
      ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    }
    std::fclose(f);
  }
  static void write_gz(const std::string& p, const std::vector<uint8_t>& bytes) {
    gzFile f = gzopen(p.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  }

  std::string dir_;
};

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

// An IDX file: magic 00 00 <type> <rank>, dims, then `payload` (already big-endian).
std::vector<uint8_t> idx_bytes(uint8_t type, const std::vector<uint32_t>& dims,
                               const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<uint8_t> uint8_payload(size_t n) {
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 37 + 5);
  return p;
}

TEST_F(IdxTest, ReadsPlainAndGzippedUint8) {
  const std::vector<uint8_t> payload = uint8_payload(2 * 3 * 4);
  const std::vector<uint8_t> bytes = idx_bytes(0x08, {2, 3, 4}, payload);
  write_plain(path("a.idx"), bytes);
  write_gz(path("a.idx.gz"), bytes);
  write_gz(path("gz_without_suffix"), bytes);
  for (const char* name : {"a.idx", "a.idx.gz", "gz_without_suffix"}) {
    const Tensor t = read_idx(path(name));
    EXPECT_EQ(t.dtype(), DType::kUInt8) << name;
    EXPECT_EQ(t.shape(), (Shape{2, 3, 4})) << name;
    EXPECT_EQ(t.to_vector<uint8_t>(), payload) << name;
  }
}

TEST_F(IdxTest, ConvertsBigEndianMultiByteTypes) {
  // int32 {1, -2, 0x01020304}, big-endian.
  write_gz(path("i32.gz"), idx_bytes(0x0C, {3}, {0, 0, 0, 1, 0xFF, 0xFF, 0xFF, 0xFE, 1, 2, 3, 4}));
  EXPECT_EQ(read_idx(path("i32.gz")).to_vector<int32_t>(),
            (std::vector<int32_t>{1, -2, 0x01020304}));
  // float32 {1.5, -2.0}: 0x3FC00000, 0xC0000000.
  write_plain(path("f32"), idx_bytes(0x0D, {1, 2}, {0x3F, 0xC0, 0, 0, 0xC0, 0, 0, 0}));
  const Tensor f = read_idx(path("f32"));
  EXPECT_EQ(f.shape(), (Shape{1, 2}));
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1.5f, -2.0f}));
  // float64 {0.25}: 0x3FD0000000000000; int16 {-1, 258}; int8 {-3}.
  write_plain(path("f64"), idx_bytes(0x0E, {1}, {0x3F, 0xD0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(read_idx(path("f64")).to_vector<double>(), (std::vector<double>{0.25}));
  write_plain(path("i16"), idx_bytes(0x0B, {2}, {0xFF, 0xFF, 1, 2}));
  EXPECT_EQ(read_idx(path("i16")).to_vector<int16_t>(), (std::vector<int16_t>{-1, 258}));
  write_plain(path("i8"), idx_bytes(0x09, {1}, {0xFD}));
  EXPECT_EQ(read_idx(path("i8")).to_vector<int8_t>(), (std::vector<int8_t>{-3}));
}

TEST_F(IdxTest, MissingFileIsNotFoundNamingThePath) {
  const std::string p = path("nope.idx.gz");
  try {
    read_idx(p);
    FAIL() << "expected NotFoundError";
  } catch (const NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(IdxTest, WrongMagicIsDataLoss) {
  write_plain(path("text.idx"), {'h', 'e', 'l', 'l', 'o', '\n'});
  try {
    read_idx(path("text.idx"));
    FAIL() << "expected DataLossError";
  } catch (const DataLossError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path("text.idx") + ": not an IDX file (magic 0x68656C6C)"),
              std::string::npos)
        << msg;
  }
  // Valid leading zeros but an unknown type code.
  write_gz(path("badtype.gz"), idx_bytes(0x07, {1}, {0}));
  EXPECT_THROW(read_idx(path("badtype.gz")), DataLossError);
  // Empty file.
  write_plain(path("empty"), {});
  EXPECT_THROW(read_idx(path("empty")), DataLossError);
}

TEST_F(IdxTest, TruncatedFileIsDataLossWithByteCounts) {
  const std::vector<uint8_t> bytes = idx_bytes(0x08, {10, 10}, uint8_payload(100));
  const std::vector<uint8_t> truncated(bytes.begin(), bytes.end() - 30);  // 70 of 100 bytes
  for (bool gz : {false, true}) {
    const std::string p = path(gz ? "short.gz" : "short");
    gz ? write_gz(p, truncated) : write_plain(p, truncated);
    try {
      read_idx(p);
      FAIL() << "expected DataLossError";
    } catch (const DataLossError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      EXPECT_NE(msg.find("expected 100 bytes"), std::string::npos) << msg;
      EXPECT_NE(msg.find("got 70"), std::string::npos) << msg;
    }
  }
  // Truncated inside the dimensions.
  write_plain(path("short_header"), std::vector<uint8_t>(bytes.begin(), bytes.begin() + 6));
  EXPECT_THROW(read_idx(path("short_header")), DataLossError);
}

TEST_F(IdxTest, TruncatedGzipStreamIsDataLoss) {
  // Cut the compressed file itself (not the payload before compression).
  write_gz(path("full.gz"), idx_bytes(0x08, {1000}, uint8_payload(1000)));
  FILE* f = std::fopen(path("full.gz").c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::vector<uint8_t> gz(4096);
  gz.resize(std::fread(gz.data(), 1, gz.size(), f));
  std::fclose(f);
  ASSERT_GT(gz.size(), 40u);
  write_plain(path("cut.gz"), std::vector<uint8_t>(gz.begin(), gz.end() - 20));
  try {
    read_idx(path("cut.gz"));
    FAIL() << "expected DataLossError";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find(path("cut.gz")), std::string::npos) << e.what();
  }
}

TEST_F(IdxTest, HeaderClaimingMoreDataThanTheFileHoldsIsDataLossBeforeAllocating) {
  // 10^9 images of 28x28 (784 GB) with a 100-byte payload: refused from the file's size, naming
  // the file and the header's dimensions, without allocating them.
  write_plain(path("lying.idx"), idx_bytes(0x08, {1000000000, 28, 28}, uint8_payload(100)));
  try {
    read_idx(path("lying.idx"));
    FAIL() << "expected DataLossError";
  } catch (const DataLossError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path("lying.idx")), std::string::npos) << msg;
    EXPECT_NE(msg.find("[1000000000, 28, 28] (the header's dimensions), got 100"),
              std::string::npos)
        << msg;
  }
  // Gzipped, the payload is bounded by deflate's ratio (1032:1) times the compressed size.
  write_gz(path("lying.gz"), idx_bytes(0x0D, {1000000000}, uint8_payload(100)));
  try {
    read_idx(path("lying.gz"));
    FAIL() << "expected DataLossError";
  } catch (const DataLossError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path("lying.gz")), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected 4000000000 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("decompresses to at most"), std::string::npos) << msg;
  }
}

TEST_F(IdxTest, RankZeroIsDataLossNamingTheFile) {
  write_plain(path("scalar.idx"), idx_bytes(0x08, {}, {5}));
  try {
    read_idx(path("scalar.idx"));
    FAIL() << "expected DataLossError";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find(path("scalar.idx")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtrain::data
