// Chaos with the launcher: a 2-worker MultiWorkerMirrored job under `dtrain launch
// --max-restarts` backs up its whole state every few steps; the test kills a random worker with
// SIGKILL at random moments — mid-step, mid-all-reduce, mid-backup, during a restart — 20
// times. The job must finish, and both workers' final weights and optimizer state must be
// bitwise identical to an uninterrupted 2-worker run.
#include <gtest/gtest.h>
#include <signal.h>

#include <random>

#include "chaos.h"

namespace dtrain::testing {
namespace {

const std::string kDtrain = DTRAIN_BINARY;
const std::string kWorker = DTRAIN_FIT_WORKER;

std::vector<std::string> job(const std::string& dir, const std::string& out, bool backups) {
  std::vector<std::string> a = {kDtrain,
                                "launch",
                                "--nproc-per-node",
                                "2",
                                "--max-restarts",
                                "40",
                                "--grace-period",
                                "1",
                                "--event-log",
                                dir + "/events.jsonl",
                                "--",
                                kWorker,
                                "--mode",
                                "multi-worker",
                                "--out",
                                out,
                                "--epochs",
                                "700",
                                "--step-delay-us",
                                "400"};
  if (backups) a.insert(a.end(), {"--checkpoint-dir", dir + "/ckpt", "--checkpoint-every", "5"});
  return a;
}

TEST(LaunchChaos, RandomWorkerKillsResumeToTheSameBits) {
  const std::string dir = make_temp_dir();
  Process ref = spawn(job(dir, dir + "/ref.bin", false), {}, dir + "/ref.log");
  ASSERT_EQ(wait_for(ref, std::chrono::steady_clock::now() + std::chrono::seconds(120)), 0)
      << read_file(ref.log);
  const std::string ref0 = read_file(dir + "/ref.bin.rank0");
  ASSERT_FALSE(ref0.empty());
  ASSERT_EQ(ref0, read_file(dir + "/ref.bin.rank1"));

  Process p = spawn(job(dir, dir + "/chaos.bin", true), {}, dir + "/chaos.log");
  const KillResult r = kill_random_workers(
      p, {.max_kills = 20,
          .delay =
              [](std::mt19937& rng) {
                return std::chrono::milliseconds(std::uniform_int_distribution<int>(30, 400)(rng));
              },
          .seed = 1130});
  const int kills = r.kills;
  const int code = finish(p, r, std::chrono::seconds(180));
  const std::string log = read_file(dir + "/chaos.log");
  ASSERT_EQ(code, 0) << log_tail(log);
  // Up to 20 kills; how many land before the job ends depends on the machine's speed.
  std::printf("%d worker kills\n", kills);
  EXPECT_GE(kills, 1) << "the job finished before any kill";
  EXPECT_EQ(read_file(dir + "/chaos.bin.rank0"), ref0)
      << "worker 0 differs after " << kills << " kills";
  EXPECT_EQ(read_file(dir + "/chaos.bin.rank1"), ref0)
      << "worker 1 differs after " << kills << " kills";
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dtrain::testing
