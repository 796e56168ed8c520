// CheckpointManager, following tensorflow/python/checkpoint/checkpoint_management.py.
#include "dtrain/checkpoint/checkpoint_manager.h"

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "checkpoint_state.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::checkpoint {

namespace fs = std::filesystem;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool same_path(const std::string& a, const std::string& b) {
  return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
}

// Deletes a checkpoint's index first (which makes it disappear), then its data shards.
void remove_checkpoint_files(const std::string& prefix) {
  std::error_code ec;
  fs::remove(index_filename(prefix), ec);
  const fs::path p(prefix);
  const std::string stem = p.filename().string() + ".data-";
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, stem.size(), stem) == 0 && name.find(".tmp.") == std::string::npos) {
      fs::remove(e.path(), ec);
    }
  }
}

// Removes "<name>.tmp.<pid>.<random>" files (AtomicFile's) of processes that no longer run.
void remove_stale_temporaries(const std::string& dir, const std::string& checkpoint_name) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t tmp = name.find(".tmp.");
    if (tmp == std::string::npos) continue;
    if (name.compare(0, checkpoint_name.size() + 1, checkpoint_name + "-") != 0 &&
        name.compare(0, tmp, std::string(kStateFilename)) != 0) {
      continue;
    }
    const long pid = std::strtol(name.c_str() + tmp + 5, nullptr, 10);
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) {
      fs::remove(e.path(), ec);
    }
  }
}

}  // namespace

CheckpointManager::CheckpointManager(Checkpoint& checkpoint, std::string directory,
                                     CheckpointManagerOptions options)
    : checkpoint_(checkpoint), directory_(std::move(directory)), options_(std::move(options)) {
  DTRAIN_CHECK(!directory_.empty(), "CheckpointManager: empty directory");
  DTRAIN_CHECK(!options_.checkpoint_name.empty(), "CheckpointManager: empty checkpoint_name");
  DTRAIN_CHECK(!options_.max_to_keep || *options_.max_to_keep > 0,
               "CheckpointManager: max_to_keep must be positive or nullopt (keep all), got ",
               options_.max_to_keep.value_or(0));
  DTRAIN_CHECK(options_.checkpoint_interval <= 0 || options_.step_counter,
               "CheckpointManager: checkpoint_interval needs a step_counter");
  prefix_ = join_path(directory_, options_.checkpoint_name);
  std::error_code ec;
  fs::create_directories(directory_, ec);
  if (ec) throw_file_error(ec.value(), "create directory", directory_);
  remove_stale_temporaries(directory_, options_.checkpoint_name);

  const double now = unix_now();
  last_preserved_timestamp_ = now;
  if (const std::optional<CheckpointState> st = read_checkpoint_state(directory_)) {
    const auto& paths = st->all_model_checkpoint_paths;
    const auto& times = st->all_model_checkpoint_timestamps;
    for (size_t i = 0; i < paths.size(); ++i) {
      maybe_delete_.emplace_back(paths[i], i < times.size() ? times[i] : now);
    }
    if (!st->model_checkpoint_path.empty()) latest_ = st->model_checkpoint_path;
    if (st->last_preserved_timestamp && *st->last_preserved_timestamp <= now) {
      last_preserved_timestamp_ = *st->last_preserved_timestamp;
    }
  }
}

CheckpointManager::~CheckpointManager() {
  // The writer thread may still call on_written(): wait for it while this object exists.
  try {
    checkpoint_.sync();
  } catch (const std::exception& e) {
    warn(str_cat("CheckpointManager(", directory_, "): an asynchronous save failed: ", e.what()));
  }
}

void CheckpointManager::record_state() {
  CheckpointState st;
  for (const auto& [path, ts] : maybe_delete_) {
    st.all_model_checkpoint_paths.push_back(path);
    st.all_model_checkpoint_timestamps.push_back(ts);
  }
  st.model_checkpoint_path = latest_.value_or("");
  st.last_preserved_timestamp = last_preserved_timestamp_;
  write_checkpoint_state(directory_, st, checkpoint_.options().sync_to_disk);
}

