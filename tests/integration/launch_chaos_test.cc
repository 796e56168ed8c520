// Chaos with the launcher: a 2-worker MultiWorkerMirrored job under `dtrain launch
// --max-restarts` backs up its whole state every few steps; the test kills a random worker with
// SIGKILL at random moments — mid-step, mid-all-reduce, mid-backup, during a restart — 20
// times. The job must finish, and both workers' final weights and optimizer state must be
// bitwise identical to an uninterrupted 2-worker run.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>

#include "distribute_process.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
const std::string kDtrain = DTRAIN_BINARY;
const std::string kWorker = DTRAIN_FIT_WORKER;

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
  std::mt19937 rng(1130);
  std::uniform_int_distribution<int> delay_ms(30, 400);
  int kills = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(200);
  while (kills < 20 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
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
  ASSERT_EQ(code, 0) << log.substr(log.size() > 6000 ? log.size() - 6000 : 0);
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
