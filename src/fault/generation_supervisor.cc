// One generation of the launcher (see generation_supervisor.h).
#include "fault/generation_supervisor.h"

#include <algorithm>
#include <csignal>
#include <cstring>

#include "dtrain/core/error.h"
#include "dtrain/fault/progress_reporter.h"

namespace dtrain::fault {
namespace {
constexpr milliseconds kMonitorPeriod(250);  // progress, heartbeats, other nodes
constexpr milliseconds kPollPeriod(50);      // output, signals, exits
constexpr milliseconds kDrainTime(1000);     // pipes a leftover grandchild holds
// Survivors mode: workers that die within this long of the first are restarted with it (two
// killed at once), instead of failing the next generation as it forms.
constexpr milliseconds kSurvivorsSettle(50);
// A hung worker killed by the launcher must be gone before the survivors go on.
constexpr milliseconds kFenceTimeout(2000);
}  // namespace

GenerationSupervisor::GenerationSupervisor(const LauncherParts& parts, const Generation& g,
                                           WorkerGroup& group)
    : o_(parts.options),
      parts_(parts),
      g_(g),
      group_(group),
      next_monitor_(Clock::now() + kMonitorPeriod) {}

Outcome GenerationSupervisor::run() {
  while (!over()) {
    if (survivors_until_ && received_signal_ == 0 && Clock::now() >= *survivors_until_) {
      return outcome();  // the survivors keep running; their pipes stay open
    }
    group_.pump_output(parts_.signals.fd(), survivors_until_ ? milliseconds(10) : kPollPeriod);
    forward_signals();
    handle_exits(group_.reap());
    if (parts_.spares != nullptr && received_signal_ == 0) parts_.spares->tend(g_.number);
    if (!failure_ && !locally_done_ && !group_.any_running()) finish_locally();
    if (parts_.rendezvous.connected() && !failure_ && !completed_ &&
        Clock::now() >= next_monitor_) {
      check_health();
    }
    if (kill_at_ && Clock::now() >= *kill_at_) {
      group_.kill_stragglers();
      kill_at_ = Clock::now() + std::chrono::hours(24);  // once
    }
  }
  group_.close_output();
  return outcome();
}

bool GenerationSupervisor::over() {
  if (group_.any_running()) return false;
  const bool waiting_for_nodes = locally_done_ && !completed_ && !failure_ && !received_signal_;
  if (waiting_for_nodes) return false;
  if (!group_.output_open()) return true;
  if (!drain_until_) drain_until_ = Clock::now() + kDrainTime;
  return Clock::now() >= *drain_until_;
}

void GenerationSupervisor::forward_signals() {
  for (int sig : parts_.signals.take()) {
    say("received ", strsignal(sig), "; forwarding it to the workers");
    received_signal_ = sig;
    if (!failure_) {
      Failure f = signal_failure(o_.node_rank, sig, Clock::now());
      publish(f);
      FaultEvent e = event_of(kEventSignal, g_.number);
      e.node = o_.node_rank;
      e.signal = sig;
      e.last_step = job_step_;
      e.message = str_cat("the launcher received ", strsignal(sig),
                          "; forwarded it to the workers (no restart)");
      parts_.recorder.record(e);
      failure_ = f;
    }
    group_.signal(sig);
    if (!kill_at_) kill_at_ = Clock::now() + ms_of(o_.grace_period_s);
  }
}

void GenerationSupervisor::handle_exits(std::vector<Worker*> reaped) {
  if (parts_.rendezvous.connected() &&
      std::any_of(reaped.begin(), reaped.end(), [](const Worker* w) { return w->code != 0; })) {
    refresh_steps(reaped);
  }
  // Within one pass, a worker killed by a signal is the likelier first failure than peers that
  // exited on their own with a collective error.
  order_by_exit_priority(reaped);
  for (Worker* w : reaped) {
    if (w->code == 0) continue;
    if (!failure_) {
      fail(exit_failure(*w, o_.node_rank, o_.preemption_exit_code, Clock::now()));
    } else if (survivors_until_ && received_signal_ == 0) {
      // Died with the first (two workers killed at once): restarted with it.
      Failure also = exit_failure(*w, o_.node_rank, o_.preemption_exit_code, Clock::now());
      FaultEvent e = event_of(kEventFailure, g_.number, also);
      e.message = also.what + " (with the first failure)";
      e.time = also.detected_unix;
      parts_.recorder.record(e);
      say("failure: rank ", w->rank, " (pid ", w->pid, "): ", also.what, " (with the first)");
    } else if (!(w->rank == failure_->rank && failure_->ours)) {  // not the hung one we killed
      parts_.recorder.record(
          aftermath_event(*w, o_.node_rank, *failure_, o_.preemption_exit_code, g_.number));
    }
  }
}

void GenerationSupervisor::refresh_steps(const std::vector<Worker*>& reaped) {
  try {
    for (const auto& [k, v] : progress()) {
      const auto s = parse_int(v);
      const auto rank = parse_int(k.substr(k.rfind('/') + 1));
      if (!s || !rank) continue;
      for (Worker* w : reaped) {
        if (w->rank == *rank && (!w->step || *w->step < *s)) w->step = s;
      }
    }
  } catch (const Error&) {
    // Best effort: the service may be gone with the failure.
  }
}

void GenerationSupervisor::finish_locally() {
  locally_done_ = true;
  if (!multi_node() || !parts_.rendezvous.connected()) {
    completed_ = true;
    return;
  }
  try {
    parts_.rendezvous.mark_done(g_);
  } catch (const Error& e) {
    say("cannot tell the other nodes that this node finished: ", e.what());
  }
}

void GenerationSupervisor::check_health() {
  next_monitor_ = Clock::now() + kMonitorPeriod;
  try {
    if (multi_node()) {
      if (auto remote = parts_.rendezvous.read_failure(g_)) fail(*remote);
    }
    if (!failure_ && !locally_done_) monitor();
    if (!failure_ && locally_done_ && multi_node() && parts_.rendezvous.all_done(g_)) {
      completed_ = true;
    }
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kUnavailable || e.code() == ErrorCode::kDeadlineExceeded) {
      on_lost_service(e);
    } else {
      say("monitoring: ", e.what());
    }
  }
}

