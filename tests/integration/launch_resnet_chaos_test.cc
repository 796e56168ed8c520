// Chaos with the launcher and the built-in residual CNN: `dtrain launch --nproc-per-node 2 --
// dtrain fit --arch resnet --strategy multi-worker` (a Functional model whose BatchNormalization
// layers are synchronized over the two workers) backs up its whole state every few steps; the
// test kills a random worker with SIGKILL at random moments of the run, the first after the
// first backup (the kill times are drawn as fractions of an uninterrupted run's length, so that
// they land on any machine). The job must
// finish, and the .keras file the chief saves — weights, moving statistics and optimizer
// variables — must be bitwise equal to the uninterrupted run's.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "chaos.h"
#include "keras_compare.h"
#include "testutil/idx_files.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
namespace ck = dtrain::checkpoint;
const std::string kDtrain = DTRAIN_BINARY;

// 128 4×4 images, global batch 16: 8 steps an epoch, 200 steps in all.
std::vector<std::string> job(const std::string& dir, const std::string& save, bool backups) {
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
                                kDtrain,
                                "fit",
                                "--arch",
                                "resnet",
                                "--strategy",
                                "multi-worker",
                                "--train-images",
                                dir + "/x.idx",
                                "--train-labels",
                                dir + "/y.idx",
                                "--epochs",
                                "25",
                                "--batch-size",
                                "16",
                                "--seed",
                                "1",
                                "--verbose",
                                "0",
                                "--save",
                                save};
  if (backups) {
    a.insert(a.end(), {"--checkpoint-dir", dir + "/ckpt", "--checkpoint-every", "5", "--resume"});
  }
  return a;
}

TEST(LaunchResnetChaos, RandomWorkerKillsResumeToTheSameBits) {
  const std::string dir = make_temp_dir();
  testutil::write_small_idx(dir, 128);
  const auto start = std::chrono::steady_clock::now();
  Process ref = spawn(job(dir, dir + "/ref.keras", false), {}, dir + "/ref.log");
  ASSERT_EQ(wait_for(ref, start + std::chrono::seconds(120)), 0) << log_tail(read_file(ref.log));
  const double ref_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const ck::KerasV3Contents want = ck::read_keras_v3(dir + "/ref.keras");
  ASSERT_FALSE(want.vars.empty());

  Process p = spawn(job(dir, dir + "/chaos.keras", true), {}, dir + "/chaos.log");
  // The first kill comes after the first backup, so that a restart must resume from one.
  const auto first_backup = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(dir + "/ckpt/checkpoint") && std::chrono::steady_clock::now() < first_backup) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(fs::exists(dir + "/ckpt/checkpoint")) << log_tail(read_file(dir + "/chaos.log"));
  // Each kill comes 10% to 45% of an uninterrupted run after the previous one.
  const KillResult r = kill_random_workers(
      p, {.max_kills = 3,
          .delay =
              [ref_ms](std::mt19937& rng) {
                return std::chrono::milliseconds(static_cast<int64_t>(
                    std::uniform_real_distribution<double>(0.10, 0.45)(rng) * ref_ms));
              },
          .seed = 1212});
  const int kills = r.kills;
  const int code = finish(p, r, std::chrono::seconds(180));
  const std::string log = read_file(dir + "/chaos.log");
  ASSERT_EQ(code, 0) << log_tail(log);
  std::printf("%d worker kills\n", kills);
  EXPECT_GE(kills, 1) << "the job finished before any kill";
  EXPECT_NE(log.find("BackupAndRestore: resumed from"), std::string::npos) << log_tail(log);

  const ck::KerasV3Contents got = ck::read_keras_v3(dir + "/chaos.keras");
  const int compared = expect_same_keras(got, want, "after " + std::to_string(kills) + " kills");
  // Conv and BN (4 each) and Dense variables, then the optimizer's.
  EXPECT_GT(compared, 40);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dtrain::testing
