// Absurd flags, lying headers and endless files against the real dtrain binary: each fails fast
// with a clear error naming what is wrong and the right exit code, never a hang or a crash.
// Every command runs under `timeout`, so a hang shows as exit code 124 instead of a stuck test.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "testutil/run_dtrain.h"

namespace {

namespace fs = std::filesystem;
using dtrain::testutil::CommandResult;
using dtrain::testutil::contains;

// Runs `dtrain ARGS` (stdout and stderr together) in a shell that first runs `limits` (ulimit
// commands), killed after a generous 60 s: a run that hangs exits 124 instead of blocking.
CommandResult run(const std::string& args, const std::string& limits = "") {
  const std::string cmd = limits + " exec timeout -k 5 60 " + std::string(DTRAIN_BINARY_DIR) +
                          "/dtrain " + args + " 2>&1";
  return dtrain::testutil::run_shell(cmd);
}

class HostileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dtrain_hostile_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    // A small valid CSV: two features and a label in {0, 1, 2}.
    std::ofstream csv(dir_ / "ok.csv");
    for (int i = 0; i < 24; ++i) csv << i * 0.1 << "," << i * 0.2 << "," << i % 3 << "\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string fit_csv(const std::string& extra) const {
    return "fit --train-csv " + path("ok.csv") + " --epochs 1 --verbose 0 " + extra;
  }
  // Writes an IDX file: magic 00 00 <type> <rank>, big-endian dims, then `payload`.
  void write_idx(const std::string& name, uint8_t type, const std::vector<uint32_t>& dims,
                 const std::string& payload) const {
    std::string bytes = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
    for (uint32_t d : dims) {
      for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<char>((d >> s) & 0xff));
    }
    bytes += payload;
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  void write_images(int n) const {
    write_idx("x.idx", 0x08, {uint32_t(n), 2, 2}, std::string(4 * n, '\x07'));
  }

  fs::path dir_;
};

// Expects a usage error: exit 2, the flag and its value named in the message.
void expect_usage_error(const CommandResult& r, const std::string& flag, const std::string& value) {
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, flag)) << r.output;
  EXPECT_TRUE(contains(r.output, value)) << r.output;
  EXPECT_FALSE(contains(r.output, "trained")) << r.output;
}

TEST_F(HostileInputTest, NonsensicalFlagValuesAreUsageErrorsNamingFlagAndValue) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--steps-per-epoch", "-3"},
      {"--threads", "-2"},
      {"--replicas", "0"},
      {"--verify-sync", "-1"},
      {"--seed", "-1"},
      {"--learning-rate", "nan"},
      {"--learning-rate", "inf"},
      {"--learning-rate", "-0.1"},
      {"--label-column", "-50"},
      {"--epochs", "0"},
      {"--epochs", "-1"},
      {"--batch-size", "0"},
      {"--batch-size", "-32"},
      {"--batch-size", "2000000000"},
      {"--checkpoint-every", "0"},
      {"--checkpoint-every", "-5"},
      {"--verbose", "7"},
      {"--hidden", "0"},
  };
  for (const auto& [flag, value] : cases) {
    SCOPED_TRACE(flag + " " + value);
    expect_usage_error(run(fit_csv(flag + " " + value)), flag, value);
  }
}

TEST_F(HostileInputTest, InRangeEdgeValuesAreStillAccepted) {
  const CommandResult r =
      run(fit_csv("--seed 18446744073709551615 --verify-sync 0 --threads 1 "
                  "--label-column 2 --learning-rate 0.01 --batch-size 1"));
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST_F(HostileInputTest, AbsurdThreadCountsFailFastWithoutTouchingOpenBlas) {
  expect_usage_error(run(fit_csv("--threads 100000")), "--threads", "100000");
  const CommandResult r = run(fit_csv("--threads 100000"));
  EXPECT_TRUE(contains(r.output, "at most")) << r.output;
}

TEST_F(HostileInputTest, AbsurdReplicaCountsAreRefusedBeforeAnyThreadStarts) {
  // Under a 4 GB address-space limit, as a shared machine or a container has.
  const CommandResult r = run(fit_csv("--strategy mirrored --replicas 5000"), "ulimit -v 4000000;");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "INVALID_ARGUMENT")) << r.output;
  EXPECT_TRUE(contains(r.output, "5000 replicas")) << r.output;
  EXPECT_TRUE(contains(r.output, "at most")) << r.output;
}

