// The launcher's fault events (see launch_events.h).
#include "fault/launch_events.h"

#include <sys/wait.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"
#include "fault/launch_util.h"
#include "fault/snapshots.h"

namespace dtrain::fault {

FaultEvent event_of(const char* kind, int64_t generation) {
  FaultEvent e;
  e.kind = kind;
  e.generation = generation;
  return e;
}

FaultEvent event_of(const char* kind, int64_t generation, const Failure& f) {
  FaultEvent e = event_of(kind, generation);
  e.rank = f.rank;
  e.node = f.node;
  e.slot = f.slot;
  e.pid = f.pid;
  e.exit_code = f.code;
  e.signal = f.signal;
  e.detector = f.detector;
  e.last_step = f.last_step;
  return e;
}

FaultEvent aftermath_event(const Worker& w, int node, const Failure& first,
                           int preemption_exit_code, int64_t generation) {
  const bool peer = is_peer_failure(w, preemption_exit_code);
  FaultEvent e = event_of(peer ? kEventPeerFailure : kEventStopped, generation);
  e.rank = w.rank;
  e.node = node;
  e.slot = w.slot;
  e.pid = w.pid;
  e.exit_code = w.code;
  if (WIFSIGNALED(w.status)) e.signal = WTERMSIG(w.status);
  if (peer) e.detector = is_collective_exit(w.code) ? kDetectCollective : kDetectExit;
  e.cause_rank = first.rank;
  e.last_step = w.step;
  e.message = str_cat("worker ", w.rank, " ", describe_exit(w.status),
                      w.step ? str_cat(" at step ", *w.step) : std::string(),
                      peer ? " after the failure (a consequence of it)" : " (stopped)");
  return e;
}

void RecoveryTracker::restarting(const Failure& f, std::optional<double> step_seconds,
                                 bool survivors) {
  ++restarts_;
  Recovery r;
  r.failure = f;
  r.step_seconds = step_seconds;
  r.survivors = survivors;
  recovery_ = r;
}

void RecoveryTracker::started(int64_t generation) {
  if (recovery_) recovery_->generation = generation;
}

void RecoveryTracker::observe(const Generation& g, distribute::CoordinationClient& client,
                              const std::map<std::string, std::string>& progress) {
  record_backup_restores(g, client, progress);
  if (!recovery_ || recovery_->generation != g.number) return;
  if (!recovery_->resumed_recorded) record_resumed(g, client);
  // The first step completed after the restart: past the resumed step (or any step at all when
  // the workers do not say where they resumed).
  std::optional<int64_t> newest;
  for (const auto& [k, v] : progress) {
    if (const auto s = parse_int(v)) newest = std::max(newest.value_or(*s), *s);
  }
  if (!newest || (recovery_->resumed_step && *newest <= *recovery_->resumed_step)) return;
  record_recovered(g);
  recovery_.reset();
}

void RecoveryTracker::record_backup_restores(const Generation& g,
                                             distribute::CoordinationClient& client,
                                             const std::map<std::string, std::string>& progress) {
  if (backups_generation_ != g.number) {
    backups_generation_ = g.number;
    backups_done_ = false;
    backups_seen_.clear();
    snapshots_seen_.clear();
  }
  record_snapshot_reports(g, client);
  if (backups_done_) return;
  // A worker writes its report before its first step, so once every worker of this node has
  // trained one, this read is the last one needed.
  const bool last = progress.size() >= g.slots.size();
  const int node = g.nodes.empty() ? 0 : g.nodes[static_cast<size_t>(g.node_index)];
  for (const auto& [key, value] : client.get_prefix(str_cat("backup_restore/", g.number, "/"))) {
    const std::optional<int64_t> rank = parse_int(key.substr(key.rfind('/') + 1));
    if (!rank || *rank < g.rank_offset ||
        *rank >= g.rank_offset + static_cast<int64_t>(g.slots.size()) ||
        backups_seen_[static_cast<int>(*rank)]) {
      continue;
    }
    backups_seen_[static_cast<int>(*rank)] = true;
    FaultEvent e = event_of(kEventBackupRestore, g.number);
    e.rank = static_cast<int>(*rank);
    e.node = node;
    std::string source = "?";
    try {
      const nlohmann::json j = nlohmann::json::parse(value);
      source = j.value("source", "?");
      e.resumed_step = j.value("step", int64_t{0});
      e.checkpoint = j.value("checkpoint", "");
      e.extra["source"] = source;
      std::string from = str_cat("local disk (node ", node, ")");
      if (j.contains("from_node")) {
        // The worker knows the node's position in the generation; the event names its id.
        const int index = j["from_node"].get<int>();
        const int from_node = index >= 0 && index < static_cast<int>(g.nodes.size())
                                  ? g.nodes[static_cast<size_t>(index)]
                                  : index;
        e.extra["from_node"] = std::to_string(from_node);
        e.extra["from_rank"] = std::to_string(j.value("from_rank", -1));
        e.extra["bytes"] = std::to_string(j.value("bytes", int64_t{0}));
        from = str_cat("node ", from_node, "'s disk over TCP (", j.value("bytes", int64_t{0}),
                       " bytes)");
      }
      e.message = str_cat("rank ", *rank, ": restored ", e.checkpoint, " (step ", *e.resumed_step,
                          ") from ", from);
    } catch (const std::exception& ex) {
      e.message = str_cat("rank ", *rank, ": unreadable backup report '", value, "': ", ex.what());
    }
    say(e.message);
    recorder_.record(e);
  }
  if (last) backups_done_ = true;
}

void RecoveryTracker::record_snapshot_reports(const Generation& g,
                                              distribute::CoordinationClient& client) {
  // Read at every monitor pass: a newcomer reports after its first step, which can come after
  // the backup reports' last read.
  // A newcomer of a survivors recovery that received its snapshot from a survivor says so
  // (train/memory_snapshots.cc); its monotonic times place the phases after the detection.
  for (const auto& [key, value] : client.get_prefix(str_cat("snapshot_restore/", g.number, "/"))) {
    const std::optional<int64_t> rank = parse_int(key.substr(key.rfind('/') + 1));
    if (!rank || *rank < g.rank_offset ||
        *rank >= g.rank_offset + static_cast<int64_t>(g.slots.size()) ||
        snapshots_seen_[static_cast<int>(*rank)]) {
      continue;
    }
    snapshots_seen_[static_cast<int>(*rank)] = true;
    FaultEvent e = event_of(kEventSnapshotRestore, g.number);
    e.rank = static_cast<int>(*rank);
    e.node = g.nodes.empty() ? 0 : g.nodes[static_cast<size_t>(g.node_index)];
    try {
      const nlohmann::json j = nlohmann::json::parse(value);
      const std::string source = j.value("source", "?");
      e.checkpoint = j.value("checkpoint", "");
      e.extra["source"] = source;
      e.extra["from_rank"] = std::to_string(j.value("from_rank", -1));
      e.extra["bytes"] = std::to_string(j.value("bytes", int64_t{0}));
      std::string timing;
      std::optional<Clock::time_point> at;
      if (recovery_ && recovery_->generation == g.number) at = recovery_->failure.detected_at;
      if (!at && recovered_generation_ == g.number) at = recovered_detected_at_;
      if (at) {
        const double detected = std::chrono::duration<double>(at->time_since_epoch()).count();
        for (const char* phase : {"assigned", "announced", "rejoined", "rolled_back", "started",
                                  "received", "restored", "shared", "first_step"}) {
          if (!j.contains(phase)) continue;
          const double after = j[phase].get<double>() - detected;
          e.extra[str_cat(phase, "_after_failure_s")] = fixed(after, 3);
          timing += str_cat(timing.empty() ? "; " : ", ", phase, " ", fixed(after, 3), " s");
        }
        if (!timing.empty()) timing += " after the failure was detected";
      }
      if (j.value("survivor", false)) {
        e.extra["survivor"] = "true";
        e.extra.erase("from_rank");
        e.extra.erase("bytes");
        e.message = str_cat("rank ", *rank, ": rolled back to ", e.checkpoint,
                            " from local memory in the surviving process", timing);
      } else {
        e.message = str_cat("rank ", *rank, ": received ", e.checkpoint, " from rank ",
                            j.value("from_rank", -1), " (a survivor) by broadcast, ",
                            j.value("bytes", int64_t{0}), " bytes", timing);
      }
    } catch (const std::exception& ex) {
      e.message =
          str_cat("rank ", *rank, ": unreadable snapshot report '", value, "': ", ex.what());
    }
    say(e.message);
    recorder_.record(e);
  }
}

void RecoveryTracker::record_resumed(const Generation& g, distribute::CoordinationClient& client) {
  Recovery& r = *recovery_;
  const auto resumed = client.get_prefix(str_cat("resumed/", g.number, "/"));
  for (const auto& [k, v] : resumed) {
    if (const auto s = parse_int(v)) r.resumed_step = std::min(r.resumed_step.value_or(*s), *s);
  }
  if (!r.resumed_step) return;
  for (const auto& [k, v] : client.get_prefix(str_cat("resumed_from/", g.number, "/"))) {
    r.checkpoint = v;
  }
  r.resumed_recorded = true;
  FaultEvent e = event_of(kEventResumed, g.number);
  e.resumed_step = r.resumed_step;
  e.checkpoint = r.checkpoint;
  e.last_step = r.failure.last_step;
  // Known only when the last progress report came after the backup (reports are rate-limited,
  // so they can trail it).
  if (r.failure.last_step && *r.failure.last_step >= *r.resumed_step)
    e.lost_steps = *r.failure.last_step - *r.resumed_step;
  e.message = str_cat("workers resumed", r.checkpoint.empty() ? "" : " from " + r.checkpoint,
                      " at step ", *r.resumed_step);
  recorder_.record(e);
}

void RecoveryTracker::record_recovered(const Generation& g) {
  const Recovery& r = *recovery_;
  recovered_generation_ = g.number;
  recovered_detected_at_ = r.failure.detected_at;
  const double recovery = seconds_between(r.failure.detected_at, Clock::now());
  FaultEvent e = event_of(kEventRecovered, g.number);
  e.rank = r.failure.rank;
  e.node = r.failure.node;
  e.detector = r.failure.detector;
  e.last_step = r.failure.last_step;
  e.resumed_step = r.resumed_step;
  e.checkpoint = r.checkpoint;
  e.recovery_seconds = recovery;
  e.restarts = restarts_;
  if (r.survivors) e.extra["mode"] = r.spares > 0 ? "spares" : "survivors";
  if (r.spares > 0) e.extra["spares"] = std::to_string(r.spares);
  std::string lost;
  if (r.failure.last_step && r.resumed_step && *r.failure.last_step >= *r.resumed_step) {
    e.lost_steps = *r.failure.last_step - *r.resumed_step;
    e.lost_seconds = recovery + static_cast<double>(*e.lost_steps) * r.step_seconds.value_or(0);
    lost = str_cat("; lost ", *e.lost_steps, " steps, ", fixed(*e.lost_seconds), " s");
  } else if (r.failure.last_step && r.resumed_step) {
    // The last progress report (rate-limited) predates the backup the workers resumed from, so
    // how far past it the failed worker got is not known here: at most one backup interval.
    e.lost_seconds = recovery;
    lost = str_cat("; lost the steps after ", *r.resumed_step,
                   " (at most one backup interval; last progress report: step ",
                   *r.failure.last_step, "), ", fixed(recovery), " s");
  } else {
    lost = str_cat("; back to training ", fixed(recovery), " s after the failure");
  }
  e.message = str_cat(
      r.failure.what,
      r.spares > 0 && r.survivors ? "; a spare took over, the other workers kept running (spares)"
      : r.spares > 0 ? "; restarted (spares took over " + std::to_string(r.spares) + " rank(s))"
      : r.survivors  ? "; restarted it, the other workers kept running (survivors)"
                     : "; restarted",
      r.resumed_step ? str_cat("; resumed", r.checkpoint.empty() ? "" : " from " + r.checkpoint,
                               " at step ", *r.resumed_step)
                     : std::string(),
      lost);
  recorder_.record(e);
}

}  // namespace dtrain::fault