// Reads progress and heartbeats; fails for a hung or silent worker, a lost node, or an
// elastic node waiting to join.
void GenerationSupervisor::monitor() {
  const auto now = Clock::now();
  const auto progress = this->progress();
  note_progress(progress, now);
  // Recovery ends at the first step past the resume of the workers started in this generation:
  // a survivor's progress key may still hold its step from before the rollback.
  std::map<std::string, std::string> fresh;
  for (const auto& w : group_.workers()) {
    const auto it = progress.find(progress_key(g_.number, w.rank));
    if (w.generation == g_.number && it != progress.end()) fresh.insert(*it);
  }
  parts_.recovery.observe(g_, parts_.rendezvous.client(), fresh);
  std::map<std::string, milliseconds> ages;
  if (o_.heartbeat_timeout_s > 0) ages = parts_.rendezvous.client().heartbeat_ages();
  if (catch_hung_worker(ages, now) || !multi_node()) return;
  check_other_nodes(ages, now);
}

void GenerationSupervisor::note_progress(const std::map<std::string, std::string>& progress,
                                         Clock::time_point now) {
  for (const auto& [k, v] : progress) {
    const auto s = parse_int(v);
    if (!s) continue;
    job_step_ = std::max(job_step_.value_or(*s), *s);
    if (!first_progress_) first_progress_ = {{*s, now}};
    const auto rank = parse_int(k.substr(k.rfind('/') + 1));
    for (auto& w : group_.workers()) {
      if (rank && w.rank == *rank && w.step != s) {
        w.step = s;
        w.step_changed = now;
      }
    }
  }
}

bool GenerationSupervisor::catch_hung_worker(const std::map<std::string, milliseconds>& ages,
                                             Clock::time_point now) {
  std::vector<Worker*> suspects;
  for (auto& w : group_.workers()) {
    if (w.running) suspects.push_back(&w);
  }
  order_hang_suspects(suspects, process_stopped);
  const HangLimits limits{.watchdog_timeout_s = o_.watchdog_timeout_s,
                          .heartbeat_timeout_s = o_.heartbeat_timeout_s};
  for (Worker* w : suspects) {
    const auto age = ages.find(worker_heartbeat_task(w->generation, w->rank));
    std::optional<Failure> f =
        detect_hang(*w, o_.node_rank, now,
                    age == ages.end() ? std::nullopt : std::optional(age->second), limits);
    if (!f) continue;
    f->detected_unix = unix_now();
    say(f->what, "; it is hung: collecting its stacks, then killing it");
    f->stack = describe_stuck_process(w->pid, ms_of(o_.stack_timeout_s));
    say("rank ", w->rank, " was doing this:\n", f->stack);
    ::kill(-w->pid, SIGKILL);
    // Fenced before the others go on: until it is reaped the hung process would count as one of
    // the survivors (and a stopped one, resumed, would rejoin with its stale state).
    if (!group_.await_exit(*w, kFenceTimeout)) {
      say("rank ", w->rank, " (pid ", w->pid, ") did not exit after SIGKILL within ",
          kFenceTimeout.count(), " ms; restarting every worker");
      unfenced_ = true;
    }
    fail(std::move(*f));
    return true;
  }
  return false;
}

