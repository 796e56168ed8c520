// Checkpoint: save/write (snapshot the object graph's values, write a bundle, commit it in the
// state file), synchronously or through the async writer. Restoring is in restore.cc.
#include "dtrain/checkpoint/checkpoint.h"

#include <algorithm>
#include <memory>

#include "async_writer.h"
#include "checkpoint_state.h"
#include "commit.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "graph_view.h"
#include "spare_files.h"

namespace dtrain::checkpoint {

using detail::commit;
using detail::listed;
using detail::uncommit;

Checkpoint::Checkpoint(std::vector<std::pair<std::string, Trackable>> children,
                       CheckpointOptions options)
    : children_(std::move(children)),
      options_(options),
      save_counter_("save_counter", Tensor::zeros(Shape{}, DType::kInt64), false) {
  for (const auto& [name, t] : children_) {
    DTRAIN_CHECK(name != "save_counter", "Checkpoint: 'save_counter' is reserved");
  }
  DTRAIN_CHECK(options_.max_in_flight >= 1, "Checkpoint: max_in_flight must be at least 1, got ",
               options_.max_in_flight);
  if (options_.enable_async) {
    writer_ =
        std::make_unique<detail::AsyncWriter>(options_.max_in_flight, options_.max_in_flight_bytes);
  }
}

Checkpoint::Checkpoint(Trackable root, CheckpointOptions options)
    : root_(std::move(root)),
      options_(options),
      save_counter_("save_counter", Tensor::zeros(Shape{}, DType::kInt64), false) {
  DTRAIN_CHECK(options_.max_in_flight >= 1, "Checkpoint: max_in_flight must be at least 1, got ",
               options_.max_in_flight);
  if (options_.enable_async) {
    writer_ =
        std::make_unique<detail::AsyncWriter>(options_.max_in_flight, options_.max_in_flight_bytes);
  }
}

Checkpoint::~Checkpoint() {
  if (!writer_) return;
  writer_->drain();
  if (std::exception_ptr error = writer_->take_error()) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      warn(
          str_cat("an asynchronous checkpoint write failed and nothing waited for it: ", e.what()));
    }
  }
}

std::vector<std::pair<std::string, Trackable>> Checkpoint::root_children() {
  std::vector<std::pair<std::string, Trackable>> out = children_;
  if (save_counter_tracked_) out.emplace_back("save_counter", Trackable(save_counter_));
  return out;
}

int64_t Checkpoint::save_counter() const { return save_counter_.tensor().data<int64_t>()[0]; }

std::vector<std::string> Checkpoint::keys() {
  const auto view = detail::GraphView::build(root_ ? &*root_ : nullptr, root_children());
  std::vector<std::string> out;
  for (const auto& v : view.values) out.push_back(v.key);
  std::sort(out.begin(), out.end());
  return out;
}

struct Checkpoint::ContentsCache {
  detail::GraphView view;
  std::string graph;
  uint64_t variable_events = 0;
  bool save_counter_tracked = false;
};

Checkpoint::Contents Checkpoint::contents(bool count_save) {
  if (count_save) {
    save_counter_tracked_ = true;
    ++save_counter_.tensor().data<int64_t>()[0];
  }
  const uint64_t events = Variable::lifetime_events();
  if (!contents_cache_ || contents_cache_->variable_events != events ||
      contents_cache_->save_counter_tracked != save_counter_tracked_) {
    contents_cache_.reset();  // the old walk may name objects that are gone
    auto fresh = std::make_unique<ContentsCache>();
    fresh->view = detail::GraphView::build(root_ ? &*root_ : nullptr, root_children());
    fresh->graph = fresh->view.graph.serialize();
    fresh->variable_events = events;
    fresh->save_counter_tracked = save_counter_tracked_;
    contents_cache_ = std::move(fresh);
  }
  // The values afresh through the walk (no handle is kept here between calls).
  const ContentsCache& c = *contents_cache_;
  Contents out{.graph = c.graph, .tensors = {}};
  out.tensors.reserve(c.view.values.size());
  for (const auto& v : c.view.values) out.tensors.emplace_back(v.key, v.get());
  return out;
}

void Checkpoint::wait_for_write() {
  if (!writer_) return;
  writer_->drain();
  if (std::exception_ptr error = writer_->take_error()) std::rethrow_exception(error);
}

void Checkpoint::reserve_slot() {
  if (writer_) writer_->reserve_slot();
}

