// The launcher's fault events: building FaultEvents from failures and workers, and following a
// restart until the workers train again (the "resumed" and "recovered" events, with the steps
// and seconds the failure cost). Private to src/fault. Single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "dtrain/distribute/coordination.h"
#include "dtrain/fault/fault_events.h"
#include "fault/failure_classifier.h"
#include "fault/launch_rendezvous.h"
#include "fault/worker_group.h"

namespace dtrain::fault {

// A worker restored a durable backup from its host's disk or a peer's (train/peer_backups.h).
inline constexpr const char* kEventBackupRestore = "backup_restore";

// An event of `kind` in `generation`.
FaultEvent event_of(const char* kind, int64_t generation);
// An event about failure `f`: its worker (rank, node, slot, pid), how it ended (exit code,
// signal), its detector and last step.
FaultEvent event_of(const char* kind, int64_t generation, const Failure& f);
// Worker `w` of node `node` exited (non-zero) after the generation's first failure `first`:
// a peer_failure (a consequence of it) or stopped (by the launcher).
FaultEvent aftermath_event(const Worker& w, int node, const Failure& first,
                           int preemption_exit_code, int64_t generation);

// Restarts so far, and the one in progress: from the failure to the workers' first step.
class RecoveryTracker {
 public:
  explicit RecoveryTracker(FaultRecorder& recorder) : recorder_(recorder) {}

  int restarts() const { return restarts_; }
  // The code of the failure whose restart is still in progress, if any.
  std::optional<int> pending_failure_code() const {
    return recovery_ ? std::optional<int>(recovery_->failure.code) : std::nullopt;
  }
  // The group restarts after failure `f` (the job took `step_seconds` per step before it, when
  // known): counts the restart and follows it.
  // `survivors`: only the failed workers restart (--on-failure survivors).
  void restarting(const Failure& f, std::optional<double> step_seconds, bool survivors = false);
  // The restarted workers run in generation `generation`.
  void started(int64_t generation);
  // --spares: `n` of the failed ranks were taken over by standby spares (no process start).
  void taken_by_spares(int n) {
    if (recovery_) recovery_->spares += n;
  }
  // Reads where the workers of `g` resumed (once) and, given their newest steps `progress`,
  // records "resumed" and, at the first step past it, "recovered". Also records, in any
  // generation, a "backup_restore" for each of this node's workers that says where its durable
  // backup came from (read until every worker of the node has trained a step).
  void observe(const Generation& g, distribute::CoordinationClient& client,
               const std::map<std::string, std::string>& progress);

 private:
  struct Recovery {
    Failure failure;
    int64_t generation = 0;
    std::optional<double> step_seconds;  // mean step time before the failure
    bool survivors = false;              // the other workers kept running
    int spares = 0;                      // failed ranks taken over by spares
    bool resumed_recorded = false;
    std::optional<int64_t> resumed_step;
    std::string checkpoint;
  };
  void record_resumed(const Generation& g, distribute::CoordinationClient& client);
  void record_recovered(const Generation& g);
  // A newcomer's snapshot_restore report (state from a survivor, with the phases' times).
  void record_snapshot_reports(const Generation& g, distribute::CoordinationClient& client);
  void record_backup_restores(const Generation& g, distribute::CoordinationClient& client,
                              const std::map<std::string, std::string>& progress);

  FaultRecorder& recorder_;
  int restarts_ = 0;
  std::optional<Recovery> recovery_;
  int64_t backups_generation_ = 0;  // the generation whose backup_restore reports are read
  bool backups_done_ = false;
  std::map<int, bool> backups_seen_;    // rank → recorded
  std::map<int, bool> snapshots_seen_;  // rank → its snapshot_restore report recorded
  int64_t recovered_generation_ = 0;    // the last recovery's generation and detection time
  Clock::time_point recovered_detected_at_{};
};

}  // namespace dtrain::fault
