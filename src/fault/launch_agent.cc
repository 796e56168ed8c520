// The launcher agent (see launch_agent.h): for each generation it joins the membership round
// (launch_rendezvous.h), starts this node's worker group (worker_group.h), supervises it
// (generation_supervisor.h) and decides what follows the generation's end: done, give up,
// exclude a slot or this node (exclusion_policy.h), or restart. Single-threaded; the
// coordination server and clients run their own threads.
#include "dtrain/fault/launch_agent.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "dtrain/core/error.h"
#include "dtrain/distribute/launcher_env.h"
#include "dtrain/fault/fault_events.h"
#include "dtrain/fault/progress_reporter.h"
#include "dtrain/train/standby.h"
#include "fault/exclusion_policy.h"
#include "fault/generation_supervisor.h"
#include "fault/launch_events.h"
#include "fault/launch_rendezvous.h"
#include "fault/snapshots.h"
#include "fault/spares.h"
#include "fault/worker_group.h"
#include "fault/worker_process.h"

namespace dtrain::fault {
namespace {

namespace dist = dtrain::distribute;

// --on-failure, for the workers (train/memory_snapshots.h reads it).
constexpr const char* kEnvOnFailure = "DTRAIN_ON_FAILURE";
// For a newcomer of a survivors recovery: the survivor that broadcasts the snapshot to it
// (train/memory_snapshots.h).
constexpr const char* kEnvBroadcastRoot = "DTRAIN_SNAPSHOT_BROADCAST_ROOT";
// "0" in the launcher's environment: newcomers restore from the launcher's memory instead (a
// diagnostic switch; the tests check that the broadcast is what they observe).
constexpr const char* kEnvStateBroadcast = "DTRAIN_LAUNCH_STATE_BROADCAST";

bool state_broadcast_enabled() {
  const char* v = std::getenv(kEnvStateBroadcast);
  return v == nullptr || std::string(v) != "0";
}
// Where a survivor of generation `failed` learns the next one (train/memory_snapshots.h:
// survivor_announcement_key).
std::string announcement_key(const std::string& run_id, int64_t failed, int rank) {
  return str_cat("dtrain/", run_id, "/launch/g", failed, "/next/", rank);
}

class Agent {
 public:
  explicit Agent(const LaunchOptions& o);
  int run();

 private:
  bool multi_node() const { return o_.max_nodes > 1; }
  // The next generation, or nullopt when the job cannot go on (too few nodes left).
  std::optional<Generation> next_generation(const std::optional<Generation>& previous);
  void announce(const Generation& g, bool restart, bool survivors);
  // --on-failure survivors, after generation `failed` ended with workers still running: tells
  // each survivor the generation `g` to join and the snapshot to roll back to, and starts the
  // failed workers again in `group`. False when they cannot continue (no snapshot that every rank
  // holds, the service failed): the caller restarts every worker.
  bool continue_survivors(const Generation& failed, const Generation& g, WorkerGroup& group,
                          std::optional<int> root);
  // --on-failure survivors: the rank that broadcasts the agreed snapshot to generation `g`'s
  // newcomers — the lowest surviving rank of every node's `alive` (this node's survivors), when
  // some rank of `g` is not a survivor — or nullopt (no survivors, no newcomers, or the
  // broadcast switched off). The same answer on every node: each publishes its survivors on the
  // coordination service and reads the others'. Throws UnavailableError when a member's answer
  // does not come within the rendezvous timeout.
  std::optional<int> agree_state_root(const Generation& g, const std::vector<int>& alive);
  // Whether this node's survivors can go on: some still run, and each rank of theirs has the
  // agreed snapshot to roll back to (the same agreement on every node).
  bool survivors_can_continue(const WorkerGroup& group) const;
  std::vector<std::string> worker_environment(const Generation& g, const Worker& w) const;
  // What the launcher sets for worker `w` of `g` ("NAME=value"), over its own environment
  // without kWorkerDrop.
  std::vector<std::string> worker_variables(const Generation& g, const Worker& w) const;
  // --spares: starts the standby spares once the first generation runs.
  void start_spares(const Generation& g, const Worker& w);
  // A ready spare's process for worker `w` of `g`, when one stands by.
  std::optional<Process> take_spare(const Generation& g, const Worker& w);
  int completed(const Generation& g, const Outcome& out);
  // Whether the job ends after failure `f` instead of restarting: preempted, no restarts left,
  // every slot excluded, or this node excluded. Returns the exit code then.
  std::optional<int> ends_the_job(const Generation& g, const Failure& f);
  // The end of this node's part of the job, with exit code `code` (several nodes: tells the
  // others). Returns `code`.
  int finish(const Generation& g, int code);