// Other nodes: lost (their launcher's heartbeats stopped), or waiting to join.
void GenerationSupervisor::check_other_nodes(const std::map<std::string, milliseconds>& ages,
                                             Clock::time_point now) {
  for (int node : g_.nodes) {
    if (node == o_.node_rank) continue;
    const auto age = ages.find(str_cat("node/", node));
    if (age == ages.end()) continue;
    if (auto f = detect_lost_node(node, age->second, o_.heartbeat_timeout_s, now, job_step_)) {
      fail(std::move(*f));
      return;
    }
  }
  const distribute::Membership m = parts_.rendezvous.client().membership();
  for (const std::string& joining : m.joining) {
    const std::optional<int64_t> node = parse_int(joining.substr(joining.find('-') + 1));
    if (node && *node != o_.node_rank &&
        std::find(g_.nodes.begin(), g_.nodes.end(), *node) != g_.nodes.end()) {
      fail(rejoined_node(static_cast<int>(*node), now, job_step_));
      return;
    }
  }
  if (o_.min_nodes < o_.max_nodes && static_cast<int>(g_.nodes.size()) < o_.max_nodes) {
    if (!m.joining.empty()) {
      fail(admit_request(m.joining.front(), static_cast<int>(g_.nodes.size()), o_.max_nodes, now,
                         job_step_));
    }
  }
}

// The service did not answer: this node is cut off (or node 0 is gone). It cannot tell the
// others; they see its heartbeats stop.
void GenerationSupervisor::on_lost_service(const Error& e) {
  parts_.rendezvous.lost_service();
  const Failure f = lost_service_failure(o_.node_rank, e.what(), Clock::now(), job_step_);
  if (locally_done_) {
    completed_ = true;  // finished here; the service going away is the job ending elsewhere
    return;
  }
  FaultEvent ev = event_of(kEventFailure, g_.number);
  ev.node = o_.node_rank;
  ev.detector = f.detector;
  ev.exit_code = f.code;
  ev.last_step = f.last_step;
  ev.message = f.what;
  parts_.recorder.record(ev);
  failure_ = f;
  say(f.what, "; stopping the workers");
  stop_all(SIGTERM);
}

void GenerationSupervisor::fail(Failure f) {
  if (failure_) return;
  if (f.detected_at == Clock::time_point{}) f.detected_at = Clock::now();
  if (f.detected_unix == 0) f.detected_unix = unix_now();
  if (!f.last_step) f.last_step = job_step_;
  if (!f.remote && !publish(f)) {
    // Another node's failure came first: this one is a consequence of it.
    FaultEvent e = event_of(kEventPeerFailure, g_.number, f);
    e.message = f.what + " after a failure on another node";
    parts_.recorder.record(e);
    std::optional<Failure> first;
    try {
      first = parts_.rendezvous.read_failure(g_);
    } catch (const Error& e) {
      say("cannot read the other node's failure: ", e.what());
    }
    f = first ? *first : f;
    f.remote = true;
    f.ours = false;
  }
  if (!f.remote) {
    FaultEvent e = event_of(f.admit        ? kEventAdmit
                            : f.preemption ? kEventPreempted
                                           : kEventFailure,
                            g_.number, f);
    if (f.admit) e.exit_code = std::nullopt;  // a node asking to join did not exit
    e.detection_latency_seconds = f.detection_latency;
    e.stack = f.stack;
    e.message = f.what;
    e.time = f.detected_unix;
    parts_.recorder.record(e);
  }
  const std::string who =
      f.rank && f.pid ? str_cat("rank ", *f.rank, " (pid ", *f.pid, "): ") : std::string();
  if (f.remote) {
    say("failure on another node (", f.what, ", code ", f.code, "); stopping the workers");
  } else if (f.admit) {
    say(f.what, "; stopping the workers to re-form the group");
  } else {
    say("failure: ", who, f.what,
        f.preemption ? "; preempted: stopping the other workers (no restart)"
                     : "; stopping the other workers");
  }
  const bool survive = survivable(f);
  failure_ = std::move(f);
  if (survive) {
    say("survivors: the other workers keep running; restarting only the failed one(s)");
    // With one worker left running, no other can die "with" the first and leave survivors:
    // no window (when it dies too, the next generation fails as it forms and every worker
    // restarts, as after the window).
    int running = 0;
    for (const auto& w : group_.workers()) running += w.running ? 1 : 0;
    survivors_until_ = Clock::now() + (running > 1 ? kSurvivorsSettle : milliseconds(0));
    return;
  }
  stop_all(SIGTERM);
}