TEST_F(HostileInputTest, ReplicasWithAStrategyThatHasNoReplicaThreadsAreRefused) {
  const CommandResult r = run(fit_csv("--replicas 4"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--replicas 4 applies to --strategy mirrored")) << r.output;
  EXPECT_TRUE(contains(r.output, "'one'")) << r.output;
}

TEST_F(HostileInputTest, LogicalReplicaCountsThatDoNotFitAreRefused) {
  expect_usage_error(run(fit_csv("--strategy multi-worker --logical-replicas 0")),
                     "--logical-replicas", "0");
  CommandResult r = run(fit_csv("--logical-replicas 2"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--logical-replicas applies to --strategy multi-worker"))
      << r.output;
  r = run(fit_csv("--strategy multi-worker --logical-replicas 5 --batch-size 12"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "batch_size 12 does not split into 5 logical replicas"))
      << r.output;
  r = run(fit_csv("--strategy multi-worker --logical-replicas 2 --replicas 2"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "excludes local_replicas")) << r.output;
  // A good count trains (one worker holds all 3 logical replicas).
  r = run(fit_csv("--strategy multi-worker --logical-replicas 3 --batch-size 6"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "3 replicas in sync (1 workers x 3 local)")) << r.output;
}

TEST_F(HostileInputTest, AReplicaThreadThatCannotStartIsResourceExhaustedNotADeadlock) {
  // 1 GB stacks (glibc sizes thread stacks by RLIMIT_STACK) in a 6 GB address space: the replica
  // threads stop starting after a few, within the replica cap. The threads already started are
  // joined and the error is one line, exit 1 (it deadlocked while unwinding before).
  const CommandResult r =
      run(fit_csv("--strategy mirrored --replicas 20"), "ulimit -s 1000000; ulimit -v 6000000;");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "RESOURCE_EXHAUSTED")) << r.output;
  EXPECT_TRUE(contains(r.output, "cannot start the thread of replica")) << r.output;
}

TEST_F(HostileInputTest, EventsOfAnEndlessDeviceIsDataLossAtOffsetZero) {
  for (const char* flags : {"", "--skip-corrupt "}) {
    SCOPED_TRACE(flags);
    const CommandResult r = run(std::string("events ") + flags + "/dev/zero");
    EXPECT_EQ(r.code, 4) << r.output;
    EXPECT_TRUE(contains(r.output, "DATA_LOSS: /dev/zero: record at offset 0")) << r.output;
  }
}

TEST_F(HostileInputTest, IdxAndCsvFlagsTogetherAreAUsageErrorNamingBoth) {
  write_images(6);
  write_idx("y.idx", 0x08, {6}, std::string(6, '\x01'));
  const CommandResult r =
      run(fit_csv("--train-images " + path("x.idx") + " --train-labels " + path("y.idx")));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--train-csv")) << r.output;
  EXPECT_TRUE(contains(r.output, "--train-images")) << r.output;
  EXPECT_TRUE(contains(r.output, "excludes")) << r.output;
  // Labels without their images would be ignored: refused too.
  const CommandResult lonely = run("fit --train-labels " + path("y.idx") + " --verbose 0");
  EXPECT_EQ(lonely.code, 2) << lonely.output;
  EXPECT_TRUE(contains(lonely.output, "--train-labels requires --train-images")) << lonely.output;
}

TEST_F(HostileInputTest, BadSavePathsAreRefusedBeforeTraining) {
  fs::create_directories(dir_ / "adir");
  struct Case {
    std::string save;
    int code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {path("missing/model.h5"), 3, "does not exist"},
      {path("adir"), 2, "is a directory"},
      {path("model"), 2, "extension"},
      {path("model.txt"), 2, "extension"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.save);
    const CommandResult r = run(fit_csv("--save " + c.save));
    EXPECT_EQ(r.code, c.code) << r.output;
    EXPECT_TRUE(contains(r.output, "--save " + c.save)) << r.output;
    EXPECT_TRUE(contains(r.output, c.says)) << r.output;
    EXPECT_FALSE(contains(r.output, "trained")) << r.output;  // refused before, not after
  }
  const CommandResult ok = run(fit_csv("--save " + path("adir/model.h5")));
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_TRUE(fs::exists(dir_ / "adir" / "model.h5"));
}

TEST_F(HostileInputTest, NonIntegerCsvLabelsNameTheFileAndRow) {
  for (const char* bad : {"2.5", "nan", "-1", "inf"}) {
    SCOPED_TRACE(bad);
    std::ofstream csv(dir_ / "bad.csv");
    for (int i = 0; i < 6; ++i) csv << i << "," << i << "," << (i == 3 ? bad : "1") << "\n";
    csv.close();
    const CommandResult r = run("fit --train-csv " + path("bad.csv") + " --epochs 1 --verbose 0");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, path("bad.csv"))) << r.output;
    EXPECT_TRUE(contains(r.output, "row 4: label " + std::string(bad))) << r.output;
    EXPECT_FALSE(contains(r.output, "-9223372036854775808")) << r.output;
  }
}

