// One generation of the launcher: the poll loop that forwards the workers' output and the
// launcher's signals, reaps workers, classifies what ended (failure_classifier.h), checks
// progress and heartbeats every monitor period, shares the first failure with the other
// nodes, and stops the group (SIGTERM, then SIGKILL after the grace period). Private to
// src/fault. Single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "dtrain/fault/fault_events.h"
#include "dtrain/fault/launch_agent.h"
#include "fault/exclusion_policy.h"
#include "fault/failure_classifier.h"
#include "fault/launch_events.h"
#include "fault/launch_rendezvous.h"
#include "fault/spares.h"
#include "fault/worker_group.h"
#include "fault/worker_process.h"

namespace dtrain::fault {

// The launcher's parts that outlive a generation.
struct LauncherParts {
  const LaunchOptions& options;
  LaunchRendezvous& rendezvous;
  FaultRecorder& recorder;
  ExclusionPolicy& exclusion;
  RecoveryTracker& recovery;
  SignalRelay& signals;
  Spares* spares = nullptr;  // --spares K: the standby workers, tended from the poll loop
};

// How a generation ended.
// kSurvivors (--on-failure survivors): workers failed, the others still run and wait for the
// next generation (the group was not stopped).
enum class End { kCompleted, kFailure, kSignal, kSurvivors };

struct Outcome {
  End end = End::kCompleted;
  int code = 0;
  std::optional<Failure> failure;
  std::optional<int64_t> job_step;     // newest step any worker reported
  std::optional<double> step_seconds;  // mean step time before the failure, when known
};

class GenerationSupervisor {
 public:
  // Supervises `group`, started for generation `g`.
  GenerationSupervisor(const LauncherParts& parts, const Generation& g, WorkerGroup& group);
  // Runs until every worker here finished (several nodes: every node's), the first failure
  // stopped the group, or a signal did. Returns how it ended.
  Outcome run();

 private:
  bool multi_node() const { return o_.max_nodes > 1; }
  // Whether the loop is over: no worker runs, nothing waits for the other nodes, and the pipes
  // are drained (or a leftover grandchild held one for a second).
  bool over();
  void forward_signals();
  void handle_exits(std::vector<Worker*> reaped);
  // The newest steps the workers sent, for `reaped` (the periodic read may be a period old).
  void refresh_steps(const std::vector<Worker*>& reaped);
  void finish_locally();
  void check_health();
  void monitor();
  void note_progress(const std::map<std::string, std::string>& progress, Clock::time_point now);
  // A hung worker (watchdog, heartbeat): collects its stacks, kills it and fails. Returns true
  // when it found one.
  bool catch_hung_worker(const std::map<std::string, milliseconds>& ages, Clock::time_point now);
  void check_other_nodes(const std::map<std::string, milliseconds>& ages, Clock::time_point now);
  void on_lost_service(const Error& e);
  // The generation's first failure (here, or learned from another node): records and says it,
  // and stops the workers. Later ones are ignored.
  void fail(Failure f);
  // Publishes this node's view of the first failure to the other nodes. Returns true when it
  // is the job's first (this node won); false when another node's came first.
  bool publish(Failure& f);
  void stop_all(int sig);
  // --on-failure survivors: whether failure `f` leaves the other workers running (one node, a
  // worker's own failure, a generation whose every rank connected its collectives).
  bool survivable(const Failure& f);
  // The workers' newest steps, keyed "progress/<gen>/<rank>" for this generation: each worker's
  // from the generation it was started in (survivors keep their first generation's keys).
  std::map<std::string, std::string> progress();
  Outcome outcome() const;

  const LaunchOptions& o_;
  LauncherParts parts_;
  const Generation& g_;
  WorkerGroup& group_;
  std::optional<Failure> failure_;  // what ends this generation
  std::optional<Clock::time_point> kill_at_;
  std::optional<Clock::time_point> drain_until_;
  // Survivors mode: until when workers dying at the same moment join the failure.
  std::optional<Clock::time_point> survivors_until_;
  bool unfenced_ = false;  // a hung worker outlived its SIGKILL: no survivors this time
  Clock::time_point next_monitor_;
  bool locally_done_ = false;  // every worker here exited with 0 (multi-node: wait for the rest)
  bool completed_ = false;
  int received_signal_ = 0;
  std::optional<int64_t> job_step_;  // newest step any worker reported
  std::optional<std::pair<int64_t, Clock::time_point>> first_progress_;  // for the step time
};

}  // namespace dtrain::fault
