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
#include <sstream>
#include <thread>

#include "distribute_process.h"
#include "dtrain/checkpoint/keras_v3.h"
#include "testutil/idx_files.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
namespace ck = dtrain::checkpoint;
const std::string kDtrain = DTRAIN_BINARY;

// Pids of the direct children of `parent`.
std::vector<pid_t> children(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file((e.path() / "stat").string());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != 'Z') out.push_back(std::stoi(name));
  }
  return out;
}

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

std::string tail(const std::string& log) {
  return log.substr(log.size() > 6000 ? log.size() - 6000 : 0);
}

TEST(LaunchResnetChaos, RandomWorkerKillsResumeToTheSameBits) {
  const std::string dir = make_temp_dir();
  testutil::write_small_idx(dir, 128);
  const auto start = std::chrono::steady_clock::now();
  Process ref = spawn(job(dir, dir + "/ref.keras", false), {}, dir + "/ref.log");
  ASSERT_EQ(wait_for(ref, start + std::chrono::seconds(120)), 0) << tail(read_file(ref.log));
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
  ASSERT_TRUE(fs::exists(dir + "/ckpt/checkpoint")) << tail(read_file(dir + "/chaos.log"));
  std::mt19937 rng(1212);
  // Each kill comes 10% to 45% of an uninterrupted run after the previous one.
  std::uniform_real_distribution<double> fraction(0.10, 0.45);
  int kills = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(200);
  while (kills < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(static_cast<int64_t>(fraction(rng) * ref_ms)));
    int status = 0;
    if (waitpid(p.pid, &status, WNOHANG) == p.pid) {
      p.pid = -1;
      break;  // the job finished before all kills: checked below
    }
    const std::vector<pid_t> workers = children(p.pid);
    if (workers.empty()) continue;  // between generations
    const pid_t victim = workers[std::uniform_int_distribution<size_t>(0, workers.size() - 1)(rng)];
    if (kill(victim, SIGKILL) == 0) ++kills;
  }
  const int code =
      p.pid > 0 ? wait_for(p, std::chrono::steady_clock::now() + std::chrono::seconds(180)) : 0;
  const std::string log = read_file(dir + "/chaos.log");
  ASSERT_EQ(code, 0) << tail(log);
  std::printf("%d worker kills\n", kills);
  EXPECT_GE(kills, 1) << "the job finished before any kill";
  EXPECT_NE(log.find("BackupAndRestore: resumed from"), std::string::npos) << tail(log);

  const ck::KerasV3Contents got = ck::read_keras_v3(dir + "/chaos.keras");
  EXPECT_EQ(got.config_json, want.config_json);
  ASSERT_EQ(got.vars.size(), want.vars.size());
  int compared = 0;
  for (size_t i = 0; i < want.vars.size(); ++i) {
    EXPECT_EQ(got.vars[i].path, want.vars[i].path);
    ASSERT_EQ(got.vars[i].values.size(), want.vars[i].values.size()) << want.vars[i].path;
    for (size_t k = 0; k < want.vars[i].values.size(); ++k, ++compared) {
      EXPECT_TRUE(got.vars[i].values[k].equals(want.vars[i].values[k]))
          << want.vars[i].path << "/vars/" << k << " differs after " << kills << " kills";
    }
  }
  // Conv and BN (4 each) and Dense variables, then the optimizer's.
  EXPECT_GT(compared, 40);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dtrain::testing