std::vector<std::string> CheckpointManager::sweep() {
  std::vector<std::string> doomed;
  if (!options_.max_to_keep) return doomed;
  while (maybe_delete_.size() > static_cast<size_t>(*options_.max_to_keep)) {
    const auto [path, ts] = maybe_delete_.front();
    maybe_delete_.erase(maybe_delete_.begin());
    if (options_.keep_checkpoint_every_n_hours > 0 &&
        ts - last_preserved_timestamp_ >= options_.keep_checkpoint_every_n_hours * 3600.0) {
      last_preserved_timestamp_ = ts;  // preserved: no longer managed, never deleted
      continue;
    }
    doomed.push_back(path);
  }
  return doomed;
}

void CheckpointManager::on_written(const std::string& path, double timestamp) {
  std::lock_guard<std::mutex> lock(mu_);
  maybe_delete_.emplace_back(path, timestamp);
  latest_ = path;
  // One state-file write commits the new checkpoint (already durable) and drops the ones
  // retention no longer keeps; their files are deleted only afterwards. (TF writes the state
  // file twice, before and after deleting; this saves two fsyncs per save.)
  const std::vector<std::string> doomed = sweep();
  record_state();
  for (const std::string& p : doomed) remove_checkpoint_files(p);
}

std::optional<std::string> CheckpointManager::save(std::optional<int64_t> checkpoint_number,
                                                   bool check_interval) {
  checkpoint_.sync();  // a previous async save's error surfaces here
  std::optional<int64_t> step;
  if (options_.step_counter && options_.checkpoint_interval > 0) {
    step = options_.step_counter();
    std::lock_guard<std::mutex> lock(mu_);
    if (check_interval && last_checkpoint_step_ &&
        *step < *last_checkpoint_step_ + options_.checkpoint_interval) {
      return std::nullopt;
    }
  }
  Variable& counter = checkpoint_.save_counter_;
  checkpoint_.save_counter_tracked_ = true;
  const int64_t n = ++counter.tensor().data<int64_t>()[0];
  const std::string path = str_cat(prefix_, "-", checkpoint_number.value_or(n));
  {
    // Overwriting a checkpoint we track (e.g. after restoring an older one): uncommit it first,
    // so that a crash mid-write never leaves the state file naming a torn checkpoint.
    std::lock_guard<std::mutex> lock(mu_);
    bool tracked = false;
    for (auto it = maybe_delete_.begin(); it != maybe_delete_.end();) {
      if (same_path(it->first, path)) {
        it = maybe_delete_.erase(it);
        tracked = true;
      } else {
        ++it;
      }
    }
    if (latest_ && same_path(*latest_, path)) {
      latest_ = maybe_delete_.empty() ? std::nullopt
                                      : std::optional<std::string>(maybe_delete_.back().first);
      tracked = true;
    }
    if (tracked) record_state();
    if (step) last_checkpoint_step_ = step;
  }
  checkpoint_.write_internal(path, [this](const std::string& p) { on_written(p, unix_now()); });
  return path;
}

std::optional<std::string> CheckpointManager::latest_checkpoint() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

std::vector<std::string> CheckpointManager::checkpoints() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [path, ts] : maybe_delete_) out.push_back(path);
  return out;
}

std::optional<std::string> CheckpointManager::restore_or_initialize() {
  std::optional<CheckpointLoadStatus> status = checkpoint_.restore_latest(directory_);
  if (!status) {
    if (options_.init_fn) options_.init_fn();
    return std::nullopt;
  }
  if (options_.step_counter && options_.checkpoint_interval > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    last_checkpoint_step_ = options_.step_counter();
  }
  return status->save_path();
}

void CheckpointManager::sync() { checkpoint_.sync(); }

}  // namespace dtrain::checkpoint
