// MemorySnapshots: BackupAndRestore's state, every few steps, into the memory of the launcher
// that started this worker (`dtrain launch`, src/fault/snapshots.h). The launcher passes
//   DTRAIN_SNAPSHOT_DIR      a directory on tmpfs (/dev/shm) that the launcher owns and keeps
//                            when the worker dies: this worker's snapshots go there
//   DTRAIN_SNAPSHOT_EVERY    the schedule, in steps (--snapshot-every), when fit() names none
//   DTRAIN_SNAPSHOT_RESTORE  after a failure: the snapshot (a checkpoint prefix in its memory)
//                            that the launchers agreed every member holds, to resume from
//   DTRAIN_ON_FAILURE        "survivors" (--on-failure survivors): a worker whose collective
//                            fails keeps its process and waits for the next generation, which
//                            its launcher announces on the coordination service under
//                            dtrain/<run>/launch/g<gen>/next/<rank> (survivor_announcement_key)
//                            as JSON {"generation", "restore", "source", "state_root"}
//   DTRAIN_SNAPSHOT_BROADCAST_ROOT  a newcomer (a restarted worker or a spare) of a survivors
//                            recovery: the surviving rank that broadcasts the agreed snapshot over
//                            the new generation's collectives (DTRAIN_SNAPSHOT_RESTORE, this
//                            rank's copy in the launcher's memory, is the fallback)
// A snapshot is a TensorFlow-format checkpoint over the very objects a backup tracks (so it
// restores exactly what a backup restores), written by SnapshotSlots (snapshot_slots.h): the
// training thread copies the values straight into a reused, pre-mapped tmpfs file (the copy is
// isolated from later updates, and is the only pass over the state); then the small index is
// written and the snapshot committed in the directory's state file, which is what tells the
// launcher that a snapshot is complete (by a thread beside training where a CPU is free for it,
// else on the training thread: spare_cpu_for_commits). Private to src/train; used by
// BackupAndRestore only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"

namespace dtrain::distribute {
class KeyValueStore;
class Collectives;
}  // namespace dtrain::distribute

namespace dtrain::train {

class BackupAndRestore;
class SnapshotSlots;
class TrainingState;

inline constexpr const char* kEnvSnapshotDir = "DTRAIN_SNAPSHOT_DIR";
inline constexpr const char* kEnvSnapshotEvery = "DTRAIN_SNAPSHOT_EVERY";
inline constexpr const char* kEnvSnapshotRestore = "DTRAIN_SNAPSHOT_RESTORE";
inline constexpr const char* kEnvSnapshotSource = "DTRAIN_SNAPSHOT_SOURCE";
inline constexpr const char* kEnvOnFailure = "DTRAIN_ON_FAILURE";
inline constexpr const char* kEnvSnapshotBroadcastRoot = "DTRAIN_SNAPSHOT_BROADCAST_ROOT";
// "journal": a snapshot is whole once its slot's trailer is (snapshot_journal.h), and its files
// are made only when asked for (SnapshotSlotsOptions::journal); `dtrain launch` sets it (its
// agent reads the trailers). Anything else: files at every snapshot.
inline constexpr const char* kEnvSnapshotCommit = "DTRAIN_SNAPSHOT_COMMIT";
// The snapshots each worker keeps (SnapshotSlotsOptions::max_to_keep): the launchers agree on
// the newest step that every rank holds, and the replication to the neighbour may trail the
// other workers by a few snapshots.
inline constexpr int kSnapshotsKept = 6;
// Set by a spare when its assignment arrived (train/standby.h): CLOCK_MONOTONIC seconds.
inline constexpr const char* kEnvStandbyAssignedAt = "DTRAIN_STANDBY_ASSIGNED_AT";

// Where the launcher announces the generation after `generation` to the surviving worker `rank`.
std::string survivor_announcement_key(const std::string& run_id, int64_t generation, int rank);

// What a surviving worker is told: the generation to join and the snapshot to roll back to.
struct NextGeneration {
  int64_t generation = 0;
  std::string restore;      // checkpoint prefix of the agreed snapshot (in the launcher's tmpfs)
  std::string source;       // where it came from, for the log
  int state_root = -1;      // the survivor that broadcasts the snapshot to the newcomers; -1: none
  double announced_at = 0;  // when it came (CLOCK_MONOTONIC seconds), for the phases' report
  // With a state_root: the snapshot's files as the broadcast's blob, read as the announcement
  // came, while the newcomers still start (the sender's copy to send, another survivor's buffer
  // for the broadcast); undefined when they cannot be read.
  Tensor packed;
};

class MemorySnapshots {
 public:
  // From the launcher's environment: nullptr when no launcher keeps snapshots, the schedule
  // (`every`, else DTRAIN_SNAPSHOT_EVERY) is 0, or another MemorySnapshots of this process
  // holds the directory. Throws InvalidArgumentError for a malformed
  // DTRAIN_SNAPSHOT_EVERY or a negative `every`.
  static std::unique_ptr<MemorySnapshots> from_environment(std::optional<int64_t> every);
  MemorySnapshots(std::string dir, int64_t every);
  ~MemorySnapshots();

