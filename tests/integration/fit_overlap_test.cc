// MultiWorkerMirroredStrategy with the gradient all-reduce overlapped with backward
// (MultiWorkerOptions::overlap_gradients), real processes and Gloo on loopback: the final
// variables (model and optimizer) are bitwise those of the all-reduce after backward, for 1, 2
// and 3 workers, the MLP, the CNN and the LM (a one-block GPT), tiny buckets (one per variable)
// and larger ones; a worker
// killed during training makes its peer fail with UNAVAILABLE instead of hanging.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "distribute_process.h"

namespace dtrain::testing {
namespace {

const std::string kWorker = DTRAIN_FIT_WORKER;

std::vector<Process> start(const std::string& dir, const std::string& name, int workers,
                           const std::vector<std::string>& flags) {
  std::vector<int> ports;
  for (int i = 0; i < workers; ++i) ports.push_back(free_port());
  std::vector<Process> procs;
  for (int i = 0; i < workers; ++i) {
    const std::string stem = dir + "/" + name + std::to_string(i);
    std::vector<std::string> argv = {kWorker, "--mode", "multi-worker", "--out", stem + ".bin"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    procs.push_back(spawn(argv, {{"TF_CONFIG", tf_config(ports, i)}}, stem + ".log"));
  }
  return procs;
}

// Runs `workers` processes; returns worker 0's variables after checking that all agree.
std::string train(const std::string& dir, const std::string& name, int workers,
                  const std::vector<std::string>& flags) {
  std::vector<Process> procs = start(dir, name, workers, flags);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  std::vector<std::string> outs;
  for (int i = 0; i < workers; ++i) {
    const int code = wait_for(procs[i], deadline);
    EXPECT_EQ(code, 0) << name << " worker " << i << ":\n" << read_file(procs[i].log);
    outs.push_back(read_file(dir + "/" + name + std::to_string(i) + ".bin"));
  }
  for (int i = 1; i < workers; ++i) EXPECT_EQ(outs[i], outs[0]) << name << ": worker " << i;
  EXPECT_FALSE(outs[0].empty()) << name;
  return outs[0];
}

struct Case {
  int workers;
  std::string arch;
  std::vector<std::string> flags;  // shared by both runs
};

class FitOverlap : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

TEST_P(FitOverlap, FinalVariablesAreBitwiseThoseOfTheAllReduceAfterBackward) {
  const Case& c = GetParam();
  std::vector<std::string> flags = {"--arch", c.arch};
  flags.insert(flags.end(), c.flags.begin(), c.flags.end());
  const std::string replicated = train(dir_, "replicated", c.workers, flags);
  for (const char* bucket : {"64", "3000"}) {  // one bucket per variable; a few variables each
    std::vector<std::string> overlap = flags;
    overlap.insert(overlap.end(), {"--overlap-bucket-bytes", bucket});
    const std::string out = train(dir_, std::string("overlap") + bucket, c.workers, overlap);
    ASSERT_EQ(out.size(), replicated.size());
    EXPECT_TRUE(out == replicated) << c.workers << " workers, " << c.arch << ", bucket " << bucket
                                   << " bytes: the overlapped all-reduce changed the result";
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorkersAndModels, FitOverlap,
    ::testing::Values(Case{1, "mlp", {"--epochs", "1"}}, Case{2, "mlp", {}},
                      // 384 = 2 x 191 + 2: in each epoch's last step the third worker has no
                      // rows (its buckets are reduced as zeros when backward never ran).
                      Case{3, "mlp", {"--batch-size", "191", "--epochs", "3"}}, Case{3, "mlp", {}},
                      Case{2, "cnn", {"--epochs", "1"}}, Case{3, "cnn", {"--epochs", "1"}},
                      Case{2, "lm", {"--epochs", "1"}}, Case{3, "lm", {"--epochs", "1"}}),
    [](const auto& info) {
      return info.param.arch + std::to_string(info.param.workers) + "workers" +
             (info.param.flags.size() > 2 ? "Batch191" : "");
    });

TEST(FitOverlapFailure, KilledPeerDuringBucketedStepsGivesUnavailableNotAHang) {
  const std::string dir = make_temp_dir();
  std::vector<Process> procs = start(dir, "w", 2,
                                     {"--overlap-bucket-bytes", "64", "--epochs", "1000",
                                      "--batch-size", "8", "--step-delay-us", "2000"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  // Once worker 1 has finished a step, both are in the training loop.
  while (read_file(procs[1].log).find("first step done") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(read_file(procs[1].log).find("first step done"), std::string::npos)
      << read_file(procs[1].log) << read_file(procs[0].log);
  ASSERT_EQ(kill(procs[1].pid, SIGKILL), 0);
  EXPECT_EQ(wait_for(procs[1], deadline), 128 + SIGKILL);
  const int code = wait_for(procs[0], deadline);  // -1: it hung and was killed
  const std::string log = read_file(procs[0].log);
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("error: UNAVAILABLE"), std::string::npos) << log;
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dtrain::testing
