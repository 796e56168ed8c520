// The text `checkpoint` state file of a checkpoint directory (CheckpointState in
// tensorflow/python/training/checkpoint_state.proto, written with text_format): which
// checkpoints are committed, oldest to newest. Paths are stored relative to the directory when
// they lie in it (as TF2 does) and returned joined with it. A state file only ever names
// checkpoints directly in its own directory: entries that point elsewhere (`..`, absolute paths
// to other directories, symlinked directories) are dropped when it is read, with a warning, so
// that neither a restore nor a retention sweep follows them. Functions are thread-safe; callers
// serialize writers.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::checkpoint {

inline constexpr std::string_view kStateFilename = "checkpoint";

struct CheckpointState {
  std::string model_checkpoint_path;                    // the newest
  std::vector<std::string> all_model_checkpoint_paths;  // oldest..newest
  std::vector<double> all_model_checkpoint_timestamps;  // unix seconds, parallel (may be empty)
  std::optional<double> last_preserved_timestamp;
  // Read only: entries that read_checkpoint_state dropped because they point outside the
  // directory, as written in the file (never written back).
  std::vector<std::string> ignored_paths;
};

// Text format, one field per line, strings double-quoted and escaped.
std::string format_checkpoint_state(const CheckpointState& state);
// Parses what format_checkpoint_state or TF writes; unknown fields are skipped. Throws
// DataLossError naming `what` on malformed text.
CheckpointState parse_checkpoint_state(std::string_view text, const std::string& what);

// Reads `<dir>/checkpoint`, joining relative paths with `dir` and dropping (into ignored_paths,
// with one warning per distinct state file content) the entries that are not
// inside_directory(dir, ...); a dropped model_checkpoint_path is replaced by the newest kept
// entry. nullopt when the file does not exist; throws DataLossError when it is malformed.
std::optional<CheckpointState> read_checkpoint_state(const std::string& dir);
// Writes `<dir>/checkpoint` atomically (temporary file, fsync, rename, fsync dir when `sync`),
// storing paths inside `dir` relative to it. Throws the errors of AtomicFile.
void write_checkpoint_state(const std::string& dir, const CheckpointState& state, bool sync);

// `path` joined with `dir` unless it is absolute.
std::string join_path(const std::string& dir, const std::string& path);
// The directory part of a checkpoint prefix ("." when there is none).
std::string prefix_directory(const std::string& prefix);
// Whether the checkpoint `prefix` (already joined with `dir`) lies directly in directory `dir`:
// its directory part is `dir` itself, with symlinks and other spellings resolved (an absolute
// path into `dir` counts; `../other/x`, `/elsewhere/x` and `link/x` with `link` a directory
// symlink or a subdirectory do not).
bool inside_directory(const std::string& dir, const std::string& prefix);

// Sends `message` to the handler set_warning_handler() installed (stderr by default).
void warn(const std::string& message);

}  // namespace dtrain::checkpoint
