// BackupAndRestore (keras.callbacks.BackupAndRestore), exact: fit() backs up its whole state to
// a checkpoint directory — weights, optimizer slots and iteration count, epoch, step within the
// epoch, data-iterator position and shuffle seed, Dropout RNG states, and the epoch's partial
// metric sums — and a fit() that starts with a backup present resumes exactly where the backup
// was taken, mid-epoch included. In deterministic mode a run interrupted at any point and
// resumed ends with the same weights, bit for bit, as an uninterrupted run (Keras restarts the
// epoch's data instead). Backups are TensorFlow-format checkpoints written through a
// CheckpointManager: crash-safe, CRC-checked, and a corrupt newest backup falls back to the one
// before. Used from the thread that calls fit().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dtrain/train/callbacks.h"

namespace dtrain::checkpoint {
class Checkpoint;
class CheckpointManager;
}  // namespace dtrain::checkpoint

namespace dtrain::train {

struct BackupAndRestoreOptions {
  int64_t save_freq = 0;          // back up every this many steps; 0: at the end of each epoch
  bool delete_checkpoint = true;  // remove the backups when training finishes
  int max_to_keep = 2;            // backups kept (older ones are deleted after a newer commits)
  bool enable_async = false;      // write backups on a background thread (snapshot first)
  bool restore = true;            // resume from the newest backup when fit() starts
  // In-memory snapshots under `dtrain launch` (docs/fault-tolerance.md, "State from memory"):
  // every this many steps the same state goes to the launcher's memory (tmpfs it owns, off the
  // training thread), and a restarted fit() resumes from the snapshot the launchers agreed on
  // before reading any backup. nullopt: the launcher's --snapshot-every (DTRAIN_SNAPSHOT_EVERY);
  // 0: none. Without a launcher that keeps snapshots, none are taken.
  std::optional<int64_t> snapshot_every = std::nullopt;
  // Under a strategy with several workers (MultiWorkerMirroredStrategy): every worker writes its
  // rows of the trainable variables and their slots as its own data shard of each backup and
  // the chief the rest and the merged index (docs/checkpoints.md, "Sharded checkpoints"); the
  // backups restore on any number of workers. Under `dtrain launch` with several nodes each
  // host's workers write a whole sharded backup into their host's directory, the host's first
  // worker the rest and the index (docs/fault-tolerance.md, "No shared filesystem"). Sharded backups are written synchronously (the
  // all-gathers run on the training thread), whatever enable_async says.
  bool sharded = false;
};

class MemorySnapshots;
class TrainingState;

class BackupAndRestore : public Callback {
 public:
  // `backup_dir` is created if needed. Nothing is read or written until fit() starts.
  explicit BackupAndRestore(std::string backup_dir, BackupAndRestoreOptions options = {});
  ~BackupAndRestore() override;

  void on_train_begin(const Logs& logs) override;
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
  void on_epoch_end(int64_t epoch, const Logs& logs) override;
  void on_train_end(const Logs& logs) override;
  // Hands the restored state of fit()'s other callbacks (Callback::state) back to them.
  void on_train_resumed(int64_t epoch, int64_t step_in_epoch, const std::string& from) override;
  // Backs up and waits for the commit (preemption: the process exits next).
  void on_preemption(int64_t epoch, int64_t step_in_epoch) override;
  // Restores the model and optimizer (not the data position) from the newest backup.
  bool restore_last_good() override;
  // Under `dtrain launch --on-failure survivors`, after the collectives of fit() failed (a peer
  // died): waits for the launcher's next generation, re-creates the strategy's collectives in
  // this process, rolls the whole state back to the snapshot every member holds and hands the
  // loop that position. False when this worker does not survive failures (another mode, no
  // snapshots, no multi-worker strategy, or the collectives did not fail): the caller rethrows.
  bool rejoin_after_failure();
  // A survivor, right after rejoin_after_failure() and the collectives a fresh fit() runs before
  // it restores: broadcasts the agreed snapshot to the newcomers (restarted workers, spares),
  // which receive it in on_train_begin. Throws the collectives' errors.
  void share_state_after_rejoin();

  // The checkpoint restored at the start of the last fit(), if any.
  const std::optional<std::string>& restored_from() const { return restored_from_; }
  // Backs up now (also used on preemption). Blocks until committed unless enable_async. A state
  // with non-finite weights or optimizer values is never written (a warning says so).
  void backup();

 private:
  struct State;
  friend class MemorySnapshots;
  void attach();
  // Copies the loop's position, Dropout RNGs and metric sums into the tracked plain values.
  void capture();
  // After a restore into the tracked values: sets the Dropout RNGs and metric sums and hands the
  // loop the restored position.
  void resume_loop(TrainingState& ts);
  // Gives the callbacks whose state a restore read their state (Callback::set_state).
  void apply_callback_states();

  std::string dir_;
  BackupAndRestoreOptions options_;
  std::unique_ptr<State> state_;
  std::optional<std::string> restored_from_;
  int64_t steps_since_backup_ = 0;
  std::unique_ptr<MemorySnapshots> snapshots_;  // under a launcher that keeps snapshots
};

}  // namespace dtrain::train
