// Runs the dtrain binary as a user would and checks exit codes and the one-line errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <zlib.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "testutil/run_dtrain.h"

namespace {

namespace fs = std::filesystem;
using Result = dtrain::testutil::CommandResult;
Result run(const std::string& args) { return dtrain::testutil::run_dtrain(args); }

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dtrain_cli_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a tiny IDX data set: n images of 4x4 uint8 and n labels.
  void write_idx(const std::string& images, const std::string& labels, int n, int label_value) {
    std::ofstream im(dir_ / images, std::ios::binary), lb(dir_ / labels, std::ios::binary);
    const unsigned char ih[] = {0, 0, 8, 3, 0, 0, 0, static_cast<unsigned char>(n),
                                0, 0, 0, 4, 0, 0, 0, 4};
    im.write(reinterpret_cast<const char*>(ih), sizeof ih);
    for (int i = 0; i < n * 16; ++i) im.put(static_cast<char>(i % 251));
    const unsigned char lh[] = {0, 0, 8, 1, 0, 0, 0, static_cast<unsigned char>(n)};
    lb.write(reinterpret_cast<const char*>(lh), sizeof lh);
    for (int i = 0; i < n; ++i) lb.put(static_cast<char>(label_value >= 0 ? label_value : i % 3));
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(CliTest, HelpListsTheCommands) {
  const Result r = run("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* cmd : {"fit", "evaluate", "predict"}) {
    EXPECT_NE(r.output.find(cmd), std::string::npos) << r.output;
  }
  const Result fit = run("fit --help");
  EXPECT_EQ(fit.code, 0);
  EXPECT_NE(fit.output.find("--epochs"), std::string::npos) << fit.output;
}

TEST_F(CliTest, TrainsOnIdxFilesByPath) {
  write_idx("x.idx", "y.idx", 60, -1);
  const Result r = run("fit --train-images " + path("x.idx") + " --train-labels " + path("y.idx") +
                       " --test-images " + path("x.idx") + " --test-labels " + path("y.idx") +
                       " --epochs 2 --batch-size 16 --verbose 2 --seed 1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Epoch 2/2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("test_accuracy"), std::string::npos) << r.output;
}

TEST_F(CliTest, TruncatedIdxIsDataLoss) {
  write_idx("x.idx", "y.idx", 60, -1);
  fs::resize_file(dir_ / "x.idx", 16 + 100);
  const Result r = run("fit --train-images " + path("x.idx") + " --train-labels " + path("y.idx") +
                       " --verbose 0");
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_NE(r.output.find("DATA_LOSS"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("x.idx"), std::string::npos) << r.output;
}

TEST_F(CliTest, WrongMagicIsDataLoss) {
  std::ofstream(dir_ / "bad.idx") << "this is not an idx file at all";
  write_idx("x.idx", "y.idx", 8, -1);
  const Result r = run("fit --train-images " + path("bad.idx") + " --train-labels " +
                       path("y.idx") + " --verbose 0");
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_NE(r.output.find("not an IDX file"), std::string::npos) << r.output;
}

TEST_F(CliTest, MissingFileIsNotFound) {
  const Result r = run("fit --train-images " + path("nope.idx") + " --train-labels " +
                       path("nope2.idx") + " --verbose 0");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("nope.idx"), std::string::npos) << r.output;
}

TEST_F(CliTest, LabelOutOfRangeForTheModel) {
  write_idx("x.idx", "y.idx", 32, 7);
  // A JSON model with 3 output classes cannot learn label 7.
  std::ofstream(dir_ / "m.json") << R"({"class_name": "Sequential", "config": {"layers": [
    {"class_name": "Flatten", "config": {"batch_input_shape": [null, 4, 4]}},
    {"class_name": "Dense", "config": {"units": 3}}]}})";
  const Result r = run("fit --train-images " + path("x.idx") + " --train-labels " + path("y.idx") +
                       " --model " + path("m.json") + " --verbose 0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("label 7"), std::string::npos) << r.output;
}

TEST_F(CliTest, ModelDataShapeMismatch) {
  write_idx("x.idx", "y.idx", 32, -1);
  std::ofstream(dir_ / "m.json") << R"({"class_name": "Sequential", "config": {"layers": [
    {"class_name": "Dense", "config": {"units": 3, "batch_input_shape": [null, 784]}}]}})";
  const Result r = run("fit --train-images " + path("x.idx") + " --train-labels " + path("y.idx") +
                       " --model " + path("m.json") + " --verbose 0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("784"), std::string::npos) << r.output;
}

TEST_F(CliTest, InvalidModelJsonAndUnknownNames) {
  write_idx("x.idx", "y.idx", 32, -1);
  const std::string data =
      " --train-images " + path("x.idx") + " --train-labels " + path("y.idx") + " --verbose 0";
  std::ofstream(dir_ / "broken.json") << R"({"class_name": "Sequential", "config": )";
  Result r = run("fit --model " + path("broken.json") + data);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("invalid JSON"), std::string::npos) << r.output;

  std::ofstream(dir_ / "act.json") << R"({"class_name": "Sequential", "config": {"layers": [
    {"class_name": "Dense", "config": {"units": 3, "activation": "swish2"}}]}})";
  r = run("fit --model " + path("act.json") + data);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown activation 'swish2'"), std::string::npos) << r.output;

  r = run("fit --optimizer adamax" + data);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("adamax"), std::string::npos) << r.output;
}

TEST_F(CliTest, UnknownFlagIsAUsageError) {
  const Result r = run("fit --epochz 3");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("epochz"), std::string::npos) << r.output;
}

}  // namespace

// DTRAIN_STEP_TIMES (train/step_observer.h): a line "<pid> <step> <unix time>" per step, steps in
// order and times not decreasing; more than one block of 64, and the last partial block written
// at exit.
TEST_F(CliTest, StepTimesListEveryStep) {
  write_idx("x.idx", "y.idx", 200, -1);
  const std::string times = path("steps");
  const Result r = dtrain::testutil::run_shell(
      "DTRAIN_STEP_TIMES=" + times + " " + std::string(DTRAIN_BINARY_DIR) + "/dtrain fit" +
      " --train-images " + path("x.idx") + " --train-labels " + path("y.idx") +
      " --epochs 3 --batch-size 8 --verbose 0 --seed 1 2>&1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(times);
  long long pid = 0, step = 0, expect = 1;
  double t = 0, last = 0;
  while (in >> pid >> step >> t) {
    EXPECT_EQ(step, expect++);
    EXPECT_GE(t, last);
    last = t;
  }
  EXPECT_EQ(expect - 1, 3 * 25) << "three epochs of 25 steps";
  EXPECT_GT(last, 1.7e9) << "a Unix time";
}
