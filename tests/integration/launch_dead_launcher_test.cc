// Workers die with their launcher: after `kill -9` of `dtrain launch` (the fault-tolerant agent,
// or a --ps job's launcher) no worker, chief or `dtrain ps` it started is left running as an
// orphan (issue 11). Real processes, real signals; every wait is bounded and a process that
// survives is killed by the test.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testutil/launcher_process.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Launcher = dtrain::testutil::LauncherProcess;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// State and parent of `pid` from /proc/<pid>/stat; state 0 when there is no such process.
std::pair<char, pid_t> stat_of(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return {0, 0};
  std::istringstream rest(stat.substr(close + 2));
  char state = 0;
  pid_t ppid = 0;
  rest >> state >> ppid;
  return {state, ppid};
}

// Alive: it exists and is not a zombie (a dead orphan waits for its new parent to reap it).
bool alive(pid_t pid) {
  const char state = stat_of(pid).first;
  return state != 0 && state != 'Z' && state != 'X';
}

// The direct children of `parent`.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    if (stat_of(pid).second == parent) out.push_back(pid);
  }
  return out;
}

class LaunchDeadLauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dtrain_dead_launcher_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "work");
  }
  void TearDown() override {
    for (pid_t pid : survivors_) kill(pid, SIGKILL);  // never leave them running
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Waits up to `limit` for `n` children of `l` that have started their program (not a
  // launcher still between fork and exec); returns them.
  static std::vector<pid_t> wait_for_children(const Launcher& l, size_t n,
                                              std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    std::vector<pid_t> kids;
    while (Clock::now() < deadline) {
      kids = children_of(l.pid());
      if (kids.size() >= n) break;
      std::this_thread::sleep_for(20ms);
    }
    return kids;
  }

  // SIGKILLs the launcher, then waits (up to 5 s) for every one of `pids` to be gone. Returns
  // those still alive then (remembered, and killed at the end of the test); prints how long
  // they took.
  std::vector<pid_t> kill_launcher_and_wait(Launcher& l, const std::vector<pid_t>& pids) {
    kill(l.pid(), SIGKILL);
    const auto killed = Clock::now();
    l.wait(10s);
    std::vector<pid_t> left = pids;
    while (!left.empty() && Clock::now() - killed < 5s) {
      left.erase(std::remove_if(left.begin(), left.end(), [](pid_t p) { return !alive(p); }),
                 left.end());
      if (!left.empty()) std::this_thread::sleep_for(5ms);
    }
    const double took = std::chrono::duration<double>(Clock::now() - killed).count();
    std::cout << "[ measured ] " << pids.size() - left.size() << " of " << pids.size()
              << " processes gone " << took << " s after SIGKILL of the launcher\n";
    survivors_.insert(survivors_.end(), left.begin(), left.end());
    return left;
  }

  // What a job that did not get going shows: the launcher's output, each worker's log, and the
  // state and wait channel of each of the launcher's children.
  std::string diagnosis(const Launcher& l) const {
    std::ostringstream out;
    out << "launcher output:\n" << l.output();
    for (int rank = 0; rank < 3; ++rank) {
      out << "worker" << rank << ".log:\n"
          << read_file(dir_ / ("worker" + std::to_string(rank) + ".log")) << "\n";
    }
    for (const pid_t child : children_of(l.pid())) {
      const fs::path proc = fs::path("/proc") / std::to_string(child);
      std::string cmdline = read_file(proc / "cmdline");
      std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
      out << "child " << child << ": " << cmdline.substr(0, 120)
          << " stat: " << read_file(proc / "stat").substr(0, 60)
          << " wchan: " << read_file(proc / "wchan") << "\n";
    }
    return out.str();
  }

  fs::path dir_;
  std::vector<pid_t> survivors_;
};

TEST_F(LaunchDeadLauncherTest, WorkersDieWithAKilledLauncher) {
  // Workers that would train for minutes and send no heartbeats, with their output in files (a
  // pipe to the dead launcher would end them with SIGPIPE at their next line, e.g. the warning
  // that progress cannot be reported): nothing but the launcher's death can stop them.
  Launcher l(
      {"--nproc-per-node", "3", "--heartbeat-interval", "0", "--heartbeat-timeout", "0", "--", "sh",
       "-c", "exec \"$0\" \"$@\" > '" + dir_.string() + "'/worker$DTRAIN_RANK.log 2>&1",
       DTRAIN_LAUNCH_WORKER, "--dir", (dir_ / "work").string(), "--steps", "100000", "--step-ms",
       "20"},
      dir_ / "out");
  const auto deadline = Clock::now() + 60s;
  // Each worker has taken steps: it prints "at step S" every 5 steps, from the step it resumed
  // at (rank 0 checkpoints the step every 10 into the shared --dir, so a worker that starts late
  // on a loaded machine begins at 10 or 20, never printing step 5).
  for (int rank = 0; rank < 3; ++rank) {
    const fs::path log = dir_ / ("worker" + std::to_string(rank) + ".log");
    while (read_file(log).find("at step ") == std::string::npos && Clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);
    }
    ASSERT_NE(read_file(log).find("at step "), std::string::npos) << diagnosis(l);
  }
  const std::vector<pid_t> workers = wait_for_children(l, 3, 10s);
  ASSERT_EQ(workers.size(), 3u) << l.output();
  const std::vector<pid_t> left = kill_launcher_and_wait(l, workers);
  EXPECT_TRUE(left.empty()) << left.size() << " worker(s) outlived the launcher by 5 s\n"
                            << read_file(dir_ / "out");
}

TEST_F(LaunchDeadLauncherTest, ParameterServerJobDiesWithAKilledLauncher) {
  // A server (`dtrain ps`, which runs until SIGTERM), a worker and the chief (each would sleep
  // for a minute).
  Launcher l({"--ps", "1", "--workers", "1", "--", "sh", "-c", "echo up; exec sleep 60"},
             dir_ / "out");
  ASSERT_TRUE(l.wait_for_output("dtrain ps: serving on", 1, 60s)) << l.output();
  ASSERT_TRUE(l.wait_for_output("] up", 2, 60s)) << l.output();
  const std::vector<pid_t> tasks = wait_for_children(l, 3, 10s);
  ASSERT_EQ(tasks.size(), 3u) << l.output();
  const std::vector<pid_t> left = kill_launcher_and_wait(l, tasks);
  EXPECT_TRUE(left.empty()) << left.size() << " task(s) outlived the launcher by 5 s\n"
                            << read_file(dir_ / "out");
}

}  // namespace
