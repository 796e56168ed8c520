// Directory scans and state-file checks for CheckpointManager, and the restore that trusts the
// directory when its state file is damaged.
#include "checkpoint_scan.h"

#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/checkpoint_manager.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::checkpoint {

namespace fs = std::filesystem;

namespace detail {

namespace {

// N when `s` is a decimal number without sign or leading zeros.
std::optional<int64_t> parse_number(std::string_view s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  int64_t n = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), n);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || n < 0) return std::nullopt;
  return n;
}

bool index_exists(const std::string& prefix) {
  std::error_code ec;
  return fs::exists(index_filename(prefix), ec);
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

}  // namespace

std::optional<int64_t> own_checkpoint_number(const std::string& dir, const std::string& name,
                                             const std::string& prefix) {
  const std::string file = fs::path(prefix).filename().string();
  if (file.size() <= name.size() + 1 || file.compare(0, name.size(), name) != 0 ||
      file[name.size()] != '-') {
    return std::nullopt;
  }
  const std::optional<int64_t> n = parse_number(std::string_view(file).substr(name.size() + 1));
  if (!n || !inside_directory(dir, prefix)) return std::nullopt;
  return n;
}

bool is_regular_file(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::vector<FoundCheckpoint> scan_checkpoints(const std::string& dir, const std::string& name) {
  struct Files {
    bool index = false;
    double mtime = 0;
    std::map<int, std::set<int>> shards;  // num_shards -> shard numbers present
  };
  std::map<int64_t, Files> by_number;
  const std::string stem = name + "-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir.empty() ? "." : dir, ec)) {
    const std::string file = e.path().filename().string();
    if (file.compare(0, stem.size(), stem) != 0 || file.find(".tmp.") != std::string::npos) {
      continue;
    }
    const size_t dot = file.find('.', stem.size());
    if (dot == std::string::npos) continue;
    const std::optional<int64_t> n =
        parse_number(std::string_view(file).substr(stem.size(), dot - stem.size()));
    if (!n || !is_regular_file(e.path().string())) continue;
    const std::string_view rest = std::string_view(file).substr(dot);
    int shard = 0, num_shards = 0;
    if (rest == ".index") {
      Files& f = by_number[*n];
      f.index = true;
      struct stat st;
      if (::stat(e.path().c_str(), &st) == 0) {
        f.mtime = static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
      }
    } else if (rest.size() == 20 &&
               std::sscanf(std::string(rest).c_str(), ".data-%5d-of-%5d", &shard, &num_shards) ==
                   2 &&
               0 <= shard && shard < num_shards) {
      by_number[*n].shards[num_shards].insert(shard);
    }
  }
  std::vector<FoundCheckpoint> out;
  for (auto it = by_number.rbegin(); it != by_number.rend(); ++it) {
    const Files& f = it->second;
    const bool complete = std::any_of(f.shards.begin(), f.shards.end(), [](const auto& s) {
      return static_cast<int>(s.second.size()) == s.first;
    });
    if (!f.index || !complete) continue;
    out.push_back({join_path(dir, str_cat(name, "-", it->first)), it->first, f.mtime});
  }
  return out;
}

StateFileCheck check_state_file(const std::string& dir) {
  StateFileCheck out;
  out.path = join_path(dir, std::string(kStateFilename));
  try {
    out.state = read_checkpoint_state(dir);
  } catch (const DataLossError& e) {
    out.problem = str_cat("is malformed (", e.what(), ")");
    return out;
  }
  if (!out.state) {
    out.missing = true;
    out.problem = "is missing";
    return out;
  }
  const CheckpointState& st = *out.state;
  std::vector<std::string> listed = st.all_model_checkpoint_paths;
  if (!st.model_checkpoint_path.empty()) listed.push_back(st.model_checkpoint_path);
  if (std::any_of(listed.begin(), listed.end(), index_exists)) return out;
  if (!listed.empty()) {
    std::vector<std::string> unique;
    for (const std::string& p : listed) {
      if (std::find(unique.begin(), unique.end(), p) == unique.end()) unique.push_back(p);
    }
    out.problem = str_cat("names only checkpoints that do not exist (", join(unique, ", "), ")");
  } else if (!st.ignored_paths.empty()) {
    out.problem = str_cat("names only checkpoints outside ", dir, " ('",
                          join(st.ignored_paths, "', '"), "')");
  } else {
    std::error_code ec;
    out.problem = fs::file_size(out.path, ec) == 0 ? "is empty" : "names no checkpoint";
  }
  out.state.reset();
  return out;
}