  LaunchOptions o_;
  FaultRecorder recorder_;
  LaunchRendezvous rendezvous_;
  SignalRelay signals_;
  ExclusionPolicy exclusion_;
  RecoveryTracker recovery_;
  std::unique_ptr<SnapshotKeeper> snapshots_;  // --snapshot-every > 0 with a coordination service
  std::unique_ptr<Spares> spares_;             // --spares K > 0
  int taken_by_spares_ = 0;                    // ranks of the recovery in progress taken by spares
  std::optional<int> state_root_;  // while continue_survivors() starts newcomers: their root
};

// The launcher's variables that a worker's environment replaces (or leaves out).
const std::vector<std::string> kWorkerDrop = {
    dist::kEnvMasterAddr,      dist::kEnvMasterPort,     "DTRAIN_SNAPSHOT_DIR",
    "DTRAIN_SNAPSHOT_RESTORE", "DTRAIN_SNAPSHOT_SOURCE", "DTRAIN_SNAPSHOT_EVERY",
    "DTRAIN_SNAPSHOT_COMMIT",  kEnvBroadcastRoot,        kEnvOnFailure};

Agent::Agent(const LaunchOptions& o)
    : o_(o),
      recorder_(FaultRecorderOptions{
          .event_log = o_.event_log,
          .logdir = o_.logdir.empty() ? std::string() : o_.logdir + "/launcher"}),
      rendezvous_(o_),
      exclusion_(o_.nproc_per_node, multi_node(), o_.exclude_after, o_.exclude_window_s),
      recovery_(recorder_) {
  if (o_.snapshot_every > 0 && rendezvous_.connected()) {
    snapshots_ = std::make_unique<SnapshotKeeper>(
        SnapshotKeeperOptions{.every = o_.snapshot_every,
                              .root = o_.snapshot_root,
                              .run_id = o_.run_id,
                              .node = o_.node_rank,
                              .host = snapshot_agent_host(rendezvous_.service()),
                              .journal = o_.snapshot_commit == "journal"});
  }
}

int Agent::run() {
  const LauncherParts parts{.options = o_,
                            .rendezvous = rendezvous_,
                            .recorder = recorder_,
                            .exclusion = exclusion_,
                            .recovery = recovery_,
                            .signals = signals_,
                            .spares = nullptr};
  std::optional<Generation> previous;
  WorkerGroup group;
  bool survivors = false;  // the last generation ended with workers still running in `group`
  while (true) {
    const std::optional<Generation> g = next_generation(previous);
    if (!g) {
      if (survivors) group.stop(ms_of(o_.grace_period_s));
      return recovery_.pending_failure_code().value_or(1);
    }
    if (survivors && (g->slots != previous->slots || g->world_size != previous->world_size ||
                      g->rank_offset != previous->rank_offset)) {
      say("survivors: the group changed (", previous->world_size, " -> ", g->world_size,
          " workers); restarting every worker");
      group.stop(ms_of(o_.grace_period_s));
      survivors = false;
    }
    announce(*g, previous.has_value(), survivors);
    if (snapshots_) snapshots_->prepare(*g, rendezvous_.client(), recorder_, previous.has_value());
    if (survivors && !survivors_can_continue(group)) {
      group.stop(ms_of(o_.grace_period_s));
      survivors = false;
    }
    // Who sends the agreed snapshot to the newcomers: agreed over every node, since a node may
    // restart all its workers while another node's survivors go on (every member of the
    // generation must take part in the broadcast, or none).
    std::optional<int> root;
    if (o_.on_failure == "survivors") {
      std::vector<int> alive;
      for (const auto& w : group.workers()) {
        if (survivors && w.running) alive.push_back(w.rank);
      }
      try {
        root = agree_state_root(*g, alive);
      } catch (const Error& e) {
        say("survivors: ", e.what(), "; restarting every worker");
        if (survivors) group.stop(ms_of(o_.grace_period_s));
        survivors = false;
      }
    }
    if (survivors && !continue_survivors(*previous, *g, group, root)) {
      group.stop(ms_of(o_.grace_period_s));
      survivors = false;
    }
    if (!survivors) {
      group = WorkerGroup();
      // A restart of every worker takes the ready spares first (they skip start-up too).
      const bool restart = previous.has_value();
      state_root_ = root;  // another node's survivors send them the state
      group.start(
          o_.command, g->slots, g->rank_offset,
          [&](const Worker& w) { return worker_environment(*g, w); },
          [&](const Worker& w) { return restart ? take_spare(*g, w) : std::nullopt; });
      state_root_.reset();
      for (auto& w : group.workers()) w.generation = g->number;
    }
    if (o_.spares > 0 && !spares_ && !group.workers().empty()) {
      start_spares(*g, group.workers().front());
    }
    if (taken_by_spares_ > 0) recovery_.taken_by_spares(std::exchange(taken_by_spares_, 0));
    LauncherParts with_spares = parts;
    with_spares.spares = spares_.get();
    const Outcome out = GenerationSupervisor(with_spares, *g, group).run();
    previous = g;
    survivors = out.end == End::kSurvivors;

    if (out.end == End::kCompleted) return completed(*g, out);
    if (out.end == End::kSignal) return finish(*g, out.code);
    const Failure& f = *out.failure;
    if (const std::optional<int> code = ends_the_job(*g, f)) {
      if (survivors) group.stop(ms_of(o_.grace_period_s));
      return *code;
    }
    if (f.admit) {
      say("re-forming the group to admit the waiting node(s)");
    } else {
      recovery_.restarting(f, out.step_seconds, survivors);
      say(survivors ? "restarting the failed worker(s) (restart "
                    : "restarting the workers (restart ",
          recovery_.restarts(), " of ", o_.max_restarts, ")");
    }
  }
}

bool Agent::survivors_can_continue(const WorkerGroup& group) const {
  if (!group.any_running()) return false;
  for (const auto& w : group.workers()) {
    if (!snapshots_ || !snapshots_->restore_of(w.rank)) {
      say("survivors: no in-memory snapshot that every rank holds; restarting every worker");
      return false;
    }
  }
  return true;
}

std::optional<int> Agent::agree_state_root(const Generation& g, const std::vector<int>& alive) {
  std::vector<int> all = alive;
  if (multi_node()) {
    const auto key = [&](int node) {
      return str_cat("dtrain/", o_.run_id, "/launch/g", g.number, "/alive/", node);
    };
    rendezvous_.client().set(key(o_.node_rank), nlohmann::json(alive).dump());
    for (int node : g.nodes) {
      if (node == o_.node_rank) continue;
      const std::string text = rendezvous_.client().get(key(node), ms_of(o_.rdzv_timeout_s));
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
      DTRAIN_CHECK(j.is_array(), "survivors: node ", node, "'s survivors ", key(node), " = '", text,
                   "' is not a list of ranks");
      for (const auto& r : j) all.push_back(r.get<int>());
    }
  }
  if (all.empty() || static_cast<int>(all.size()) >= g.world_size || !state_broadcast_enabled()) {
    return std::nullopt;
  }
  return *std::min_element(all.begin(), all.end());
}

bool Agent::continue_survivors(const Generation& failed, const Generation& g, WorkerGroup& group,
                               std::optional<int> root) {
  std::vector<Worker*> dead, alive;
  for (auto& w : group.workers()) (w.running ? alive : dead).push_back(&w);
  if (alive.empty()) return false;
  // The survivors first (they wait in fit for this), then the new processes.
  const std::string rank_list = [&] {
    std::string out;
    for (const Worker* w : alive) out += str_cat(out.empty() ? "" : ", ", w->rank);
    return out;
  }();
  // The lowest surviving rank (of any node: `root`) broadcasts the agreed snapshot to the
  // newcomers over the new generation's collectives; their copies in this launcher's memory are
  // the fallback.
  try {
    for (Worker* w : alive) {
      const auto [prefix, source] = *snapshots_->restore_of(w->rank);
      nlohmann::json j = {{"generation", g.number}, {"restore", prefix}, {"source", source}};
      if (root) j["state_root"] = *root;
      rendezvous_.client().set(announcement_key(o_.run_id, failed.number, w->rank), j.dump());
    }
  } catch (const Error& e) {
    say("survivors: cannot tell the survivors about generation ", g.number, " (", e.what(),
        "); restarting every worker");
    return false;
  }
  // The watchdog counts a survivor's stall from now (it rolls back, and its steps go back too).
  for (Worker* w : alive) w->step_changed = Clock::now();
  std::string restarted, spares;
  state_root_ = root;
  for (Worker* w : dead) {
    if (std::optional<Process> p = take_spare(g, *w)) {
      group.adopt(*w, *p, g.number);
      spares += str_cat(spares.empty() ? "" : ", ", w->rank, " (spare pid ", w->pid, ")");
      continue;
    }
    if (spares_) say("spares: no spare stands by for rank ", w->rank, "; restarting it");
    group.respawn(*w, o_.command, g.number,
                  [&](const Worker& x) { return worker_environment(g, x); });
    restarted += str_cat(restarted.empty() ? "" : ", ", w->rank, " (pid ", w->pid, ")");
  }
  state_root_.reset();
  FaultEvent e = event_of(kEventSurvivors, g.number);
  e.node = o_.node_rank;
  e.world_size = g.world_size;
  e.restarts = recovery_.restarts();
  if (dead.size() == 1) {
    e.rank = dead[0]->rank;
    e.pid = dead[0]->pid;
  }
  e.extra["survivors"] = rank_list;
  if (root) e.extra["state_from_rank"] = std::to_string(*root);
  e.extra["restarted"] = restarted;
  if (!spares.empty()) e.extra["spares"] = spares;
  std::string pids;
  for (const Worker* w : alive) pids += str_cat(pids.empty() ? "" : ",", w->pid);
  e.extra["survivor_pids"] = pids;
  e.message = str_cat("rank(s) ", rank_list, " keep running (pids ", pids, ") and join generation ",
                      g.number, restarted.empty() ? "" : "; restarted rank(s) " + restarted,
                      spares.empty() ? "" : "; taken over by spares: rank(s) " + spares);
  say(e.message);
  recorder_.record(e);
  return true;
}

std::optional<Generation> Agent::next_generation(const std::optional<Generation>& previous) {
  try {
    return rendezvous_.next_generation(exclusion_.active_slots());
  } catch (const FailedPreconditionError& e) {
    FaultEvent ev = event_of(kEventGiveUp, previous ? previous->number : 0);
    ev.message = e.what();
    recorder_.record(ev);
    say(e.what());
    return std::nullopt;
  }
}

void Agent::announce(const Generation& g, bool restart, bool survivors) {
  FaultEvent start = event_of(restart ? kEventRestart : kEventStart, g.number);
  start.world_size = g.world_size;
  start.node = o_.node_rank;
  start.restarts = recovery_.restarts();
  if (survivors) start.extra["mode"] = "survivors";
  start.message = restart ? str_cat(survivors ? "restarting the failed worker(s) in generation "
                                              : "restarted the workers in generation ",
                                    g.number, " (", g.world_size, " workers, restart ",
                                    recovery_.restarts(), " of ", o_.max_restarts, ")")
                          : str_cat("started ", g.slots.size(), " workers of ", g.world_size,
                                    " in generation ", g.number);
  recovery_.started(g.number);
  if (restart) say(start.message);
  recorder_.record(start);
}

std::vector<std::string> Agent::worker_environment(const Generation& g, const Worker& w) const {
  return environment_with(kWorkerDrop, worker_variables(g, w));
}

void Agent::start_spares(const Generation& g, const Worker& w) {
  if (!rendezvous_.connected()) return;
  SparesOptions so{.count = o_.spares,
                   .run_id = o_.run_id,
                   .node = o_.node_rank,
                   .service = rendezvous_.service(),
                   .command = o_.command,
                   .worker_variables = kWorkerDrop,
                   .set = {str_cat(kEnvLauncherPid, "=", ::getpid())},
                   .fork_server = o_.spare_start == "fork"};
  // Where a spare makes its first snapshot slots while it stands by (train/standby.h).
  if (snapshots_) so.set.push_back(str_cat(train::kEnvSpareSlotRoot, "=", snapshots_->directory()));
  for (const std::string& kv : worker_variables(g, w)) {
    so.worker_variables.push_back(kv.substr(0, kv.find('=')));
  }
  spares_ = std::make_unique<Spares>(std::move(so), rendezvous_.client(), recorder_);
}

std::optional<Process> Agent::take_spare(const Generation& g, const Worker& w) {
  if (!spares_) return std::nullopt;
  std::optional<Spares::Taken> t =
      spares_->take(w.rank, g.number, kWorkerDrop, worker_variables(g, w));
  if (!t) return std::nullopt;
  ++taken_by_spares_;
  return t->process;
}

std::vector<std::string> Agent::worker_variables(const Generation& g, const Worker& w) const {
  dist::LauncherEnv env{
      .local_world_size = static_cast<int>(g.slots.size()),
      .node_rank = g.node_index,
      .nnodes = static_cast<int>(g.nodes.size()),
      .rdzv = o_.rdzv.find("://") != std::string::npos ? o_.rdzv : rendezvous_.service(),
      .generation = g.number,
      .run_id = o_.run_id};
  env.world_size = g.world_size;
  if (!rendezvous_.service().empty()) {
    env.master = dist::parse_host_port(rendezvous_.service(), "coordination service");
  }
  env.rank = w.rank;
  env.local_rank = w.local_rank;
  double progress_interval = 0.1;
  if (o_.watchdog_timeout_s > 0) progress_interval = std::min(0.1, o_.watchdog_timeout_s / 4);
  std::vector<std::string> set;
  for (const auto& [k, v] : env.to_variables()) set.push_back(k + "=" + v);
  set.push_back(str_cat(kEnvWorkerSlot, "=", w.slot));
  set.push_back(str_cat(kEnvLauncherPid, "=", ::getpid()));
  set.push_back(str_cat(kEnvHeartbeatInterval, "=", o_.heartbeat_interval_s));
  set.push_back(str_cat(kEnvHeartbeatTimeout, "=", o_.heartbeat_timeout_s));
  set.push_back(str_cat(kEnvProgressInterval, "=", progress_interval));
  set.push_back(str_cat("DTRAIN_PREEMPTION_EXIT_CODE=", o_.preemption_exit_code));
  set.push_back(str_cat(kEnvOnFailure, "=", o_.on_failure));
  if (snapshots_) {
    for (std::string& v : snapshots_->environment(w.rank)) set.push_back(std::move(v));
  }
  if (state_root_) set.push_back(str_cat(kEnvBroadcastRoot, "=", *state_root_));
  return set;
}

int Agent::completed(const Generation& g, const Outcome& out) {
  FaultEvent e = event_of(kEventCompleted, g.number);
  e.restarts = recovery_.restarts();
  e.last_step = out.job_step;
  e.message = str_cat("every worker finished (", recovery_.restarts(), " restart(s))");
  recorder_.record(e);
  return finish(g, 0);
}

std::optional<int> Agent::ends_the_job(const Generation& g, const Failure& f) {
  if (f.preemption) {
    say("preempted (exit code ", f.code, "): not restarting");
    return finish(g, f.code);
  }
  if (f.lost_service && o_.max_restarts == 0) {
    throw UnavailableError(
        str_cat("launch: lost the coordination service at ", rendezvous_.service()));
  }
  const int restarts = recovery_.restarts();
  if (!f.admit && restarts >= o_.max_restarts) {
    FaultEvent e = event_of(kEventGiveUp, g.number);
    e.rank = f.rank;
    e.node = f.node;
    e.exit_code = f.code;
    e.restarts = restarts;
    e.last_step = f.last_step;
    e.message = o_.max_restarts == 0
                    ? str_cat(f.what, "; no restarts (--max-restarts 0)")
                    : str_cat(f.what, "; giving up after ", restarts, " restart(s)");
    recorder_.record(e);
    if (o_.max_restarts > 0) say(e.message);
    return finish(g, f.code);
  }
  if (exclusion_.exclude_slot(f)) {
    FaultEvent e = event_of(kEventExclude, g.number);
    e.slot = f.slot;
    e.rank = f.rank;
    e.node = o_.node_rank;
    e.message = exclusion_.slot_message(*f.slot);
    recorder_.record(e);
    say(e.message);
    if (exclusion_.every_slot_excluded()) {
      FaultEvent gu = event_of(kEventGiveUp, g.number);
      gu.exit_code = f.code;
      gu.message = "every slot is excluded";
      recorder_.record(gu);
      return f.code;
    }
  }
  if (f.exclude && f.node && *f.node == o_.node_rank) {
    FaultEvent e = event_of(kEventExclude, g.number);
    e.node = o_.node_rank;
    e.exit_code = f.code;
    e.message = exclusion_.node_message(o_.node_rank);
    recorder_.record(e);
    say(e.message);
    return finish(g, f.code);
  }
  return std::nullopt;
}

int Agent::finish(const Generation& g, int code) {
  recorder_.flush();
  if (multi_node() && rendezvous_.connected()) rendezvous_.leave(g, code);
  return code;
}

}  // namespace

int run_launch_agent(const LaunchOptions& options) {
  validate_launch_options(options);
  Agent agent(options);
  return agent.run();
}

}  // namespace dtrain::fault
