// Runs `build/dtrain launch ARGS` in the background with its output in a file, for the launcher
// tests: wait for text or a pattern in the output, wait for the exit (killing it after a limit).
// Not thread-safe; one test thread drives it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dtrain::testutil {

struct LaunchOutcome {
  int code = -1;       // exit code, 128 + signal, or -1 when it had to be killed
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

class LauncherProcess {
 public:
  using Clock = std::chrono::steady_clock;

  LauncherProcess(const std::vector<std::string>& args, const std::filesystem::path& out)
      : out_(out) {
    std::vector<std::string> argv = {std::string(DTRAIN_BINARY_DIR) + "/dtrain", "launch"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    start_ = Clock::now();
    if (posix_spawn(&pid_, cargv[0], &actions, nullptr, cargv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~LauncherProcess() {
    if (pid_ > 0 && !done_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  LauncherProcess(const LauncherProcess&) = delete;
  LauncherProcess& operator=(const LauncherProcess&) = delete;

  pid_t pid() const { return pid_; }
  std::string output() const {
    std::ifstream in(out_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Waits up to `limit` for the output to contain `text` `count` times.
  bool wait_for_output(const std::string& text, int count, std::chrono::seconds limit) const {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      const std::string s = output();
      int n = 0;
      for (size_t p = s.find(text); p != std::string::npos; p = s.find(text, p + 1)) ++n;
      if (n >= count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // Waits up to `limit` for a line matching `pattern`; returns its match (empty on timeout).
  std::smatch wait_for(const std::string& pattern,
                       std::chrono::seconds limit = std::chrono::seconds(30)) {
    const std::regex re(pattern);
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      text_ = output();
      std::smatch m;
      if (std::regex_search(text_, m, re)) return m;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return {};
  }
  // Waits up to `limit` for the launcher to exit; kills it after that (code -1).
  LaunchOutcome wait(std::chrono::seconds limit = std::chrono::seconds(60)) {
    LaunchOutcome r;
    const auto deadline = Clock::now() + limit;
    int status = 0;
    while (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    done_ = true;
    r.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    if (status != -1) r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.output = output();
    return r;
  }

 private:
  std::filesystem::path out_;
  pid_t pid_ = -1;
  bool done_ = false;
  Clock::time_point start_;
  std::string text_;  // keeps the last output alive for the returned smatch
};

}  // namespace dtrain::testutil
