// MemorySnapshots: BackupAndRestore's state into the launcher's memory (memory_snapshots.h).
#include "memory_snapshots.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"
#include "dtrain/distribute/coordination.h"
#include "dtrain/distribute/launcher_env.h"
#include "dtrain/optim/optimizer.h"
#include "dtrain/train/backup_and_restore.h"
#include "fit_loop.h"
#include "training_state.h"

namespace dtrain::train {
namespace {

// One MemorySnapshots per process at a time owns DTRAIN_SNAPSHOT_DIR (a second BackupAndRestore
// in the same fit() takes none), and the agreed snapshot is restored once per process (a
// program that calls fit() again continues from its own state).
std::atomic<bool> active{false};
std::atomic<bool> restored{false};

}  // namespace

std::string survivor_announcement_key(const std::string& run_id, int64_t generation, int rank) {
  return str_cat("dtrain/", run_id, "/launch/g", generation, "/next/", rank);
}

bool MemorySnapshots::survives_failures() {
  const char* mode = std::getenv(kEnvOnFailure);
  if (mode == nullptr || std::string(mode) != "survivors") return false;
  if (!distribute::LauncherEnv::present()) return false;
  return distribute::LauncherEnv::from_environment().rdzv_is_coordinator();
}

NextGeneration MemorySnapshots::await_next_generation(int64_t generation,
                                                      std::chrono::milliseconds timeout) {
  const distribute::LauncherEnv env = distribute::LauncherEnv::from_environment();
  const std::string key = survivor_announcement_key(env.run_id, generation, env.rank);
  std::cerr << "fit: the collectives of generation " << generation
            << " failed; this worker keeps running and waits for the next generation\n";
  distribute::CoordinationClient client(
      env.rdzv, {.connect_timeout = std::chrono::seconds(10), .rpc_timeout = timeout});
  const std::string text = client.get(key, timeout);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  NextGeneration next;
  try {
    next.generation = j.at("generation").get<int64_t>();
    next.restore = j.at("restore").get<std::string>();
    next.source = j.value("source", std::string());
  } catch (const std::exception&) {
    throw DataLossError(str_cat("fit: the launcher's announcement ", key, " = '", text,
                                "' is not {\"generation\", \"restore\", \"source\"}"));
  }
  DTRAIN_CHECK(next.generation > generation && !next.restore.empty(), "fit: the launcher's ",
               "announcement ", key, " = '", text, "' names no later generation and snapshot");
  return next;
}

void MemorySnapshots::roll_back(checkpoint::Checkpoint& ckpt, const NextGeneration& next) {
  // Every write in flight lands (or fails) before the state is replaced under it.
  if (manager_) {
    try {
      manager_->sync();
    } catch (const Error& e) {
      std::cerr << "BackupAndRestore: an in-memory snapshot failed: " << e.what() << "\n";
    }
  }
  try {
    ckpt.restore(next.restore).assert_existing_objects_matched();
  } catch (const Error& e) {
    throw DataLossError(str_cat("BackupAndRestore: cannot roll back to the agreed in-memory ",
                                "snapshot ", next.restore, ": ", e.what()));
  }
  last_ = -1;
  std::cerr << "BackupAndRestore: rolled back to "
            << std::filesystem::path(next.restore).filename().string() << " from "
            << (next.source.empty() ? "the launcher's memory" : next.source)
            << " in the surviving process (no disk read); joining generation " << next.generation
            << "\n";
}

std::unique_ptr<MemorySnapshots> MemorySnapshots::from_environment(std::optional<int64_t> every) {
  DTRAIN_CHECK(!every || *every >= 0, "BackupAndRestore: snapshot_every must be >= 0, got ",
               every.value_or(0));
  const char* dir = std::getenv(kEnvSnapshotDir);
  if (dir == nullptr || *dir == '\0') return nullptr;
  if (!every) {
    const char* env = std::getenv(kEnvSnapshotEvery);
    int64_t n = 0;
    try {
      size_t used = 0;
      n = env ? std::stoll(env, &used) : 0;
      if (env && (used != std::string(env).size() || n < 0)) throw std::invalid_argument("");
    } catch (const std::exception&) {
      throw InvalidArgumentError(
          str_cat(kEnvSnapshotEvery, "='", env, "': expected a non-negative number of steps"));
    }
    every = n;
  }
  if (*every == 0 || active.exchange(true)) return nullptr;
  return std::make_unique<MemorySnapshots>(dir, *every);
}

MemorySnapshots::MemorySnapshots(std::string dir, int64_t every)
    : dir_(std::move(dir)), every_(every) {}

MemorySnapshots::~MemorySnapshots() {
  try {
    end();
  } catch (...) {
  }
  active = false;
}

void MemorySnapshots::begin(std::vector<std::pair<std::string, checkpoint::Trackable>> children) {
  // tmpfs: nothing to fsync. Two snapshots in flight at most; the third waits (the training
  // thread only waits when the writer falls two snapshots behind).
  ckpt_ = std::make_unique<checkpoint::Checkpoint>(
      std::move(children), checkpoint::CheckpointOptions{
                               .enable_async = true, .sync_to_disk = false, .max_in_flight = 2});
  // Six: the launchers agree on the newest step that every rank holds, and a worker's writer or
  // the replication to the neighbour may trail the other workers by a few snapshots.
  // Deleted, never recycled: the launcher may be reading a dropped snapshot's files (an open
  // file stays whole when it is unlinked; a recycled one would be overwritten under it).
  manager_ = std::make_unique<checkpoint::CheckpointManager>(
      *ckpt_, dir_,
      checkpoint::CheckpointManagerOptions{
          .max_to_keep = 6, .checkpoint_name = "snap", .recycle_files = false});
}

std::optional<std::string> MemorySnapshots::restore_agreed(checkpoint::Checkpoint& ckpt) {
  const char* path = std::getenv(kEnvSnapshotRestore);
  if (path == nullptr || *path == '\0' || restored.exchange(true)) return std::nullopt;
  const char* source = std::getenv(kEnvSnapshotSource);
  try {
    ckpt.restore(path).assert_existing_objects_matched();
  } catch (const Error& e) {
    throw DataLossError(str_cat("BackupAndRestore: cannot restore the agreed in-memory snapshot ",
                                path, ": ", e.what()));
  }
  std::cerr << "BackupAndRestore: restored " << std::filesystem::path(path).filename().string()
            << " from " << (source ? source : "the launcher's memory") << " (no disk read)\n";
  return std::string(path);
}

void MemorySnapshots::after_step(BackupAndRestore& backups, TrainingState& ts) {
  if (!manager_) return;
  const int64_t step = ts.optimizer->iterations();
  if (step == last_ || step % every_ != 0) return;
  last_ = step;
  ts.loop->before_checkpoint();
  backups.capture();
  // Numbered by the global step, so that every worker's snapshot of one step has one name.
  manager_->save(step, /*check_interval=*/false);
}

void MemorySnapshots::end() {
  if (!manager_) return;
  try {
    manager_->sync();
  } catch (const Error& e) {
    std::cerr << "BackupAndRestore: an in-memory snapshot failed: " << e.what() << "\n";
  }
  manager_.reset();
  ckpt_.reset();
}

}  // namespace dtrain::train
