// CheckpointManager, following tensorflow/python/checkpoint/checkpoint_management.py.
#include "dtrain/checkpoint/checkpoint_manager.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <utility>
#include <vector>

#include "checkpoint_scan.h"
#include "checkpoint_state.h"
#include "directory_lock.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "spare_files.h"

namespace dtrain::checkpoint {

namespace fs = std::filesystem;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool same_path(const std::string& a, const std::string& b) {
  return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
}

// Deletes a checkpoint's index first (which makes it disappear), then its data shards; only
// regular files (a symlink or directory under a checkpoint's name is not something we wrote).
void remove_checkpoint_files(const std::string& prefix) {
  std::error_code ec;
  if (detail::is_regular_file(index_filename(prefix))) fs::remove(index_filename(prefix), ec);
  const fs::path p(prefix);
  const std::string stem = p.filename().string() + ".data-";
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, stem.size(), stem) == 0 && name.find(".tmp.") == std::string::npos &&
        detail::is_regular_file(e.path().string())) {
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
  DTRAIN_CHECK(options_.checkpoint_name.find('/') == std::string::npos &&
                   options_.checkpoint_name != "." && options_.checkpoint_name != "..",
               "CheckpointManager: checkpoint_name must be a file name inside the directory, got '",
               options_.checkpoint_name, "'");
  DTRAIN_CHECK(!options_.max_to_keep || *options_.max_to_keep > 0,
               "CheckpointManager: max_to_keep must be positive or nullopt (keep all), got ",
               options_.max_to_keep.value_or(0));
  DTRAIN_CHECK(options_.checkpoint_interval <= 0 || options_.step_counter,
               "CheckpointManager: checkpoint_interval needs a step_counter");
  prefix_ = join_path(directory_, options_.checkpoint_name);
  std::error_code ec;
  fs::create_directories(directory_, ec);
  if (ec) throw_file_error(ec.value(), "create directory", directory_);
  lock_ = std::make_unique<detail::DirectoryLock>(directory_);
  remove_stale_temporaries(directory_, options_.checkpoint_name);
  // Enough spares for the saves that can be written at once, plus the ones committing.
  if (options_.recycle_files) {
    spares_ = std::make_unique<detail::SpareFiles>(
        static_cast<size_t>(checkpoint_.options().max_in_flight) + 2);
  }

  const double now = unix_now();
  last_preserved_timestamp_ = now;
  const detail::StateFileCheck check = detail::check_state_file(directory_);
  if (check.problem.empty()) {
    const CheckpointState& st = *check.state;
    const auto& paths = st.all_model_checkpoint_paths;
    const auto& times = st.all_model_checkpoint_timestamps;
    for (size_t i = 0; i < paths.size(); ++i) {
      maybe_delete_.emplace_back(paths[i], i < times.size() ? times[i] : now);
    }
    if (!st.model_checkpoint_path.empty()) latest_ = st.model_checkpoint_path;
    if (st.last_preserved_timestamp && *st.last_preserved_timestamp <= now) {
      last_preserved_timestamp_ = *st.last_preserved_timestamp;
    }
    return;
  }
  // A damaged state file: track what the directory holds instead, as if the file listed the
  // newest max_to_keep of them (older ones are left alone, like preserved checkpoints), so that
  // retention continues and the next save writes a state file naming them again.
  std::vector<detail::FoundCheckpoint> found =
      detail::scan_checkpoints(directory_, options_.checkpoint_name);
  if (options_.max_to_keep && found.size() > static_cast<size_t>(*options_.max_to_keep)) {
    found.resize(static_cast<size_t>(*options_.max_to_keep));
  }
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    maybe_delete_.emplace_back(it->prefix, std::min(it->mtime, now));
  }
  if (!found.empty()) latest_ = found.front().prefix;
  if (!check.missing || !found.empty()) {
    state_problem_ = str_cat("checkpoint state file ", check.path, " ", check.problem);
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

void CheckpointManager::write_state(const std::vector<std::pair<std::string, double>>& kept,
                                    const std::optional<std::string>& latest,
                                    double last_preserved_timestamp) const {
  CheckpointState st;
  for (const auto& [path, ts] : kept) {
    st.all_model_checkpoint_paths.push_back(path);
    st.all_model_checkpoint_timestamps.push_back(ts);
  }
  st.model_checkpoint_path = latest.value_or("");
  st.last_preserved_timestamp = last_preserved_timestamp;
  write_checkpoint_state(directory_, st, checkpoint_.options().sync_to_disk);
}

bool CheckpointManager::owns(const std::string& prefix) const {
  return detail::own_checkpoint_number(directory_, options_.checkpoint_name, prefix).has_value();
}

void CheckpointManager::drop_checkpoint_files(const std::string& prefix) {
  if (!owns(prefix)) {
    warn(str_cat("CheckpointManager(", directory_, "): retention leaves ", prefix,
                 " alone: it is not a ", options_.checkpoint_name, "-<N> checkpoint of ",
                 directory_, " (only those are ever deleted)"));
    return;
  }
  if (spares_ && detail::is_regular_file(index_filename(prefix)) &&
      detail::is_regular_file(data_filename(prefix, 0, 1))) {
    spares_->retire(detail::SpareFiles::kIndex, index_filename(prefix));
    // Checkpoints written by dtrain have one data shard; others fall through to the scan.
    if (spares_->retire(detail::SpareFiles::kData, data_filename(prefix, 0, 1))) return;
  }
  remove_checkpoint_files(prefix);
}

std::vector<std::string> CheckpointManager::sweep(std::vector<std::pair<std::string, double>>& kept,
                                                  double& last_preserved_timestamp) const {
  std::vector<std::string> doomed;
  if (!options_.max_to_keep) return doomed;
  while (kept.size() > static_cast<size_t>(*options_.max_to_keep)) {
    const auto [path, ts] = kept.front();
    kept.erase(kept.begin());
    if (options_.keep_checkpoint_every_n_hours > 0 &&
        ts - last_preserved_timestamp >= options_.keep_checkpoint_every_n_hours * 3600.0) {
      last_preserved_timestamp = ts;  // preserved: no longer managed, never deleted
      continue;
    }
    doomed.push_back(path);
  }
  return doomed;
}

void CheckpointManager::on_written(const std::vector<std::string>& paths, double timestamp) {
  // Runs on the committing thread, one call at a time, while save() changes nothing that is
  // written here (it waits for the pending saves before it rewrites the state file itself). mu_
  // is held only to copy and publish, never across file operations, so that save() does not
  // wait for an fsync.
  std::vector<std::pair<std::string, double>> kept;
  double last_preserved;
  {
    std::lock_guard<std::mutex> lock(mu_);
    kept = maybe_delete_;
    last_preserved = last_preserved_timestamp_;
  }
  for (const std::string& p : paths) kept.emplace_back(p, timestamp);
  // One state-file write commits the new checkpoints (already durable) and drops the ones
  // retention no longer keeps; their files are deleted only afterwards. (TF writes the state
  // file twice per save, before and after deleting; with several saves written concurrently,
  // one write commits them all.)
  const std::vector<std::string> doomed = sweep(kept, last_preserved);
  write_state(kept, paths.back(), last_preserved);
  {
    std::lock_guard<std::mutex> lock(mu_);
    maybe_delete_ = std::move(kept);
    latest_ = paths.back();
    last_preserved_timestamp_ = last_preserved;
  }
  for (const std::string& p : doomed) drop_checkpoint_files(p);
}

std::optional<std::string> CheckpointManager::save(std::optional<int64_t> checkpoint_number,
                                                   bool check_interval) {
  checkpoint_.reserve_slot();  // a previous async save's error surfaces here
  if (!state_problem_.empty()) {
    warn(str_cat(std::exchange(state_problem_, {}), "; rewriting it with the next save, listing ",
                 checkpoints().size(), " checkpoint(s) found in ", directory_));
  }
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
  const int64_t n = counter.tensor().data<int64_t>()[0] + 1;
  const std::string path = str_cat(prefix_, "-", checkpoint_number.value_or(n));
  auto tracks = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    if (latest_ && same_path(*latest_, path)) return true;
    for (const auto& [p, ts] : maybe_delete_) {
      if (same_path(p, path)) return true;
    }
    return false;
  };
  // (writing() first: once no pending save writes `path`, no commit can start tracking it.)
  if (checkpoint_.writing(path) || tracks()) {
    // Overwriting a checkpoint we track (e.g. after restoring an older one): once nothing else
    // commits, uncommit it first, so that a crash mid-write never leaves the state file naming
    // a torn checkpoint.
    checkpoint_.wait_for_write();
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(maybe_delete_, [&](const auto& e) { return same_path(e.first, path); });
    if (latest_ && same_path(*latest_, path)) {
      latest_ = maybe_delete_.empty() ? std::nullopt
                                      : std::optional<std::string>(maybe_delete_.back().first);
    }
    write_state(maybe_delete_, latest_, last_preserved_timestamp_);
  }
  if (step) {
    std::lock_guard<std::mutex> lock(mu_);
    last_checkpoint_step_ = step;
  }
  checkpoint_.save_counter_tracked_ = true;
  counter.tensor().data<int64_t>()[0] = n;
  checkpoint_.write_internal(
      path, str_cat("manager:", static_cast<const void*>(this)),
      [this](const std::vector<std::string>& paths) { on_written(paths, unix_now()); },
      spares_.get());
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
  state_problem_.clear();  // restore_newest_checkpoint says what is wrong with the state file
  std::optional<CheckpointLoadStatus> status =
      restore_newest_checkpoint(checkpoint_, directory_, options_.checkpoint_name);
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
