// Committing checkpoints (private to the checkpoint layer): naming written prefixes in the
// directory's `checkpoint` state file as the newest, and dropping a prefix from it before its
// files are overwritten. Callers serialize the writers of one directory.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "checkpoint_state.h"

namespace dtrain::checkpoint::detail {

// Whether two paths name the same file once normalized lexically ("a/./b" == "a/b").
bool same_path(const std::string& a, const std::string& b);
// Whether `<prefix>.index` exists.
bool index_exists(const std::string& prefix);

// The directory's state file; nullopt (with a warning) when it is malformed, nullopt when it
// does not exist.
std::optional<CheckpointState> read_state_or_warn(const std::string& dir);

// Removes `path` from the directory's state file, if listed, before it is overwritten.
void uncommit(const std::string& dir, const std::string& path, bool sync);

// Whether `dir`'s state file lists `path`.
bool listed(const std::string& dir, const std::string& path);

// Names `paths` (oldest first, all written) as the newest committed checkpoints of `dir`,
// keeping up to 9 earlier entries whose files still exist.
void commit(const std::string& dir, const std::vector<std::string>& paths, bool sync);

}  // namespace dtrain::checkpoint::detail
