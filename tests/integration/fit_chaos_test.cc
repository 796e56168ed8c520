// Chaos: a training process backing up its state (fit(..., save_checkpoints=true)) is killed
// with SIGKILL at random points — mid-step, mid-backup, right after a restart — and started
// again each time. Every run must complete, and the final weights and optimizer state must be
// bitwise identical to an uninterrupted run: exact resumption, and no corrupt or half-written
// backup is ever restored.
#include <gtest/gtest.h>
#include <signal.h>

#include <random>
#include <thread>

#include "distribute_process.h"

namespace dtrain::testing {
namespace {

const std::string kWorker = DTRAIN_FIT_WORKER;

std::vector<std::string> args(const std::string& out, const std::string& ckpt, bool async) {
  std::vector<std::string> a = {kWorker,    "--mode", "single",          "--out", out,
                                "--epochs", "800",    "--step-delay-us", "400"};
  if (!ckpt.empty()) {
    a.insert(a.end(), {"--checkpoint-dir", ckpt, "--checkpoint-every", "7"});
    if (async) a.insert(a.end(), {"--async-checkpoint", "1"});
  }
  return a;
}

// Sync backups, and async ones (pipelined, written by background threads over recycled files).
class FitChaos : public ::testing::TestWithParam<bool> {};

TEST_P(FitChaos, KilledAtRandomPointsResumesToTheSameBits) {
  const bool async = GetParam();
  const std::string dir = make_temp_dir();
  Process ref = spawn(args(dir + "/reference.bin", "", false), {}, dir + "/reference.log");
  ASSERT_EQ(wait_for(ref, std::chrono::steady_clock::now() + std::chrono::seconds(120)), 0)
      << read_file(ref.log);
  const std::string reference = read_file(dir + "/reference.bin");
  ASSERT_FALSE(reference.empty());

  std::mt19937 rng(20261130);
  std::uniform_int_distribution<int> delay_ms(5, 250);
  int kills = 0, runs = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
  for (;;) {
    Process p = spawn(args(dir + "/chaos.bin", dir + "/ckpt", async), {},
                      dir + "/chaos" + std::to_string(runs++) + ".log");
    // Up to 20 kills while time allows (a loaded machine gets fewer); then a run to the end.
    if (kills < 20 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
      if (kill(p.pid, SIGKILL) == 0) {
        const int code = wait_for(p, std::chrono::steady_clock::now() + std::chrono::seconds(30));
        if (code == 128 + SIGKILL) {
          ++kills;
          continue;
        }
        ASSERT_EQ(code, 0) << read_file(p.log);  // it finished before the kill landed
        break;
      }
    }
    const int code = wait_for(p, std::chrono::steady_clock::now() + std::chrono::seconds(120));
    ASSERT_EQ(code, 0) << read_file(p.log);
    break;
  }
  std::printf("%d kills over %d runs\n", kills, runs);
  EXPECT_GE(kills, 1) << "no run was killed: nothing was resumed";
  EXPECT_EQ(read_file(dir + "/chaos.bin"), reference)
      << "resumed training ended with different weights after " << kills << " kills";
  std::system(("rm -rf " + dir).c_str());
}

INSTANTIATE_TEST_SUITE_P(Backups, FitChaos, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Async" : "Sync"; });

}  // namespace
}  // namespace dtrain::testing
