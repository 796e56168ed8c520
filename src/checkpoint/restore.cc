// Checkpoint::restore (match the checkpoint's keys to the object graph, read and verify every
// value, then assign), restore_latest (the newest valid committed checkpoint, falling back past
// corrupt ones) and latest_checkpoint.
#include <algorithm>
#include <set>

#include "checkpoint_scan.h"
#include "checkpoint_state.h"
#include "commit.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/optim/optimizer.h"
#include "graph_view.h"
#include "load_status.h"
#include "object_graph.h"

namespace dtrain::checkpoint {

using detail::index_exists;
using detail::join_keys;
using detail::read_state_or_warn;
using detail::same_path;

CheckpointLoadStatus Checkpoint::restore(const std::string& save_path) {
  wait_for_write();
  DTRAIN_CHECK(!save_path.empty(), "Checkpoint::restore: empty path");
  BundleReader reader(save_path);
  return restore_from(reader, save_path);
}

CheckpointLoadStatus Checkpoint::restore(const std::string& save_path, const BundleBytes& bytes) {
  wait_for_write();
  DTRAIN_CHECK(!save_path.empty(), "Checkpoint::restore: empty name");
  BundleReader reader(save_path, bytes);
  return restore_from(reader, save_path);
}

CheckpointLoadStatus Checkpoint::restore_from(BundleReader& reader, const std::string& save_path) {
  // A CheckpointManager (in this or another process) may drop and recycle this checkpoint while
  // it is read: what was read is then reported as AbortedError, never restored.
  auto recycled = [&] {
    return AbortedError(str_cat("Checkpoint::restore(", save_path,
                                "): the checkpoint was dropped by its CheckpointManager while it "
                                "was being read; restore a newer one (restore_latest retries)"));
  };
  const bool object_based = reader.contains(kObjectGraphKey);
  if (object_based) {
    try {
      const std::vector<std::string> graph = reader.read_strings(std::string(kObjectGraphKey));
      if (graph.size() != 1) {
        throw DataLossError(str_cat("checkpoint ", save_path, ": '", kObjectGraphKey, "' has ",
                                    graph.size(), " elements, expected 1"));
      }
      ObjectGraph::parse(graph[0], index_filename(save_path));  // validates it
    } catch (const DataLossError&) {
      if (reader.files_replaced()) throw recycled();
      throw;
    }
  }
  std::vector<std::pair<std::string, Trackable>> children = children_;
  children.emplace_back("save_counter", Trackable(save_counter_));
  const Trackable* root = root_ ? &*root_ : nullptr;
  auto view = detail::GraphView::build(root, children);
  if (object_based) {
    // Create the slots the checkpoint has values for (Keras creates slots on restore).
    std::vector<std::pair<optim::Optimizer*, std::vector<Variable*>>> to_build;
    for (const auto& ps : view.potential_slots) {
      if (!reader.contains(ps.key)) continue;
      auto it = std::find_if(to_build.begin(), to_build.end(),
                             [&](const auto& p) { return p.first == ps.optimizer; });
      if (it == to_build.end()) it = to_build.insert(to_build.end(), {ps.optimizer, {}});
      it->second.push_back(ps.variable);
    }
    for (auto& [opt, vars] : to_build) opt->build(vars);
    if (!to_build.empty()) view = detail::GraphView::build(root, children);
  }
  for (auto& v : view.values) {
    if (v.key == "save_counter/.ATTRIBUTES/VARIABLE_VALUE") v.optional = true;
  }

  auto state = std::make_shared<CheckpointLoadStatus::State>();
  state->path = save_path;
  struct Match {
    const detail::SavedValue* value;
    std::string key;
  };
  std::vector<Match> matched;
  std::set<std::string> used;
  for (const auto& v : view.values) {
    const std::string& key = object_based ? v.key : v.full_name;
    if (reader.contains(key)) {
      if (used.insert(key).second) matched.push_back({&v, key});
    } else if (!v.optional) {
      state->missing.push_back(v.key);
    }
  }
  for (const std::string& k : reader.keys()) {
    if (k != kObjectGraphKey && used.count(k) == 0) state->unused.push_back(k);
  }
  if (object_based) {
    for (const auto& u : view.unbuilt) {
      const std::string prefix = u.path.empty() ? "" : u.path + "/";
      for (const std::string& k : state->unused) {
        if (k.compare(0, prefix.size(), prefix) != 0) continue;
        state->acknowledged = true;
        throw FailedPreconditionError(str_cat(
            "Checkpoint::restore(", save_path, "): the checkpoint holds '", k, "' but model '",
            u.path.empty() ? "<root>" : u.path, "' has layers that are not built yet (",
            join_keys(u.layers),
            "), so their variables do not exist; build the model first (model.build(input_shape) "
            "or call it on a batch), then restore. dtrain does not defer restoration."));
      }
    }
  }
  // Check every dtype and shape, then read (and CRC-verify) everything, then assign: a failure
  // leaves the objects untouched.
  std::vector<Tensor> values;
  values.reserve(matched.size());
  for (const Match& m : matched) {
    const BundleEntry& e = reader.entry(m.key);
    const Tensor current = m.value->get();
    if (e.dtype != current.dtype() || e.shape != current.shape()) {
      state->acknowledged = true;
      throw InvalidArgumentError(
          str_cat("Checkpoint::restore(", save_path, "): '", m.key, "' has dtype ",
                  e.dtype == DType::kString ? "string" : dtype_name(e.dtype), " and shape ",
                  e.shape.to_string(), " in the checkpoint but the object ('", m.value->full_name,
                  "') has dtype ", dtype_name(current.dtype()), " and shape ",
                  current.shape().to_string()));
    }
  }
  try {
    for (const Match& m : matched) values.push_back(reader.read(m.key));
  } catch (const DataLossError&) {
    state->acknowledged = true;
    if (reader.files_replaced()) throw recycled();
    throw;
  } catch (...) {
    state->acknowledged = true;
    throw;
  }
  if (reader.files_replaced()) {
    state->acknowledged = true;
    throw recycled();
  }
  for (size_t i = 0; i < matched.size(); ++i) {
    // A variable takes the buffer its value was read into (no copy) unless a view shares it.
    const detail::SavedValue& v = *matched[i].value;
    if (!v.adopt || !v.adopt(values[i])) v.set(values[i]);
    if (v.optional) save_counter_tracked_ = true;
  }
  state->restored = matched.size();
  std::sort(state->unused.begin(), state->unused.end());
  CheckpointLoadStatus status;
  status.state_ = std::move(state);
  return status;
}

std::optional<CheckpointLoadStatus> Checkpoint::restore_latest(const std::string& directory) {
  wait_for_write();
  // A CheckpointManager that saves while this restores may drop the checkpoint being read: then
  // start over from the state file (a few times; a manager saving faster than one restore takes
  // would otherwise win forever).
  constexpr int kMaxAttempts = 5;
  for (int attempt = 1;; ++attempt) {
    const std::optional<CheckpointState> st = read_checkpoint_state(directory);
    if (!st) return std::nullopt;
    const bool may_retry = attempt < kMaxAttempts;
    auto state_changed = [&] {
      const std::optional<CheckpointState> now = read_state_or_warn(directory);
      return !now || !same_path(now->model_checkpoint_path, st->model_checkpoint_path);
    };
    std::vector<std::string> candidates;
    auto add = [&](const std::string& p) {
      if (p.empty()) return;
      for (const auto& c : candidates) {
        if (same_path(c, p)) return;
      }
      candidates.push_back(p);
    };
    add(st->model_checkpoint_path);
    for (auto it = st->all_model_checkpoint_paths.rbegin();
         it != st->all_model_checkpoint_paths.rend(); ++it)
      add(*it);
    std::string errors;
    std::vector<std::string> skipped;  // newest first, for the one fallback warning
    int tried = 0;
    bool retry = false;
    for (size_t i = 0; i < candidates.size() && !retry; ++i) {
      const std::string& c = candidates[i];
      if (!index_exists(c)) {
        if (may_retry && state_changed()) {
          retry = true;
          break;
        }
        skipped.push_back(str_cat(c, " is named by ", join_path(directory, "checkpoint"),
                                  " but its index is missing"));  // warned once, below
        continue;
      }
      ++tried;
      try {
        CheckpointLoadStatus status = restore(c);
        detail::warn_fallback(skipped, c);  // one line for every checkpoint skipped
        return status;
      } catch (const AbortedError&) {
        if (!may_retry) throw;
        retry = true;
      } catch (const NotFoundError&) {
        // Dropped between index_exists() and the read.
        if (!may_retry || !state_changed()) throw;
        retry = true;
      } catch (const DataLossError& e) {
        if (may_retry && state_changed()) {
          retry = true;
          break;
        }
        errors += str_cat("\n  ", e.what());
        skipped.push_back(str_cat(c, " is corrupt (", e.what(), ")"));  // warned once, below
      }
    }
    if (retry) continue;
    if (tried == 0) {
      detail::warn_fallback(skipped, std::nullopt);
      return std::nullopt;
    }
    throw DataLossError(
        str_cat("no valid checkpoint in ", directory, ": every committed one is corrupt:", errors));
  }
}

std::optional<std::string> latest_checkpoint(const std::string& directory) {
  const std::optional<CheckpointState> st = read_checkpoint_state(directory);
  if (!st || st->model_checkpoint_path.empty()) return std::nullopt;
  if (!index_exists(st->model_checkpoint_path)) return std::nullopt;
  return st->model_checkpoint_path;
}

}  // namespace dtrain::checkpoint
