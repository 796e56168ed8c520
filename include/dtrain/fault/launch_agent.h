// The launcher agent behind `dtrain launch`: starts this node's worker group, watches it
// (process exits, collective errors, heartbeats, a step-progress watchdog), and on a failure
// records it, stops the group, re-runs the rendezvous under a fresh generation and restarts the
// workers, which resume from their newest backup. Excludes slots (nodes) that keep failing;
// elastic jobs (min_nodes < max_nodes) go on with fewer nodes and admit returning ones.
// docs/launch.md and docs/fault-tolerance.md describe the behaviour for users.
// run_launch_agent() installs signal handlers for its duration and must run on one thread of a
// process that runs nothing else of this kind; the helpers below are pure and thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace dtrain::fault {

struct LaunchOptions {
  int nproc_per_node = 1;  // worker slots on this node
  int min_nodes = 1;       // --nnodes MIN:MAX (or N: both N)
  int max_nodes = 1;
  int node_rank = 0;                 // this node's id, 0 .. max_nodes-1; node 0 hosts the service
  std::string rdzv = "coordinator";  // coordinator | host:port | file:///dir | redis://host:port
  double rdzv_timeout_s = 300;       // wait for the service and for the nodes of a round
  double rdzv_settle_s = 2;          // elastic: close a round this long after the last arrival
  double grace_period_s = 5;         // SIGTERM → SIGKILL when stopping workers
  std::string run_id = "default";    // separates jobs sharing a store
  int max_restarts = 0;              // group restarts after failures; 0: none (exit at once)
  double heartbeat_interval_s = 1;   // workers' heartbeat period (0: none)
  double heartbeat_timeout_s = 10;   // a worker silent this long is dead (0: never)
  double watchdog_timeout_s = 0;     // a worker whose step stalls this long is hung (0: off)
  double stack_timeout_s = 10;       // gdb's time to dump a hung worker's stacks (0: no gdb)
  int exclude_after = 0;             // failures of one slot (node) within the window; 0: never
  double exclude_window_s = 600;     // that window
  int preemption_exit_code = 143;    // a worker's exit code that means preempted: no restart
  std::string event_log = "";        // JSON lines of fault events; empty: none
  std::string logdir = "";           // TensorBoard: events go to <logdir>/launcher; empty: none
  int64_t snapshot_every = 10;       // workers' in-memory snapshots every this many steps, kept
                                     // here and by a ring neighbour; 0: none (--snapshot-every)
  std::string snapshot_root = "";    // where the snapshots' tmpfs directory goes; empty: /dev/shm
  // --snapshot-commit: "journal" (a snapshot is whole once its slot's trailer is; its files are
  // made when needed) or "files" (every snapshot makes its TensorFlow files at once).
  std::string snapshot_commit = "journal";
  // --on-failure: "restart-all" stops and restarts every worker after a failure; "survivors"
  // restarts only the failed workers while the others keep their processes and roll back to the
  // newest in-memory snapshot every rank holds (snapshots, the coordination service).
  std::string on_failure = "restart-all";
  // --spares K: standby workers (data loaded, model built, connected) that take over failed
  // ranks of their node instead of new processes (snapshots, the coordination service).
  int spares = 0;
  // --spare-start: "fork" forks each spare from one fork server that loaded the data and built
  // the model once (train/standby.h; the launcher falls back to exec when the server cannot
  // fork); "exec" starts each spare as a new process.
  std::string spare_start = "fork";
  std::vector<std::string> command;  // the worker's command line (run through PATH)
};

// Runs the job on this node until it completes, fails for good, or the launcher gets a signal.
// Returns the exit code: 0; the failure's code (the worker's exit code, or 128 + signal) when
// restarts are exhausted, the slots run out, or too few nodes remain; the preemption code
// untouched; after a forwarded signal the first non-zero worker code, else 128 + signal.
// Throws InvalidArgumentError for bad options, NotFoundError for a program that does not exist,
// UnavailableError / DeadlineExceededError when the service or the nodes of a round do not
// answer within rdzv_timeout. Blocks for the whole job.
int run_launch_agent(const LaunchOptions& options);

// Checks every option before anything starts (run_launch_agent calls it first): counts, ranges,
// finite timeouts of at most a year, a preemption code in [1, 255], and a worker count that this
// process can supervise (at most 1024, within RLIMIT_NOFILE and RLIMIT_NPROC). Throws
// InvalidArgumentError naming the flag and the limit.
void validate_launch_options(const LaunchOptions& options);

// Failures per slot (or node) within a sliding window, for exclusion (the launcher's policy is
// src/fault/exclusion_policy.h). Not thread-safe.
class FailureHistory {
 public:
  using Clock = std::chrono::steady_clock;
  // `threshold` 0 never excludes.
  FailureHistory(int threshold, std::chrono::milliseconds window)
      : threshold_(threshold), window_(window) {}
  // Records a failure of `id` at `at`; returns true when `id` has now failed `threshold` times
  // within the window ending at `at` (it should be excluded).
  bool record(int id, Clock::time_point at);
  // Failures of `id` within the window ending at `at`.
  int count(int id, Clock::time_point at);

 private:
  int threshold_;
  std::chrono::milliseconds window_;
  std::map<int, std::deque<Clock::time_point>> failures_;
};

// Parses --nnodes: "N" or "MIN:MAX" (1 <= MIN <= MAX). Throws InvalidArgumentError otherwise.
std::pair<int, int> parse_nnodes(const std::string& text);

}  // namespace dtrain::fault
