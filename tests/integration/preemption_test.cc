// Preemption with real processes and signals: SIGTERM to a training process (or to the
// launcher of a 2-worker job) → the state is backed up at the next step boundary, the process
// exits with 143, and the next start resumes from that backup.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "distribute_process.h"
#include "testutil/idx_files.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
const std::string kDtrain = DTRAIN_BINARY;

// Waits until `path` exists (or the deadline passes).
bool wait_for_file(const fs::path& path, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

class Preemption : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir();
    testutil::write_small_idx(dir_, 512);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<std::string> fit_args(const std::string& extra_flag) {
    std::vector<std::string> a = {kDtrain,
                                  "fit",
                                  "--train-images",
                                  (dir_ / "x.idx").string(),
                                  "--train-labels",
                                  (dir_ / "y.idx").string(),
                                  "--epochs",
                                  "400",
                                  "--batch-size",
                                  "16",
                                  "--verbose",
                                  "2",
                                  "--seed",
                                  "1",
                                  "--checkpoint-dir",
                                  (dir_ / "ckpt").string(),
                                  "--checkpoint-every",
                                  "50"};
    if (!extra_flag.empty()) a.push_back(extra_flag);
    return a;
  }
  fs::path dir_;
};

TEST_F(Preemption, SigtermBacksUpExitsWith143AndTheNextStartResumes) {
  Process p = spawn(fit_args(""), {}, (dir_ / "run1.log").string());
  ASSERT_TRUE(wait_for_file(dir_ / "ckpt" / "checkpoint", std::chrono::seconds(60)))
      << read_file(p.log);
  kill(p.pid, SIGTERM);
  const int code = wait_for(p, std::chrono::steady_clock::now() + std::chrono::seconds(60));
  const std::string log = read_file(p.log);
  EXPECT_EQ(code, 143) << log;
  EXPECT_NE(log.find("preempted (SIGTERM)"), std::string::npos) << log;

  // The next start resumes from the preemption backup; stop it again right away.
  Process q = spawn(fit_args("--resume"), {{"DTRAIN_PREEMPTION_EXIT_CODE", "75"}},
                    (dir_ / "run2.log").string());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_file(q.log).find("resumed from") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(q.pid, SIGTERM);
  EXPECT_EQ(wait_for(q, deadline + std::chrono::seconds(30)), 75) << read_file(q.log);
  EXPECT_NE(read_file(q.log).find("BackupAndRestore: resumed from"), std::string::npos);
}

TEST_F(Preemption, LauncherForwardsSigtermAndTwoWorkersStopTogether) {
  std::vector<std::string> args = {kDtrain, "launch", "--nproc-per-node", "2", "--", kDtrain};
  std::vector<std::string> fit = fit_args("");
  args.insert(args.end(), fit.begin() + 1, fit.end());
  args.push_back("--strategy");
  args.push_back("multi-worker");
  Process p = spawn(args, {}, (dir_ / "launch.log").string());
  ASSERT_TRUE(wait_for_file(dir_ / "ckpt" / "checkpoint", std::chrono::seconds(60)))
      << read_file(p.log);
  kill(p.pid, SIGTERM);
  const int code = wait_for(p, std::chrono::steady_clock::now() + std::chrono::seconds(60));
  const std::string log = read_file(p.log);
  EXPECT_EQ(code, 143) << log;
  // Both workers stopped at the same step (the flag rides in the gradient all-reduce).
  const auto line = [&](const std::string& rank) {
    const size_t at = log.find("[rank " + rank + "] fit: preempted");
    return at == std::string::npos ? std::string()
                                   : log.substr(at + 9, log.find('\n', at) - at - 9);
  };
  EXPECT_FALSE(line("0").empty()) << log;
  EXPECT_EQ(line("0"), line("1")) << log;
}

}  // namespace
}  // namespace dtrain::testing
