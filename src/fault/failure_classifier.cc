// Failure classification (see failure_classifier.h).
#include "fault/failure_classifier.h"

#include <sys/wait.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include "dtrain/core/error.h"

namespace dtrain::fault {

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    return str_cat("exited on signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return str_cat("exited with code ", exit_code_of(status));
}

bool is_collective_exit(int code) { return code == kUnavailableCode || code == kDeadlineCode; }

void order_by_exit_priority(std::vector<Worker*>& reaped) {
  const auto priority = [](const Worker* w) {
    if (w->code == 0) return 3;
    if (is_collective_exit(w->code)) return 2;
    if (WIFSIGNALED(w->status) && WTERMSIG(w->status) != SIGTERM) return 0;
    return 1;
  };
  std::stable_sort(reaped.begin(), reaped.end(),
                   [&](const Worker* a, const Worker* b) { return priority(a) < priority(b); });
}

namespace {
std::string at_step(const Worker& w) {
  return w.step ? str_cat(" at step ", *w.step) : std::string();
}
}  // namespace

Failure exit_failure(const Worker& w, int node, int preemption_exit_code, Clock::time_point now) {
  Failure f;
  f.rank = w.rank;
  f.slot = w.slot;
  f.node = node;
  f.pid = w.pid;
  f.code = w.code;
  if (WIFSIGNALED(w.status)) f.signal = WTERMSIG(w.status);
  f.last_step = w.step;
  f.ours = true;
  f.detected_at = now;
  f.preemption = w.code == preemption_exit_code;
  f.detector = is_collective_exit(w.code) ? kDetectCollective : kDetectExit;
  f.what = str_cat("worker ", w.rank, " ", describe_exit(w.status), at_step(w),
                   f.detector == kDetectCollective ? " (a collective failed)" : "");
  return f;
}

bool is_peer_failure(const Worker& w, int preemption_exit_code) {
  return is_collective_exit(w.code) ||
         (WIFEXITED(w.status) && w.code != preemption_exit_code && w.code != 128 + SIGTERM);
}

std::optional<Failure> detect_hang(const Worker& w, int node, Clock::time_point now,
                                   std::optional<milliseconds> heartbeat_age,
                                   const HangLimits& limits) {
  Failure f;
  f.rank = w.rank;
  f.slot = w.slot;
  f.node = node;
  f.pid = w.pid;
  f.last_step = w.step;
  f.ours = true;
  f.detected_at = now;
  if (limits.watchdog_timeout_s > 0 && w.step &&
      seconds_between(w.step_changed, now) > limits.watchdog_timeout_s) {
    f.detector = kDetectWatchdog;
    f.detection_latency = seconds_between(w.step_changed, now);
    f.what = str_cat("worker ", w.rank, " made no progress for ", fixed(*f.detection_latency), " s",
                     at_step(w), " (watchdog)");
  } else if (heartbeat_age && *heartbeat_age > ms_of(limits.heartbeat_timeout_s)) {
    f.detector = kDetectHeartbeat;
    f.detection_latency = std::chrono::duration<double>(*heartbeat_age).count();
    f.what = str_cat("worker ", w.rank, " sent no heartbeat for ", fixed(*f.detection_latency),
                     " s", at_step(w));
  } else {
    return std::nullopt;
  }
  f.code = 128 + SIGKILL;
  return f;
}

void order_hang_suspects(std::vector<Worker*>& workers, const std::function<bool(pid_t)>& stopped) {
  std::stable_sort(workers.begin(), workers.end(), [&](const Worker* a, const Worker* b) {
    const bool sa = stopped(a->pid), sb = stopped(b->pid);
    if (sa != sb) return sa;
    if (a->step && b->step && *a->step != *b->step) return *a->step < *b->step;
    return a->step_changed < b->step_changed;
  });
}

std::optional<Failure> detect_lost_node(int node, milliseconds age, double heartbeat_timeout_s,
                                        Clock::time_point now, std::optional<int64_t> job_step) {
  if (heartbeat_timeout_s <= 0 || age <= ms_of(heartbeat_timeout_s)) return std::nullopt;
  Failure f;
  f.node = node;
  f.detector = kDetectHeartbeat;
  f.detected_at = now;
  f.last_step = job_step;
  f.detection_latency = std::chrono::duration<double>(age).count();
  f.what = str_cat("node ", node, " sent no heartbeat for ", fixed(*f.detection_latency), " s");
  return f;
}

Failure rejoined_node(int node, Clock::time_point now, std::optional<int64_t> job_step) {
  Failure f;
  f.node = node;
  f.detector = kDetectHeartbeat;
  f.detected_at = now;
  f.last_step = job_step;
  f.what = str_cat("node ", node, "'s launcher started again (it waits to join the next round); ",
                   "its workers of this generation are gone");
  return f;
}

Failure admit_request(const std::string& joining, int running, int max_nodes, Clock::time_point now,
                      std::optional<int64_t> job_step) {
  Failure f;
  f.admit = true;
  f.detector = "";
  f.detected_at = now;
  f.last_step = job_step;
  f.code = 0;
  f.what = str_cat(joining, " is waiting to join (", running, " of at most ", max_nodes,
                   " nodes running)");
  return f;
}

Failure lost_service_failure(int node, const std::string& why, Clock::time_point now,
                             std::optional<int64_t> job_step) {
  Failure f;
  f.lost_service = true;
  f.node = node;
  f.detector = kDetectHeartbeat;
  f.detected_at = now;
  f.last_step = job_step;
  f.code = kUnavailableCode;
  f.what = str_cat("node ", node, " lost the coordination service (", why, ")");
  return f;
}

Failure signal_failure(int node, int sig, Clock::time_point now) {
  Failure f;
  f.code = 128 + sig;
  f.preemption = true;
  f.node = node;
  f.detector = "signal";
  f.what = str_cat("node ", node, " received ", strsignal(sig));
  f.detected_at = now;
  return f;
}

}  // namespace dtrain::fault
