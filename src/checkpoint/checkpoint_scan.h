// What a checkpoint directory holds when its `checkpoint` state file cannot be trusted: a scan
// for the numbered checkpoints `<dir>/<name>-<N>` a CheckpointManager writes, a check of the
// state file, and the one-line warnings of restore fallbacks. Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_state.h"

namespace dtrain::checkpoint::detail {

// N when `prefix` is `<dir>/<name>-<N>` (N a decimal number as str_cat writes it) lying
// directly in `dir` (inside_directory), nullopt otherwise.
std::optional<int64_t> own_checkpoint_number(const std::string& dir, const std::string& name,
                                             const std::string& prefix);

// Whether `path` is a regular file (not a symlink, directory or device).
bool is_regular_file(const std::string& path);

struct FoundCheckpoint {
  std::string prefix;  // `<dir>/<name>-<N>`
  int64_t number = 0;
  double mtime = 0;  // of the index, unix seconds
};

// The checkpoints `<dir>/<name>-<N>` whose index and every data shard
// (`.data-<k>-of-<n>` for all k < n) are regular files in `dir`, newest (largest N) first.
// Contents are not read: restore() verifies them.
std::vector<FoundCheckpoint> scan_checkpoints(const std::string& dir, const std::string& name);

struct StateFileCheck {
  std::optional<CheckpointState> state;  // as read (foreign entries dropped); nullopt: unusable
  // Empty when the state file names at least one checkpoint of `dir` whose index exists;
  // otherwise what is wrong with it, completing "checkpoint state file <path> ...": "is
  // missing", "is empty", "is malformed (...)", "names only checkpoints outside <dir> (...)",
  // "names only checkpoints that do not exist (...)".
  std::string problem;
  bool missing = false;  // the file does not exist
  std::string path;      // `<dir>/checkpoint`
};

// Reads and checks `<dir>/checkpoint` (never throws for its contents; file errors other than
// "not found" propagate).
StateFileCheck check_state_file(const std::string& dir);

// The one warning line of a restore that skipped the checkpoints `skipped` (each "<prefix> is
// corrupt (...)" or "<prefix> ... index is missing", newest first) and then restored `used`
// (nullopt: none was left). Nothing when `skipped` is empty.
void warn_fallback(const std::vector<std::string>& skipped, const std::optional<std::string>& used);

}  // namespace dtrain::checkpoint::detail
