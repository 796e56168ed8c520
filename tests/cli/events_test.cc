// `dtrain events` run as a user would: TensorFlow's fixture, a file dtrain wrote, a log
// directory, --json, a flipped byte (DATA_LOSS naming the offset, or skipped with --skip-corrupt)
// and a torn tail.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "dtrain/summary/record.h"
#include "dtrain/summary/summary_writer.h"
#include "testutil/flip_byte.h"
#include "testutil/run_dtrain.h"
#include "testutil/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using dtrain::testutil::contains;
using Result = dtrain::testutil::CommandResult;
Result run(const std::string& args, bool with_stderr = true) {
  return dtrain::testutil::run_dtrain(args, with_stderr);
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

const std::string kFixture = "../shared/fixtures/tensorboard/go_tb_my_metric.v2.tfevents";

class EventsCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = dtrain::testutil::make_temp_dir("dtrain_events_cli_test"); }
  void TearDown() override { fs::remove_all(dir_); }

  // A run written by dtrain's SummaryWriter; returns the file.
  std::string write_run(const std::string& logdir) {
    dtrain::summary::SummaryWriter w(logdir);
    w.scalar("epoch_loss", 0.25, 1);
    w.scalar("epoch_loss", 0.125, 2);
    w.text("fault", "worker 1 exited on signal 9 at step 1234; restarted", 1234);
    w.scalar("restarts", 1, 1234);
    w.close();
    return w.path();
  }

  std::string dir_;
};

TEST_F(EventsCliTest, DumpsTensorFlowsFile) {
  const Result r = run("events " + kFixture);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ls = lines(r.output);
  ASSERT_EQ(ls.size(), 102u) << r.output;
  EXPECT_EQ(ls[0], "@0 wall_time=1585499054 step=0 file_version=\"brain.Event:2\"");
  EXPECT_TRUE(
      contains(ls[1], " step=0 scalar tag=\"my_metric\" value=0 dtype=float32 plugin=scalars"))
      << ls[1];
  EXPECT_TRUE(contains(ls[100],
                       " step=99 scalar tag=\"my_metric\" value=49.5 dtype=float32 plugin=scalars"))
      << ls[100];
  EXPECT_EQ(ls[101], "101 records in 1 file(s)");
}

TEST_F(EventsCliTest, JsonHasOneObjectPerRecord) {
  const Result r = run("events --json " + kFixture, /*with_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ls = lines(r.output);
  ASSERT_EQ(ls.size(), 101u);
  const auto first = nlohmann::json::parse(ls[0]);
  EXPECT_EQ(first["file_version"], "brain.Event:2");
  EXPECT_EQ(first["offset"], 0);
  for (int step = 0; step < 100; ++step) {
    const auto j = nlohmann::json::parse(ls[step + 1]);
    EXPECT_EQ(j["step"], step);
    EXPECT_EQ(j["values"][0]["tag"], "my_metric");
    EXPECT_EQ(j["values"][0]["value"].get<double>(), 0.5 * step);
    EXPECT_EQ(j["values"][0]["plugin"], "scalars");
  }
}

TEST_F(EventsCliTest, DumpsWhatDtrainWroteAndWholeLogDirectories) {
  const std::string file = write_run(dir_ + "/logs/train");
  Result r = run("events " + file);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "file_version=\"brain.Event:2\"")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "step=2 scalar tag=\"epoch_loss\" value=0.125 dtype=float32 plugin=scalars"))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "step=1234 text tag=\"fault\" text=\"worker 1 exited on signal 9 at step "
                       "1234; restarted\" dtype=string plugin=text"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "5 records in 1 file(s)")) << r.output;

  write_run(dir_ + "/logs/validation");
  r = run("events " + dir_ + "/logs");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "# " + file)) << r.output;
  EXPECT_TRUE(contains(r.output, "10 records in 2 file(s)")) << r.output;
}

TEST_F(EventsCliTest, FlippedByteIsDataLossWithTheOffsetUnlessSkipped) {
  const std::string file = write_run(dir_);
  uint64_t third = 0;
  {
    dtrain::summary::RecordReader rr(file);
    std::string data;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(rr.read(&data));
    third = rr.record_offset();
  }
  // XOR, not a fixed value: byte 14 is inside the wall time, which may already be any value.
  dtrain::testutil::flip_byte(file, third + 14, 0x55);
  Result r = run("events " + file);
  EXPECT_EQ(r.code, 4) << r.output;  // DATA_LOSS
  EXPECT_TRUE(contains(r.output, "dtrain: error: DATA_LOSS: " + file + ": record at offset " +
                                     std::to_string(third) + ": data CRC mismatch"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "step=1 scalar tag=\"epoch_loss\" value=0.25")) << r.output;

  r = run("events --skip-corrupt " + file);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "warning: " + file + ": skipped ")) << r.output;
  EXPECT_TRUE(contains(r.output, "corrupt bytes at offset " + std::to_string(third))) << r.output;
  EXPECT_FALSE(contains(r.output, "value=0.125")) << r.output;
  EXPECT_TRUE(contains(r.output, "tag=\"restarts\" value=1")) << r.output;
  EXPECT_TRUE(contains(r.output, "4 records in 1 file(s)")) << r.output;
}

TEST_F(EventsCliTest, TornTailIsAWarningAfterTheCompleteRecords) {
  const std::string file = write_run(dir_);
  fs::resize_file(file, fs::file_size(file) - 5);
  const Result r = run("events " + file);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "text tag=\"fault\"")) << r.output;
  EXPECT_TRUE(contains(r.output, "warning: " + file + ": truncated record at offset ")) << r.output;
  EXPECT_TRUE(contains(r.output, "4 records in 1 file(s)")) << r.output;
}

TEST_F(EventsCliTest, UsageAndMissingFiles) {
  EXPECT_TRUE(contains(run("--help").output, "events"));
  EXPECT_EQ(run("events").code, 2);
  Result r = run("events " + dir_ + "/missing");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "NOT_FOUND")) << r.output;
  r = run("events " + dir_);  // a directory without event files
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "no event files")) << r.output;
}

}  // namespace