void warn_fallback(const std::vector<std::string>& skipped,
                   const std::optional<std::string>& used) {
  if (skipped.empty()) return;
  warn(str_cat("checkpoint ", join(skipped, "; checkpoint "), "; ",
               used ? str_cat("falling back to ", *used, ", the newest valid one")
                    : std::string("no older checkpoint is left")));
}

}  // namespace detail

std::optional<CheckpointLoadStatus> restore_newest_checkpoint(Checkpoint& checkpoint,
                                                              const std::string& directory,
                                                              const std::string& checkpoint_name) {
  const detail::StateFileCheck check = detail::check_state_file(directory);
  std::vector<std::string> tried;  // committed checkpoints restore_latest already tried
  std::string why;                 // completes "checkpoint state file <path> ..."
  if (check.problem.empty()) {
    try {
      if (std::optional<CheckpointLoadStatus> status = checkpoint.restore_latest(directory)) {
        return status;
      }
      why = "names no checkpoint that still exists";
    } catch (const DataLossError& e) {
      // Every committed checkpoint is corrupt: an older one the state file no longer lists
      // (preserved, or dropped from its list) may still be good.
      for (const std::string& p : check.state->all_model_checkpoint_paths) {
        if (std::find(tried.begin(), tried.end(), p) == tried.end()) tried.push_back(p);
      }
      const std::string& newest = check.state->model_checkpoint_path;
      if (!newest.empty() && std::find(tried.begin(), tried.end(), newest) == tried.end()) {
        tried.push_back(newest);
      }
      bool others = false;
      for (const auto& f : detail::scan_checkpoints(directory, checkpoint_name)) {
        others |= std::none_of(tried.begin(), tried.end(), [&](const std::string& p) {
          return fs::path(p).lexically_normal() == fs::path(f.prefix).lexically_normal();
        });
      }
      if (!others) throw;
      why = str_cat("names only corrupt checkpoints (", detail::join(tried, ", "), ")");
    }
  } else {
    why = check.problem;
  }
  std::vector<std::string> skipped;
  for (const auto& f : detail::scan_checkpoints(directory, checkpoint_name)) {
    if (std::any_of(tried.begin(), tried.end(), [&](const std::string& p) {
          return fs::path(p).lexically_normal() == fs::path(f.prefix).lexically_normal();
        })) {
      continue;
    }
    try {
      CheckpointLoadStatus status = checkpoint.restore(f.prefix);
      warn(str_cat("checkpoint state file ", check.path, " ", why, "; restored ", f.prefix,
                   ", the newest valid checkpoint found in ", directory,
                   skipped.empty() ? "" : " (skipped: " + detail::join(skipped, "; ") + ")"));
      return status;
    } catch (const DataLossError& e) {
      skipped.push_back(str_cat(f.prefix, " is corrupt: ", e.what()));
    } catch (const NotFoundError& e) {
      skipped.push_back(str_cat(f.prefix, " vanished: ", e.what()));
    }
  }
  if (!skipped.empty()) {
    throw DataLossError(
        str_cat("no valid checkpoint in ", directory, ": its state file ", check.path, " ", why,
                ", and every ", checkpoint_name,
                "-<N> checkpoint found there is corrupt: ", detail::join(skipped, "; ")));
  }
  if (!check.missing) {
    warn(str_cat("checkpoint state file ", check.path, " ", why, ", and ", directory, " holds no ",
                 checkpoint_name, "-<N> checkpoint: starting from scratch"));
  }
  return std::nullopt;
}

}  // namespace dtrain::checkpoint