  // Whether a CPU is left for the snapshots' commits beside training: this process may use more
  // CPUs (usable_cpus(): its affinity mask and cgroup quota) than this node's workers
  // (DTRAIN_LOCAL_WORLD_SIZE, else 1) use, at intra_op_threads() each. begin() commits in the
  // background only then.
  static bool spare_cpu_for_commits();
  // Tracks `children` (BackupAndRestore's object graph) with a Checkpoint whose snapshots
  // SnapshotSlots writes, keeping the newest 6 in the directory.
  void begin(std::vector<std::pair<std::string, checkpoint::Trackable>> children);
  // Restores the agreed snapshot (DTRAIN_SNAPSHOT_RESTORE) into `ckpt` and returns its prefix;
  // nullopt when there is none (the backups on disk are next), or when this process restored
  // it already (a second fit() continues from its own state). Throws DataLossError naming the
  // snapshot when it cannot be restored (never falls back silently: the other workers resume
  // from the same step).
  std::optional<std::string> restore_agreed(checkpoint::Checkpoint& ckpt);
  // Makes the files of the snapshots that only their slots' trailers hold (journal commits): a
  // survivor, before its launcher names the snapshot to roll back to. Reports a failure on
  // stderr (that snapshot is then dropped, and the launchers agree on another).
  void materialize();
  // Whether this worker survives its peers' failures: it runs under `dtrain launch --on-failure
  // survivors` (DTRAIN_ON_FAILURE) with a coordination service.
  static bool survives_failures();
  // A survivor whose collectives of generation `generation` failed: waits (up to `timeout`) for
  // its launcher to announce the next generation to this rank, on `service` when it is a client
  // of the launcher's coordination service (the strategy's, already connected), else on a client
  // of its own. Throws DeadlineExceededError when none came (the launcher restarts every worker
  // instead, and stops this one meanwhile), UnavailableError when the service cannot be reached,
  // DataLossError for a malformed value.
  static NextGeneration await_next_generation(
      int64_t generation, distribute::KeyValueStore* service = nullptr,
      std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Rolls this process back to snapshot `prefix` (a survivor joining the next generation):
  // restores `prefix` into `ckpt` (after the snapshot commit in flight, if any, is done) and
  // continues the schedule from its step, rewriting the later steps' snapshots. Throws
  // DataLossError naming the snapshot when it cannot be restored.
  void roll_back(checkpoint::Checkpoint& ckpt, const NextGeneration& next);
  // A survivor after roll_back() (and the seed agreement a fresh fit() runs first): takes part in
  // the broadcast of the agreed snapshot to the newcomers of the generation (as the root when
  // the announcement names this rank). No-op when the announcement names no root. Throws the
  // collective's errors (a peer failed again: the caller waits for the next generation).
  void share_state(distribute::Collectives& collectives);
  // A newcomer (DTRAIN_SNAPSHOT_BROADCAST_ROOT set): receives the agreed snapshot from the
  // surviving root over `collectives` and restores it into `ckpt`; this rank's own parts (the
  // epoch's partial metric sums, rank-specific unless `rank_independent`) are then read from
  // this rank's copy in the launcher's memory. Reports the source to the launcher
  // (snapshot_restore/<gen>/<rank>). Falls back to restore_agreed() when the root could not
  // read its copy. Returns the restored prefix, or nullopt as restore_agreed(). Throws
  // DataLossError naming the snapshot when it cannot be restored, and the collective's errors.
  std::optional<std::string> receive_state(checkpoint::Checkpoint& ckpt,
                                           distribute::Collectives& collectives,
                                           bool rank_independent);
  // The survivor that broadcasts the state to this newcomer, when the launcher named one.
  static std::optional<int> broadcast_root();
  // After a step: at a snapshot step, captures `backups`' state and hands it to the writer.
  void after_step(BackupAndRestore& backups, TrainingState& ts);
  // Releases the directory (the snapshots stay for the launcher) and reports on stderr what the
  // snapshots cost the training thread ("... took X ms each on the training thread: Y% of the Z
  // s since the first step").
  void end();

 private:
  // Waits for the snapshot commit in flight; reports its error on stderr.
  void flush_commits();

  std::string dir_;
  int64_t every_;
  int64_t last_ = -1;  // the newest global step snapshotted
  std::unique_ptr<checkpoint::Checkpoint> ckpt_;
  std::unique_ptr<SnapshotSlots> slots_;
  std::optional<checkpoint::Trackable> metric_states_;  // the rank's own part of a snapshot
  std::optional<NextGeneration> to_share_;  // a survivor's announcement, until share_state()
  std::optional<nlohmann::json> report_;    // a newcomer's snapshot_restore report, until sent
  // end()'s report: snapshots taken, their seconds on the training thread, the first step's time
  // (CLOCK_MONOTONIC seconds; 0: none yet).
  int64_t snapshots_taken_ = 0;
  double snapshot_seconds_ = 0;
  double first_step_at_ = 0;
};

}  // namespace dtrain::train