TEST_F(HostileInputTest, AHugeCsvLabelIsNotUsedAsAClassCount) {
  std::ofstream csv(dir_ / "huge.csv");
  for (int i = 0; i < 6; ++i) csv << i << "," << i << "," << (i == 2 ? "3000000000" : "1") << "\n";
  csv.close();
  const CommandResult r = run("fit --train-csv " + path("huge.csv") + " --epochs 1 --verbose 0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, path("huge.csv"))) << r.output;
  EXPECT_TRUE(contains(r.output, "row 3: label 3000000000")) << r.output;
  EXPECT_TRUE(contains(r.output, "classes")) << r.output;
}

TEST_F(HostileInputTest, FloatIdxLabelsThatAreNotIntegersNameTheFileAndRow) {
  write_images(4);
  // float32 big-endian: 1.0, 0.0, 2.5, 1.0
  const std::string payload("\x3f\x80\x00\x00\x00\x00\x00\x00\x40\x20\x00\x00\x3f\x80\x00\x00", 16);
  write_idx("y.idx", 0x0D, {4}, payload);
  const CommandResult r = run("fit --train-images " + path("x.idx") + " --train-labels " +
                              path("y.idx") + " --epochs 1 --verbose 0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, path("y.idx") + ": row 3: label 2.5")) << r.output;
}

TEST_F(HostileInputTest, RankZeroIdxIsDataLossNamingTheFile) {
  write_idx("scalar.idx", 0x08, {}, "\x05");
  write_idx("y.idx", 0x08, {1}, "\x01");
  const CommandResult r = run("fit --train-images " + path("scalar.idx") + " --train-labels " +
                              path("y.idx") + " --verbose 0");
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_TRUE(contains(r.output, "DATA_LOSS")) << r.output;
  EXPECT_TRUE(contains(r.output, path("scalar.idx"))) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0")) << r.output;
}

TEST_F(HostileInputTest, AnIdxHeaderClaimingABillionImagesIsDataLossBeforeAllocating) {
  // 10^9 images of 28x28 (784 GB), or 10^9 labels, in a 100-byte payload: refused naming the
  // file and the header's dimensions. Under a 4 GB address-space limit an attempt to allocate
  // would be RESOURCE_EXHAUSTED instead.
  write_images(10);
  write_idx("y.idx", 0x08, {10}, std::string(10, '\x01'));
  write_idx("x_big.idx", 0x08, {1000000000, 28, 28}, std::string(100, '\0'));
  write_idx("y_big.idx", 0x08, {1000000000}, std::string(100, '\0'));
  for (const auto& [images, labels, bad] : {std::tuple{"x_big.idx", "y.idx", "x_big.idx"},
                                            std::tuple{"x.idx", "y_big.idx", "y_big.idx"}}) {
    SCOPED_TRACE(bad);
    const CommandResult r = run(
        "fit --train-images " + path(images) + " --train-labels " + path(labels) + " --verbose 0",
        "ulimit -v 4000000;");
    EXPECT_EQ(r.code, 4) << r.output;
    EXPECT_TRUE(contains(r.output, "DATA_LOSS: read_idx: " + path(bad))) << r.output;
    EXPECT_TRUE(contains(r.output, "[1000000000")) << r.output;
    EXPECT_TRUE(contains(r.output, "(the header's dimensions), got 100 after")) << r.output;
  }
}

}  // namespace
