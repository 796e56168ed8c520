// The state-file commit of Checkpoint::save (commit.h).
#include "commit.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"

namespace dtrain::checkpoint::detail {

namespace fs = std::filesystem;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

bool same_path(const std::string& a, const std::string& b) {
  return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
}

bool index_exists(const std::string& prefix) {
  std::error_code ec;
  return fs::exists(index_filename(prefix), ec);
}

std::optional<CheckpointState> read_state_or_warn(const std::string& dir) {
  try {
    return read_checkpoint_state(dir);
  } catch (const DataLossError& e) {
    warn(str_cat("ignoring a malformed checkpoint state file: ", e.what()));
    return std::nullopt;
  }
}

// Removes `path` from the directory's state file, if listed, before it is overwritten.
void uncommit(const std::string& dir, const std::string& path, bool sync) {
  std::optional<CheckpointState> st = read_state_or_warn(dir);
  if (!st) return;
  CheckpointState out;
  bool listed = same_path(st->model_checkpoint_path, path);
  const auto& paths = st->all_model_checkpoint_paths;
  const auto& times = st->all_model_checkpoint_timestamps;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (same_path(paths[i], path)) {
      listed = true;
      continue;
    }
    out.all_model_checkpoint_paths.push_back(paths[i]);
    if (i < times.size()) out.all_model_checkpoint_timestamps.push_back(times[i]);
  }
  if (!listed) return;
  if (out.all_model_checkpoint_timestamps.size() != out.all_model_checkpoint_paths.size()) {
    out.all_model_checkpoint_timestamps.clear();
  }
  if (!out.all_model_checkpoint_paths.empty())
    out.model_checkpoint_path = out.all_model_checkpoint_paths.back();
  out.last_preserved_timestamp = st->last_preserved_timestamp;
  write_checkpoint_state(dir, out, sync);
}

// Whether `dir`'s state file lists `path`.
bool listed(const std::string& dir, const std::string& path) {
  std::optional<CheckpointState> st = read_state_or_warn(dir);
  if (!st) return false;
  if (same_path(st->model_checkpoint_path, path)) return true;
  for (const std::string& p : st->all_model_checkpoint_paths) {
    if (same_path(p, path)) return true;
  }
  return false;
}

// How many checkpoints Checkpoint::save's state file lists at most (the newest ones whose files
// exist): enough for restore_latest to fall back past a few corrupt ones, while a save after
// every step of a long run neither rewrites nor checks an ever longer list.
constexpr size_t kMaxListedBySave = 10;

// Names `paths` (oldest first, all written) as the newest committed checkpoints of `dir`.
void commit(const std::string& dir, const std::vector<std::string>& paths, bool sync) {
  CheckpointState out;
  const double now = unix_now();
  auto in_paths = [&](const std::string& p) {
    return std::any_of(paths.begin(), paths.end(),
                       [&](const std::string& q) { return same_path(p, q); });
  };
  if (std::optional<CheckpointState> st = read_state_or_warn(dir)) {
    const auto& listed_paths = st->all_model_checkpoint_paths;
    const auto& times = st->all_model_checkpoint_timestamps;
    // The newest earlier entries that still exist, newest first, then in file order.
    std::vector<size_t> kept;
    for (size_t i = listed_paths.size();
         i-- > 0 && kept.size() + paths.size() < kMaxListedBySave;) {
      if (in_paths(listed_paths[i]) || !index_exists(listed_paths[i])) continue;
      kept.push_back(i);
    }
    for (auto it = kept.rbegin(); it != kept.rend(); ++it) {
      out.all_model_checkpoint_paths.push_back(listed_paths[*it]);
      out.all_model_checkpoint_timestamps.push_back(*it < times.size() ? times[*it] : now);
    }
    out.last_preserved_timestamp = st->last_preserved_timestamp;
  }
  for (const std::string& p : paths) {
    out.all_model_checkpoint_paths.push_back(p);
    out.all_model_checkpoint_timestamps.push_back(now);
  }
  out.model_checkpoint_path = paths.back();
  write_checkpoint_state(dir, out, sync);
}

}  // namespace dtrain::checkpoint::detail
