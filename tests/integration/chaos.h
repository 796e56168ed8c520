// Helpers of the tests that kill a launcher's workers: the workers it has running, its event log,
// and a loop that SIGKILLs a random worker at random moments until enough kills have landed or
// the job ends.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "distribute_process.h"

namespace dtrain::testing {

// Pids of the direct children of `parent` that are not zombies, in increasing order. Processes
// that end while /proc is read are skipped.
inline std::vector<pid_t> children(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file((e.path() / "stat").string());  // "" once it has ended
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != 'Z') out.push_back(std::stoi(name));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The launcher's JSON-lines event log (--event-log), and the events of one kind.
inline std::vector<nlohmann::json> events(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

inline std::vector<nlohmann::json> of_kind(const std::vector<nlohmann::json>& all,
                                           const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const auto& e : all) {
    if (e.value("kind", "") == kind) out.push_back(e);
  }
  return out;
}

// A launcher's standby spares from its events: pid -> whether it said it is ready. A spare
// leaves the set when it takes over a rank or dies.
inline std::map<pid_t, bool> standby_spares(const std::vector<nlohmann::json>& all) {
  std::map<pid_t, bool> out;
  for (const auto& e : all) {
    const std::string kind = e.value("kind", "");
    const pid_t pid = e.value("pid", -1);
    if (kind == "spare_started") out[pid] = false;
    if (kind == "spare_ready" && out.count(pid)) out[pid] = true;
    if (kind == "spare_takeover" || kind == "spare_lost") out.erase(pid);
  }
  return out;
}

// A launcher's spares' fork server (dtrain launch --spare-start fork) while it lives, from its
// events: a child of the launcher that is no worker.
inline std::set<pid_t> spare_fork_servers(const std::vector<nlohmann::json>& all) {
  std::set<pid_t> out;
  for (const auto& e : all) {
    if (e.value("kind", "") != "spare_fork_server") continue;
    const std::string state = e.value("state", "");
    if (state == "started") out.insert(e.value("pid", -1));
    if (state == "lost" || state == "refused") out.erase(e.value("pid", -1));
  }
  return out;
}

struct KillLoop {
  int max_kills = 20;
  // The wait before each kill, drawn from the loop's generator.
  std::function<std::chrono::milliseconds(std::mt19937&)> delay;
  std::chrono::seconds limit{200};  // no kill is attempted after this
  uint32_t seed = 1;
};

struct KillResult {
  int kills = 0;
  // The launcher's exit status when it exited during the loop (its exit code, or 128 + signal);
  // -1 while it still runs.
  int exit_code = -1;
};

// SIGKILLs a random worker of the launcher `launcher` after each delay, until `loop.max_kills`
// kills have landed, the limit passes or the launcher exits (then launcher.pid becomes -1 and
// the result holds its exit status). Between generations, when the launcher has no workers, a
// turn passes without a kill.
inline KillResult kill_random_workers(Process& launcher, const KillLoop& loop) {
  std::mt19937 rng(loop.seed);
  KillResult r;
  const auto deadline = std::chrono::steady_clock::now() + loop.limit;
  while (r.kills < loop.max_kills && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(loop.delay(rng));
    int status = 0;
    if (waitpid(launcher.pid, &status, WNOHANG) == launcher.pid) {
      launcher.pid = -1;
      r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    const std::vector<pid_t> workers = children(launcher.pid);
    if (workers.empty()) continue;
    const pid_t victim = workers[std::uniform_int_distribution<size_t>(0, workers.size() - 1)(rng)];
    if (kill(victim, SIGKILL) == 0) ++r.kills;
  }
  return r;
}

// Waits for the launcher after the kill loop: its exit status (-1 if it ran past `limit`).
inline int finish(Process& launcher, const KillResult& r, std::chrono::seconds limit) {
  if (launcher.pid < 0) return r.exit_code;
  return wait_for(launcher, std::chrono::steady_clock::now() + limit);
}

// The last 6000 characters of a log, for failure messages.
inline std::string log_tail(const std::string& log) {
  return log.substr(log.size() > 6000 ? log.size() - 6000 : 0);
}

}  // namespace dtrain::testing