void Checkpoint::check_write_error() {
  if (!writer_) return;
  if (std::exception_ptr error = writer_->take_error()) std::rethrow_exception(error);
}

bool Checkpoint::writing(const std::string& prefix) const {
  return writer_ && writer_->writing(prefix);
}

void Checkpoint::sync() { wait_for_write(); }

void Checkpoint::write_bundle(const std::string& prefix, const std::string& graph,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              detail::SpareFiles* spares, bool sync_directory) const {
  BundleWriterOptions options{.sync = options_.sync_to_disk, .sync_directory = sync_directory};
  if (spares) {
    options.reuse_data = spares->take(detail::SpareFiles::kData);
    options.reuse_index = spares->take(detail::SpareFiles::kIndex);
  }
  BundleWriter w(prefix, std::move(options));
  w.add_strings(kObjectGraphKey, {graph}, Shape{});
  for (const auto& [key, tensor] : tensors) w.add(key, tensor);
  w.finish();
}

void Checkpoint::write_internal(const std::string& prefix, std::string commit_group,
                                CommitFn commit, detail::SpareFiles* spares) {
  DTRAIN_CHECK(!prefix.empty(), "Checkpoint: empty file prefix");
  if (sharding_) {
    wait_for_write();  // a sharded save is synchronous; earlier async saves finish first
    if (sharding_->rank != 0) commit = nullptr;  // only the chief commits
    write_sharded(prefix, commit);
    return;
  }
  // Two writers of one prefix would race on its files: let the earlier one finish first.
  if (writing(prefix)) wait_for_write();
  const auto view = detail::GraphView::build(root_ ? &*root_ : nullptr, root_children());
  std::string graph = view.graph.serialize();
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.reserve(view.values.size());
  int64_t bytes = static_cast<int64_t>(graph.size());
  for (const auto& v : view.values) {
    tensors.emplace_back(v.key, v.get());
    bytes += static_cast<int64_t>(tensors.back().second.nbytes());
  }
  // A bundle that a commit names becomes durable with one directory fsync before the commit
  // (covering every bundle it commits) instead of one per bundle.
  const bool deferred_sync = commit && options_.sync_to_disk;
  if (deferred_sync) {
    commit = [commit = std::move(commit)](const std::vector<std::string>& prefixes) {
      std::vector<std::string> dirs;
      for (const std::string& p : prefixes) {
        std::string dir = prefix_directory(p);
        if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(std::move(dir));
      }
      for (const std::string& dir : dirs) sync_directory(dir);
      commit(prefixes);
    };
  }
  if (!writer_) {
    write_bundle(prefix, graph, tensors, spares, !deferred_sync);
    if (commit) commit({prefix});
    return;
  }
  // Async: wait for memory, then copy now, so that updates after save() returns cannot reach
  // the file.
  writer_->wait_for_bytes(bytes);
  for (auto& [key, t] : tensors) t = t.clone();
  writer_->submit(
      prefix, bytes, std::move(commit_group),
      [this, prefix, graph = std::move(graph), tensors = std::move(tensors), spares,
       deferred_sync] { write_bundle(prefix, graph, tensors, spares, !deferred_sync); },
      std::move(commit));
}

std::string Checkpoint::save(const std::string& file_prefix) {
  DTRAIN_CHECK(!file_prefix.empty(), "Checkpoint::save: empty file prefix");
  reserve_slot();  // an earlier async error surfaces here, before anything changes
  const std::string path = str_cat(file_prefix, "-", save_counter() + 1);
  const std::string dir = prefix_directory(path);
  const bool sync = options_.sync_to_disk;
  const bool chief = !sharding_ || sharding_->rank == 0;  // a shard's worker never commits
  if (chief && (writing(path) || listed(dir, path))) {
    // Overwriting: once nothing else commits, drop it from the state file before its files are
    // replaced, so that a crash in between never leaves the state file naming a torn one.
    wait_for_write();
    uncommit(dir, path, sync);
  }
  save_counter_tracked_ = true;
  ++save_counter_.tensor().data<int64_t>()[0];
  write_internal(path, str_cat("save:", dir),
                 [dir, sync](const std::vector<std::string>& paths) { commit(dir, paths, sync); });
  return path;
}

std::string Checkpoint::write(const std::string& file_prefix) {
  reserve_slot();
  write_internal(file_prefix, "", nullptr);
  return file_prefix;
}

}  // namespace dtrain::checkpoint
