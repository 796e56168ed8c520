// TFRecord framing: the reader returns every complete record, stops at a torn tail with a clear
// indication, names the offset of a CRC mismatch, and can skip corruption.
#include "dtrain/summary/record.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dtrain/core/error.h"
#include "testutil/flip_byte.h"
#include "testutil/temp_dir.h"

namespace dtrain::summary {
namespace {

namespace fs = std::filesystem;

class RecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testutil::make_temp_dir("dtrain_record_test");
    path_ = (fs::path(dir_) / "r.tfrecord").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes records "r0", "record 1", ... and returns their start offsets.
  std::vector<uint64_t> write_records(int n) {
    std::ofstream f(path_, std::ios::binary);
    std::vector<uint64_t> offsets;
    uint64_t off = 0;
    for (int i = 0; i < n; ++i) {
      const std::string rec = encode_record(payload(i));
      offsets.push_back(off);
      off += rec.size();
      f << rec;
    }
    return offsets;
  }
  static std::string payload(int i) { return "record " + std::to_string(i) + std::string(i, '*'); }

  std::string dir_, path_;
};

TEST_F(RecordTest, FramingLayout) {
  const std::string rec = encode_record("abc");
  ASSERT_EQ(rec.size(), 12u + 3 + 4);
  EXPECT_EQ(rec.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(rec.substr(12, 3), "abc");
}

TEST_F(RecordTest, ReadsAllRecordsWithOffsets) {
  const auto offsets = write_records(5);
  RecordReader r(path_);
  std::string data;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(r.read(&data));
    EXPECT_EQ(data, payload(i));
    EXPECT_EQ(r.record_offset(), offsets[i]);
  }
  EXPECT_FALSE(r.read(&data));
  EXPECT_FALSE(r.truncated());
}

TEST_F(RecordTest, TruncatedTailReadsCompleteRecordsThenStops) {
  const auto offsets = write_records(4);
  const uint64_t size = fs::file_size(path_);
  for (uint64_t cut : {size - 1, offsets[3] + 12, offsets[3] + 5}) {  // shrinking only
    fs::resize_file(path_, cut);
    RecordReader r(path_);
    std::string data;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(r.read(&data)) << cut;
    EXPECT_FALSE(r.read(&data));
    EXPECT_TRUE(r.truncated());
    EXPECT_NE(r.truncation().find("truncated record at offset " + std::to_string(offsets[3])),
              std::string::npos)
        << r.truncation();
    EXPECT_EQ(r.offset(), offsets[3]);
  }
}

TEST_F(RecordTest, ZeroFilledTailIsTruncationNotCorruption) {
  const auto offsets = write_records(3);
  fs::resize_file(path_, offsets[2]);
  fs::resize_file(path_, offsets[2] + 40);  // size made it to disk, the data did not
  RecordReader r(path_);
  std::string data;
  ASSERT_TRUE(r.read(&data));
  ASSERT_TRUE(r.read(&data));
  EXPECT_FALSE(r.read(&data));
  EXPECT_TRUE(r.truncated());
  EXPECT_NE(r.truncation().find("zero bytes"), std::string::npos) << r.truncation();
}

TEST_F(RecordTest, ResumesWhenTheTornTailIsCompleted) {
  const std::string rec = encode_record("appended later");
  { std::ofstream(path_, std::ios::binary) << encode_record("first") << rec.substr(0, 7); }
  RecordReader r(path_);
  std::string data;
  ASSERT_TRUE(r.read(&data));
  EXPECT_FALSE(r.read(&data));
  EXPECT_TRUE(r.truncated());
  { std::ofstream(path_, std::ios::binary | std::ios::app) << rec.substr(7); }
  ASSERT_TRUE(r.read(&data));
  EXPECT_EQ(data, "appended later");
  EXPECT_FALSE(r.truncated());
}

TEST_F(RecordTest, FlippedDataByteIsDataLossNamingTheOffset) {
  const auto offsets = write_records(4);
  testutil::flip_byte(path_, offsets[2] + 12 + 3);
  RecordReader r(path_);
  std::string data;
  ASSERT_TRUE(r.read(&data));
  ASSERT_TRUE(r.read(&data));
  try {
    r.read(&data);
    FAIL() << "no error";
  } catch (const DataLossError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("record at offset " + std::to_string(offsets[2])), std::string::npos) << msg;
    EXPECT_NE(msg.find("data CRC mismatch"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  }
}

TEST_F(RecordTest, FlippedLengthByteIsDataLoss) {
  const auto offsets = write_records(3);
  testutil::flip_byte(path_, offsets[1] + 2);
  RecordReader r(path_);
  std::string data;
  ASSERT_TRUE(r.read(&data));
  try {
    r.read(&data);
    FAIL() << "no error";
  } catch (const DataLossError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("offset " + std::to_string(offsets[1]) + ": length CRC mismatch"),
              std::string::npos)
        << msg;
  }
}

TEST_F(RecordTest, SkipCorruptResynchronises) {
  const auto offsets = write_records(6);
  testutil::flip_byte(path_, offsets[1] + 1);       // length
  testutil::flip_byte(path_, offsets[4] + 12 + 2);  // data
  RecordReader r(path_, {.skip_corrupt = true});
  std::vector<std::string> got;
  std::string data;
  while (r.read(&data)) got.push_back(data);
  EXPECT_EQ(got, (std::vector<std::string>{payload(0), payload(2), payload(3), payload(5)}));
  ASSERT_EQ(r.corrupt_regions().size(), 2u);
  EXPECT_EQ(r.corrupt_regions()[0].offset, offsets[1]);
  EXPECT_EQ(r.corrupt_regions()[0].length, offsets[2] - offsets[1]);
  EXPECT_EQ(r.corrupt_regions()[1].offset, offsets[4]);
  EXPECT_EQ(r.corrupt_regions()[1].length, offsets[5] - offsets[4]);
  EXPECT_NE(r.corrupt_regions()[1].reason.find("data CRC mismatch"), std::string::npos);
}

TEST_F(RecordTest, MissingFileIsNotFound) {
  EXPECT_THROW(RecordReader(dir_ + "/nope"), NotFoundError);
  EXPECT_THROW(RecordReader{dir_}, InvalidArgumentError);
}

TEST(RecordReaderDevice, AnEndlessDeviceOfZerosIsDataLossAtOffsetZeroNotAnEndlessScan) {
  // /dev/zero has no end: its zero header is not a torn tail (only a regular file has a tail),
  // and skipping ahead to a valid record would scan forever, so both modes stop at offset 0.
  for (const bool skip : {false, true}) {
    SCOPED_TRACE(skip);
    RecordReader r("/dev/zero", {.skip_corrupt = skip});
    std::string data;
    try {
      r.read(&data);
      FAIL() << "expected DataLossError";
    } catch (const DataLossError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("/dev/zero: record at offset 0: length CRC mismatch", 0), 0u) << msg;
      EXPECT_NE(msg.find("zero bytes"), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace dtrain::summary
