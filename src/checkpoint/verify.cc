// Checking checkpoints on disk (verify.h): prefixes from user paths, CRC verification of every
// tensor, and the checkpoints of a directory with their status.
#include "dtrain/checkpoint/verify.h"

#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>
#include <string_view>

#include "checkpoint_state.h"
#include "commit.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "object_graph.h"

namespace dtrain::checkpoint {

namespace fs = std::filesystem;

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// "ckpt-12" → 12; nullopt when the name does not end in "-<digits>".
std::optional<int64_t> number_suffix(const std::string& prefix) {
  const size_t dash = prefix.find_last_of('-');
  if (dash == std::string::npos || dash + 1 == prefix.size()) return std::nullopt;
  int64_t n = 0;
  const char* b = prefix.data() + dash + 1;
  const char* e = prefix.data() + prefix.size();
  const auto r = std::from_chars(b, e, n);
  if (r.ec != std::errc() || r.ptr != e) return std::nullopt;
  return n;
}

// Total size of `<prefix>.index` and its data shards; 0 for files that are missing.
uint64_t checkpoint_bytes(const std::string& prefix) {
  std::error_code ec;
  uint64_t total = 0;
  const fs::path p(prefix);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string base = p.filename().string();
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == base + ".index" ||
        (name.rfind(base + ".data-", 0) == 0 && name.find(".tmp.") == std::string::npos)) {
      const auto size = entry.file_size(ec);
      if (!ec) total += size;
    }
  }
  return total;
}

double mtime_seconds(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
}

// Reads (and so CRC-verifies) one tensor of any dtype; the object graph is also parsed.
void verify_tensor(const BundleReader& reader, const std::string& key) {
  const BundleEntry& e = reader.entry(key);
  if (e.dtype == DType::kString) {
    const std::vector<std::string> values = reader.read_strings(key);
    if (key == kObjectGraphKey && values.size() == 1) {
      ObjectGraph::parse(values[0], index_filename(reader.prefix()));
    }
  } else {
    reader.read(key);
  }
}

}  // namespace

std::string resolve_prefix(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (auto latest = latest_checkpoint(path)) return *latest;
    throw NotFoundError(str_cat("no committed checkpoint in directory ", path,
                                " (no 'checkpoint' state file naming an existing .index)"));
  }
  if (ends_with(path, ".index")) return path.substr(0, path.size() - 6);
  const size_t data = path.rfind(".data-");
  if (data != std::string::npos && path.find("-of-", data) != std::string::npos) {
    return path.substr(0, data);
  }
  return path;
}

bool checkpoint_exists(const std::string& prefix) {
  if (detail::index_exists(prefix)) return true;
  const std::string dir = prefix_directory(prefix);
  std::optional<CheckpointState> st;
  try {
    st = read_checkpoint_state(dir);
  } catch (const DataLossError&) {
    return false;
  }
  if (!st) return false;
  if (!st->model_checkpoint_path.empty() && detail::same_path(st->model_checkpoint_path, prefix))
    return true;
  return std::any_of(st->all_model_checkpoint_paths.begin(), st->all_model_checkpoint_paths.end(),
                     [&](const std::string& p) { return detail::same_path(p, prefix); });
}

BundleVerification verify_bundle(const std::string& prefix) {
  BundleReader reader(prefix);
  BundleVerification r;
  for (const std::string& key : reader.keys()) {
    const BundleEntry& e = reader.entry(key);
    try {
      verify_tensor(reader, key);  // a partitioned tensor: every slice, in whichever shard
      ++r.tensors;
      if (!e.partitioned) r.bytes += static_cast<uint64_t>(e.size);
      for (const TensorSlice& s : e.slices) {
        r.bytes += static_cast<uint64_t>(reader.slice_entry(key, s).size);
      }
    } catch (const DataLossError& err) {
      r.errors.push_back(err.what());
    }
  }
  return r;
}

size_t verify_keras_h5(const std::string& path) {
  const KerasH5Contents c = read_keras_h5(path);  // DataLossError
  size_t n = c.top_level_weights.size() + c.optimizer_weights.size();
  for (const auto& l : c.layers) n += l.weights.size();
  return n;
}

CheckpointListing list_checkpoints(const std::string& directory,
                                   const ListCheckpointsOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) {
    if (!fs::exists(directory, ec)) {
      throw NotFoundError(str_cat("no such checkpoint directory ", directory));
    }
    throw InvalidArgumentError(str_cat(directory, " is not a directory"));
  }
  CheckpointListing listing;
  std::optional<CheckpointState> state;
  try {
    state = read_checkpoint_state(directory);
  } catch (const DataLossError& e) {
    listing.state_problem = e.what();
  }
  std::map<std::string, CheckpointInfo> rows;  // by file name
  auto row_for = [&](const std::string& prefix) -> CheckpointInfo& {
    const std::string name = fs::path(prefix).filename().string();
    CheckpointInfo& r = rows[name];
    if (r.prefix.empty()) r.prefix = (fs::path(directory) / name).string();
    return r;
  };
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (ends_with(name, ".index") && name.find(".tmp.") == std::string::npos) {
      row_for(name.substr(0, name.size() - 6));
    }
  }
  if (ec) throw_file_error(ec.value(), "list directory", directory);
  if (state) {
    const auto& paths = state->all_model_checkpoint_paths;
    for (size_t i = 0; i < paths.size(); ++i) {
      CheckpointInfo& r = row_for(paths[i]);
      r.committed = true;
      if (i < state->all_model_checkpoint_timestamps.size()) {
        r.time = state->all_model_checkpoint_timestamps[i];
      }
    }
    if (!state->model_checkpoint_path.empty()) {
      CheckpointInfo& r = row_for(state->model_checkpoint_path);
      r.committed = true;
      r.newest = true;
    }
  }
  std::vector<CheckpointInfo>& sorted = listing.checkpoints;
  for (auto& [name, r] : rows) {
    r.step = number_suffix(name);
    const std::string index = index_filename(r.prefix);
    if (!fs::exists(index, ec)) {
      r.status = "missing";
      r.detail = str_cat("named by the state file but ", index, " does not exist");
    } else {
      if (r.time == 0) r.time = mtime_seconds(index);
      r.bytes = checkpoint_bytes(r.prefix);
      try {
        if (options.quick) {
          BundleReader reader(r.prefix);  // index checksums and data file sizes only
          r.status = "unchecked";
        } else {
          const BundleVerification v = verify_bundle(r.prefix);
          r.status = v.errors.empty() ? "valid" : "corrupt";
          if (!v.errors.empty()) r.detail = v.errors.front();
          if (v.errors.size() > 1) r.detail += str_cat(" (and ", v.errors.size() - 1, " more)");
        }
      } catch (const DataLossError& e) {
        r.status = "corrupt";
        r.detail = e.what();
      } catch (const Error& e) {
        r.status = "unreadable";
        r.detail = e.what();
      }
    }
    sorted.push_back(r);
  }
  std::sort(sorted.begin(), sorted.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    if (a.step.has_value() != b.step.has_value()) return a.step.has_value();
    if (a.step && *a.step != *b.step) return *a.step < *b.step;
    return a.prefix < b.prefix;
  });
  return listing;
}

}  // namespace dtrain::checkpoint
