// Failure classification for the launcher: what a worker's exit, a stalled step, a silent
// heartbeat, a lost node or a joining one means, as a Failure (the record that ends a
// generation), and which of several exits is the likeliest first failure. Private to
// src/fault. Pure functions (process_stopped aside, passed in where needed).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/fault/fault_events.h"
#include "fault/launch_util.h"
#include "fault/worker_group.h"

namespace dtrain::fault {

// Worker exit codes that mean a collective failed because a peer was lost (docs/errors.md).
inline constexpr int kUnavailableCode = 5;  // a lost peer
inline constexpr int kDeadlineCode = 6;     // a timeout

// What ended a generation (or what this node learned about it).
struct Failure {
  std::string detector = kDetectExit;
  int code = 1;  // the exit code the launcher will return if it does not restart
  std::optional<int> rank, node, slot, signal;
  std::optional<int64_t> pid, last_step;
  Clock::time_point detected_at{};
  double detected_unix = 0;  // the same, Unix seconds
  std::optional<double> detection_latency;
  bool ours = false;        // the first failure is one of this node's workers (or this node)
  bool preemption = false;  // no restart
  bool admit = false;       // not a failure: elastic scale-up
  bool exclude = false;     // multi-node: the failed node excludes itself
  bool lost_service = false;
  bool remote = false;  // learned from another node's report (that node recorded it)
  std::string what;     // "worker 1 exited on signal 9 at step 1234"
  std::string stack;    // hang: what it was doing
};

// "how it ended" for messages: "exited with code 7", "exited on signal 9 (Killed)".
std::string describe_exit(int status);

// Whether exit code `code` says a collective failed (UNAVAILABLE, DEADLINE_EXCEEDED).
bool is_collective_exit(int code);

// Orders workers reaped in one pass so the likeliest first failure comes first: killed by a
// signal other than SIGTERM, then other failures, then collective errors (consequences of a
// lost peer), then clean exits. Stable.
void order_by_exit_priority(std::vector<Worker*>& reaped);

// The failure that worker `w` (exited with a non-zero code, on node `node`) is, detected at
// `now`: a preemption when its code is `preemption_exit_code`, a collective failure when it is
// UNAVAILABLE or DEADLINE_EXCEEDED, else an exit.
Failure exit_failure(const Worker& w, int node, int preemption_exit_code, Clock::time_point now);

// Whether worker `w`, exiting with a non-zero code after the generation's first failure, failed
// because of it (a peer failure: a collective error, or an exit code other than preemption's or
// SIGTERM's) rather than being stopped by the launcher.
bool is_peer_failure(const Worker& w, int preemption_exit_code);

struct HangLimits {
  double watchdog_timeout_s = 0;   // step stalled this long: hung (0: off)
  double heartbeat_timeout_s = 0;  // no heartbeat this long: dead (0: never)
};

// Whether running worker `w` on node `node` is hung at `now`: its step did not advance for the
// watchdog timeout, or its heartbeat (`heartbeat_age`, when it sends them) is older than the
// heartbeat timeout. Returns the failure (detector, latency, message; code 128 + SIGKILL since
// the launcher kills it), or nullopt.
std::optional<Failure> detect_hang(const Worker& w, int node, Clock::time_point now,
                                   std::optional<milliseconds> heartbeat_age,
                                   const HangLimits& limits);

// Orders running workers by how likely each is the culprit of a hang (when one hangs the others
// soon stall in a collective too): a stopped process (`stopped(pid)`: SIGSTOP, a debugger),
// then the one furthest behind, then the one that stalled first. Stable.
void order_hang_suspects(std::vector<Worker*>& workers, const std::function<bool(pid_t)>& stopped);

// Node `node` of a multi-node job whose launcher's heartbeat is `age` old: lost when older than
// `heartbeat_timeout_s` (> 0).
std::optional<Failure> detect_lost_node(int node, milliseconds age, double heartbeat_timeout_s,
                                        Clock::time_point now, std::optional<int64_t> job_step);

// Node `node`, a member of the running generation, waits to join the next round: its launcher
// was started again, so the one that ran its workers is gone (a lost node brought back faster
// than its heartbeat timeout).
Failure rejoined_node(int node, Clock::time_point now, std::optional<int64_t> job_step);

// Not a failure: `joining` waits to join an elastic job running `running` of at most
// `max_nodes` nodes; the group re-forms to admit it (code 0).
Failure admit_request(const std::string& joining, int running, int max_nodes, Clock::time_point now,
                      std::optional<int64_t> job_step);

// This node (`node`) lost the coordination service (`why`).
Failure lost_service_failure(int node, const std::string& why, Clock::time_point now,
                             std::optional<int64_t> job_step);

// The launcher of node `node` received signal `sig`: forwarded, no restart (a preemption).
Failure signal_failure(int node, int sig, Clock::time_point now);

}  // namespace dtrain::fault
