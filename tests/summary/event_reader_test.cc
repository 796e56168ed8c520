// EventReader on files dtrain writes: a crash-torn tail, a flipped byte, and skip_corrupt.
#include "dtrain/summary/event_reader.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/summary/summary_writer.h"
#include "testutil/flip_byte.h"
#include "testutil/temp_dir.h"

namespace dtrain::summary {
namespace {

namespace fs = std::filesystem;

class EventReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testutil::make_temp_dir("dtrain_event_reader_test");
    SummaryWriter w(dir_, {.fsync = false});
    for (int i = 0; i < 10; ++i) w.scalar("loss", 1.0 / (i + 1), i);
    w.close();
    path_ = w.path();
    // Record offsets: all records of this file have the same size after the first.
    RecordReader r(path_);
    std::string data;
    while (r.read(&data)) offsets_.push_back(r.record_offset());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string dir_, path_;
  std::vector<uint64_t> offsets_;
};

TEST_F(EventReaderTest, TruncatedFileReadsCompleteEventsThenStops) {
  ASSERT_EQ(offsets_.size(), 11u);
  fs::resize_file(path_, fs::file_size(path_) - 3);  // a crash mid-append
  EventReader r(path_);
  int n = 0;
  while (auto e = r.next()) ++n;
  EXPECT_EQ(n, 10);  // file_version + 9 scalars; the 10th is torn
  EXPECT_EQ(r.count(), 10u);
  EXPECT_TRUE(r.truncated());
  EXPECT_NE(r.truncation().find("offset " + std::to_string(offsets_[10])), std::string::npos)
      << r.truncation();
  EXPECT_EQ(read_events(path_).size(), 10u);
}

TEST_F(EventReaderTest, FlippedByteIsDataLossNamingTheOffset) {
  dtrain::testutil::flip_byte(path_, offsets_[5] + 20, 0x7f);
  EventReader r(path_);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(r.next());
  try {
    r.next();
    FAIL() << "no error";
  } catch (const DataLossError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path_ + ": record at offset " + std::to_string(offsets_[5])),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("CRC mismatch"), std::string::npos) << msg;
  }
  EventReader skip(path_, {.skip_corrupt = true});
  std::vector<int64_t> steps;
  while (auto e = skip.next()) steps.push_back(e->step);
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 0, 1, 2, 3, 5, 6, 7, 8, 9}));
  ASSERT_EQ(skip.corrupt_regions().size(), 1u);
  EXPECT_EQ(skip.corrupt_regions()[0].offset, offsets_[5]);
}

TEST_F(EventReaderTest, ValidFramingAroundBadProtoIsDataLoss) {
  { std::ofstream(path_, std::ios::binary | std::ios::app) << encode_record("\x0a\xff"); }
  EXPECT_THROW(read_events(path_), DataLossError);
  EventReader r(path_, {.skip_corrupt = true});
  int n = 0;
  while (r.next()) ++n;
  EXPECT_EQ(n, 11);
  ASSERT_EQ(r.corrupt_regions().size(), 1u);
  EXPECT_NE(r.corrupt_regions()[0].reason.find("not an Event"), std::string::npos);
}

}  // namespace
}  // namespace dtrain::summary
