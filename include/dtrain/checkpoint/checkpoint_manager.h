// CheckpointManager: numbered checkpoints in one directory with retention, like
// tf.train.CheckpointManager: save() writes `<directory>/<checkpoint_name>-<N>`, commits it in
// the `checkpoint` state file, and only then deletes checkpoints beyond max_to_keep (keeping
// one every keep_checkpoint_every_n_hours). restore_or_initialize() restores the newest valid
// committed checkpoint, falling back past corrupt ones. Not thread-safe (one thread calls it);
// with an async Checkpoint, the commits and the deletions run on the checkpoint's writer
// threads, one at a time and in save order.
//
// A manager never trusts its state file with deletions or with where to resume: it holds an
// exclusive lock on its directory (`<directory>/.dtrain.lock`, released by the kernel when the
// process dies) for its lifetime, so two jobs cannot write one directory; retention deletes only
// files named `<checkpoint_name>-<N>.*` that are regular files directly in its directory; and a
// state file that is missing, empty, malformed or names no existing checkpoint of the directory
// is replaced by a directory scan (docs/checkpoints.md, "Damaged state files").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"

namespace dtrain::checkpoint {

struct CheckpointManagerOptions {
  std::optional<int> max_to_keep = 5;               // checkpoints kept; nullopt keeps all
  double keep_checkpoint_every_n_hours = 0;         // > 0: also keep one checkpoint per this period
  std::string checkpoint_name = "ckpt";             // file prefix inside the directory
  std::function<int64_t()> step_counter = nullptr;  // the training step, for checkpoint_interval
  int64_t checkpoint_interval = 0;          // > 0: save() skips until this many steps passed
                                            // since the last save (needs step_counter)
  std::function<void()> init_fn = nullptr;  // restore_or_initialize() calls it when there is
                                            // no checkpoint yet
  // The data and index files of checkpoints that retention drops are renamed to temporary names
  // and overwritten by the next saves instead of being deleted while new ones are created: on
  // filesystems where file creation and deletion cost more than the writes (ext4 without a
  // journal) per-step saving gets much faster. A dtrain restore that was reading a dropped
  // checkpoint notices and retries with the newest one. false: delete, as TF does, e.g. when
  // programs other than dtrain read the checkpoints while training runs.
  bool recycle_files = true;
};

namespace detail {
class DirectoryLock;
}

class CheckpointManager {
 public:
  // Creates `directory` if needed, takes its lock, and recovers the checkpoints its state file
  // lists (so retention continues across restarts); when the state file is damaged (missing,
  // empty, malformed, or naming no existing checkpoint inside the directory), the newest
  // max_to_keep complete `<checkpoint_name>-<N>` checkpoints found in the directory instead.
  // Removes temporary files that crashed writers left behind. Throws InvalidArgumentError for
  // bad options (checkpoint_name must be a plain file name), FailedPreconditionError naming the
  // directory and the holder's pid when another manager (in any process) holds the directory,
  // file errors naming the path.
  CheckpointManager(Checkpoint& checkpoint, std::string directory,
                    CheckpointManagerOptions options = {});
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;
  ~CheckpointManager();

  // Writes a checkpoint numbered `checkpoint_number` (default: the checkpoint's save_counter,
  // incremented first), commits it, then deletes what retention no longer keeps. Returns its
  // prefix, or nullopt when checkpoint_interval says it is too early (with check_interval).
  // Sync: blocks until committed. Async: returns after snapshotting (blocking only while the
  // checkpoint's max_in_flight saves are pending, or for all of them when it overwrites a
  // tracked or pending checkpoint); commit and deletion happen on a writer thread, in save
  // order, only after every earlier save is committed. Throws like Checkpoint::save (a detected
  // earlier async error included, once); the previous checkpoints stay intact and committed.
  std::optional<std::string> save(std::optional<int64_t> checkpoint_number = std::nullopt,
                                  bool check_interval = true);
  // The newest committed checkpoint, or nullopt.
  std::optional<std::string> latest_checkpoint() const;
  // The checkpoints the manager keeps, oldest first.
  std::vector<std::string> checkpoints() const;
  // Restores the newest valid checkpoint of the directory (restore_newest_checkpoint below:
  // the committed ones, or a directory scan when the state file is damaged, corrupt ones
  // skipped with one warning line) and returns its prefix; with none, calls init_fn (if any)
  // and returns nullopt. Throws like Checkpoint::restore_latest.
  std::optional<std::string> restore_or_initialize();
  // Waits for every pending async save and rethrows the first error (once).
  void sync();

  const std::string& directory() const { return directory_; }
  Checkpoint& checkpoint() { return checkpoint_; }

 private:
  // Commits `paths` (written, oldest first) with one state-file write, then deletes what
  // retention no longer keeps. Runs on the committing thread.
  void on_written(const std::vector<std::string>& paths, double timestamp);
  // Writes the state file listing `kept` (oldest first) with `latest` as the newest.
  void write_state(const std::vector<std::pair<std::string, double>>& kept,
                   const std::optional<std::string>& latest, double last_preserved_timestamp) const;
  // Deletes (or, with recycle_files, keeps as spares) the files of checkpoint `prefix`, index
  // first.
  void drop_checkpoint_files(const std::string& prefix);
  // Drops what retention no longer keeps from `kept`; returns the paths to delete.
  std::vector<std::string> sweep(std::vector<std::pair<std::string, double>>& kept,
                                 double& last_preserved_timestamp) const;

  // Whether retention may delete the files of `prefix`: `<directory>/<checkpoint_name>-<N>`.
  bool owns(const std::string& prefix) const;

  Checkpoint& checkpoint_;
  std::string directory_;
  std::string prefix_;
  CheckpointManagerOptions options_;
  std::unique_ptr<detail::DirectoryLock> lock_;  // released last
  // What was wrong with the state file when the manager started, until a warning said so
  // (restore_or_initialize or the first save).
  std::string state_problem_;
  mutable std::mutex mu_;  // guards the fields below (the committing thread updates them)
  std::vector<std::pair<std::string, double>> maybe_delete_;  // path, timestamp; oldest first
  std::optional<std::string> latest_;
  double last_preserved_timestamp_ = 0;
  std::optional<int64_t> last_checkpoint_step_;
  std::unique_ptr<detail::SpareFiles> spares_;  // recycle_files only
};

// Restores the newest valid checkpoint of a CheckpointManager's directory, without its lock
// (readers, such as the non-chief workers of a job, call it while the chief's manager writes):
// with a sound state file, Checkpoint::restore_latest (the committed checkpoints, newest first,
// then, should all of them be corrupt, older `<checkpoint_name>-<N>` ones the file no longer
// lists). When the state file is missing, empty, malformed, or names no existing checkpoint
// inside `directory` (entries outside it are ignored), the complete `<checkpoint_name>-<N>`
// checkpoints found in `directory`, largest N first, each verified by restore(); one warning
// line names the damaged state file and the checkpoint restored. nullopt when there is none.
// Throws DataLossError when every candidate is corrupt, and restore()'s other errors.
std::optional<CheckpointLoadStatus> restore_newest_checkpoint(
    Checkpoint& checkpoint, const std::string& directory,
    const std::string& checkpoint_name = "ckpt");

}  // namespace dtrain::checkpoint
