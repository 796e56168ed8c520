// MemorySnapshots: BackupAndRestore's state, every few steps, into the memory of the launcher
// that started this worker (`dtrain launch`, src/fault/snapshots.h). The launcher passes
//   DTRAIN_SNAPSHOT_DIR      a directory on tmpfs (/dev/shm) that the launcher owns and keeps
//                            when the worker dies: this worker's snapshots go there
//   DTRAIN_SNAPSHOT_EVERY    the schedule, in steps (--snapshot-every), when fit() names none
//   DTRAIN_SNAPSHOT_RESTORE  after a failure: the snapshot (a checkpoint prefix in its memory)
//                            that the launchers agreed every member holds, to resume from
// A snapshot is a TensorFlow-format checkpoint over the very objects a backup tracks (so it
// restores exactly what a backup restores), written through an async Checkpoint: the training
// thread copies the values (the copy is isolated from later updates) and a writer thread writes
// them to tmpfs and commits them in the directory's state file, which is what tells the launcher
// that a snapshot is complete. Private to src/train; used by BackupAndRestore only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/checkpoint_manager.h"

namespace dtrain::train {

class BackupAndRestore;
class TrainingState;

inline constexpr const char* kEnvSnapshotDir = "DTRAIN_SNAPSHOT_DIR";
inline constexpr const char* kEnvSnapshotEvery = "DTRAIN_SNAPSHOT_EVERY";
inline constexpr const char* kEnvSnapshotRestore = "DTRAIN_SNAPSHOT_RESTORE";
inline constexpr const char* kEnvSnapshotSource = "DTRAIN_SNAPSHOT_SOURCE";

class MemorySnapshots {
 public:
  // From the launcher's environment: nullptr when no launcher keeps snapshots, the schedule
  // (`every`, else DTRAIN_SNAPSHOT_EVERY) is 0, or another MemorySnapshots of this process
  // holds the directory. Throws InvalidArgumentError for a malformed
  // DTRAIN_SNAPSHOT_EVERY or a negative `every`.
  static std::unique_ptr<MemorySnapshots> from_environment(std::optional<int64_t> every);
  MemorySnapshots(std::string dir, int64_t every);
  ~MemorySnapshots();

  // Tracks `children` (BackupAndRestore's object graph) with an async Checkpoint whose manager
  // keeps the newest 6 snapshots in the directory.
  void begin(std::vector<std::pair<std::string, checkpoint::Trackable>> children);
  // Restores the agreed snapshot (DTRAIN_SNAPSHOT_RESTORE) into `ckpt` and returns its prefix;
  // nullopt when there is none (the backups on disk are next), or when this process restored
  // it already (a second fit() continues from its own state). Throws DataLossError naming the
  // snapshot when it cannot be restored (never falls back silently: the other workers resume
  // from the same step).
  std::optional<std::string> restore_agreed(checkpoint::Checkpoint& ckpt);
  // After a step: at a snapshot step, captures `backups`' state and hands it to the writer.
  void after_step(BackupAndRestore& backups, TrainingState& ts);
  // Waits for the pending writes (errors are warned about: a snapshot never stops training).
  void end();

 private:
  std::string dir_;
  int64_t every_;
  int64_t last_ = -1;  // the newest global step snapshotted
  std::unique_ptr<checkpoint::Checkpoint> ckpt_;
  std::unique_ptr<checkpoint::CheckpointManager> manager_;
};

}  // namespace dtrain::train