bool GenerationSupervisor::survivable(const Failure& f) {
  if (o_.on_failure != "survivors" || !parts_.rendezvous.connected() || unfenced_) return false;
  if (f.preemption || f.admit || f.lost_service || f.exclude || received_signal_ != 0) {
    return false;
  }
  // A worker of this node failed; or, across nodes, a worker of another node or a whole node
  // was lost: this node's workers are the survivors then.
  if (!f.rank && !(multi_node() && f.node)) return false;
  int running = 0;
  for (const auto& w : group_.workers()) running += w.running ? 1 : 0;
  if (running == 0) return false;
  // Every rank connected this generation's collectives (each publishes its build fingerprint
  // right after): a survivor is then inside fit, where it catches the collective error. A
  // failure while the group still forms restarts every worker instead.
  try {
    const auto built = parts_.rendezvous.client().get_prefix(
        str_cat("dtrain/", o_.run_id, "/g", g_.number, "/build/"));
    if (static_cast<int>(built.size()) >= g_.world_size) return true;
  } catch (const Error& e) {
    say("survivors: cannot read the generation's members (", e.what(), ")");
    return false;
  }
  say("survivors: generation ", g_.number, " had not formed yet (not every rank connected); ",
      "restarting every worker");
  return false;
}

std::map<std::string, std::string> GenerationSupervisor::progress() {
  if (o_.on_failure != "survivors") return parts_.rendezvous.progress(g_);
  const auto all = parts_.rendezvous.client().get_prefix("progress/");
  std::map<std::string, std::string> out;
  for (const auto& w : group_.workers()) {
    const auto it = all.find(progress_key(w.generation, w.rank));
    if (it != all.end()) out[progress_key(g_.number, w.rank)] = it->second;
  }
  return out;
}

bool GenerationSupervisor::publish(Failure& f) {
  if (!multi_node() || !parts_.rendezvous.connected()) return true;
  try {
    if (!parts_.rendezvous.claim_first_failure(g_)) return false;
    if (parts_.exclusion.exclude_node(f, o_.node_rank)) {
      if (parts_.rendezvous.hosts_service()) {
        say("node ", o_.node_rank, " failed ", o_.exclude_after,
            " times but hosts the coordination service: not excluded");
      } else {
        f.exclude = true;
        parts_.rendezvous.exclude_this_node(g_);
      }
    }
    parts_.rendezvous.publish_failure(g_, f);
  } catch (const Error& e) {
    say("cannot report the failure to the other nodes: ", e.what());
  }
  return true;
}

void GenerationSupervisor::stop_all(int sig) {
  group_.signal(sig);
  if (!kill_at_) kill_at_ = Clock::now() + ms_of(o_.grace_period_s);
}

Outcome GenerationSupervisor::outcome() const {
  Outcome out;
  out.failure = failure_;
  out.job_step = job_step_;
  if (failure_ && first_progress_ && job_step_ && *job_step_ > first_progress_->first) {
    out.step_seconds = seconds_between(first_progress_->second, failure_->detected_at) /
                       static_cast<double>(*job_step_ - first_progress_->first);
  }
  if (received_signal_ != 0) {
    int code = group_.first_nonzero_code();
    if (failure_ && failure_->detector != "signal" && failure_->code != 0) code = failure_->code;
    out.end = End::kSignal;
    out.code = code != 0 ? code : 128 + received_signal_;
  } else if (failure_ && survivors_until_) {
    out.end = End::kSurvivors;
    out.code = failure_->code;
  } else if (failure_) {
    out.end = End::kFailure;
    out.code = failure_->code;
  }
  return out;
}

}  // namespace dtrain::fault
