// Checkpoint: the trackable object graph (built breadth-first from the root, as TF's
// ObjectGraphView does), save/write/restore, the async write pipeline and the state-file commit.
#include "dtrain/checkpoint/checkpoint.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "checkpoint_state.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/core/float_env.h"
#include "dtrain/data/dataset.h"
#include "dtrain/nn/model.h"
#include "dtrain/optim/optimizer.h"
#include "object_graph.h"
#include "spare_files.h"

namespace dtrain::checkpoint {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Warnings

namespace {
std::mutex& warning_mutex() {
  static std::mutex mu;
  return mu;
}
std::function<void(const std::string&)>& warning_handler() {
  static std::function<void(const std::string&)> handler;
  return handler;
}
}  // namespace

void set_warning_handler(std::function<void(const std::string&)> handler) {
  std::lock_guard<std::mutex> lock(warning_mutex());
  warning_handler() = std::move(handler);
}

void warn(const std::string& message) {
  std::lock_guard<std::mutex> lock(warning_mutex());
  if (warning_handler()) {
    warning_handler()(message);
  } else {
    std::fprintf(stderr, "WARNING: %s\n", message.c_str());
  }
}

namespace {

bool same_path(const std::string& a, const std::string& b) {
  return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
}

bool index_exists(const std::string& prefix) {
  std::error_code ec;
  return fs::exists(index_filename(prefix), ec);
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string join_keys(const std::vector<std::string>& keys, size_t max = 10) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size() && i < max; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > max) out += str_cat(", ... (", keys.size() - max, " more)");
  return out + "]";
}

Tensor int64_pair(int64_t a, int64_t b) { return Tensor::from_vector<int64_t>({a, b}, Shape{2}); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Trackable

namespace detail {

struct TrackableExtra {
  const data::Dataset* dataset = nullptr;
  std::function<Tensor()> get;
  std::function<void(const Tensor&)> set;
  std::vector<std::pair<std::string, Trackable>> children;
};

// One value a checkpoint saves: a node's attribute.
struct SavedValue {
  std::string key;        // object-based checkpoint key
  std::string full_name;  // TF1-style name, for name-based restore
  std::function<Tensor()> get;
  std::function<void(const Tensor&)> set;
  bool optional = false;  // save_counter: its absence is not "missing"
};

// The object graph reachable from a root, with the values of its nodes.
struct GraphView {
  struct PotentialSlot {  // a slot an optimizer has not created yet
    optim::Optimizer* optimizer;
    Variable* variable;
    std::string key;  // the key its first slot would have
  };
  struct UnbuiltModel {
    std::string path;
    std::vector<std::string> layers;
  };

  ObjectGraph graph;
  std::vector<SavedValue> values;
  std::vector<PotentialSlot> potential_slots;
  std::vector<UnbuiltModel> unbuilt;

  static GraphView build(const Trackable* root,
                         const std::vector<std::pair<std::string, Trackable>>& root_children);

 private:
  std::vector<std::pair<std::string, Trackable>> children_of(const Trackable& t,
                                                             const std::string& path);
  void add_values(const Trackable& t, int node, const std::string& path);
  void add_value(int node, const std::string& path, std::string_view attribute,
                 std::string full_name, std::function<Tensor()> get,
                 std::function<void(const Tensor&)> set);
};

}  // namespace detail

Trackable::Trackable(nn::Layer& layer) : Trackable(Kind::kLayer, &layer) {}
Trackable::Trackable(optim::Optimizer& optimizer) : Trackable(Kind::kOptimizer, &optimizer) {}
Trackable::Trackable(Variable& variable) : Trackable(Kind::kVariable, &variable) {}
Trackable::Trackable(int64_t& counter) : Trackable(Kind::kCounter, &counter) {}
Trackable::Trackable(RngState& state) : Trackable(Kind::kRngState, &state) {}
Trackable::Trackable(Philox& rng) : Trackable(Kind::kPhilox, &rng) {}
Trackable::Trackable(data::IteratorState& state) : Trackable(Kind::kIteratorState, &state) {}

Trackable Trackable::iterator(const data::Dataset& dataset, data::Iterator& iterator) {
  Trackable t(Kind::kIterator, &iterator);
  auto extra = std::make_shared<detail::TrackableExtra>();
  extra->dataset = &dataset;
  t.extra_ = std::move(extra);
  return t;
}

Trackable Trackable::value(std::function<Tensor()> get, std::function<void(const Tensor&)> set) {
  DTRAIN_CHECK(get && set, "Trackable::value: both get and set are required");
  Trackable t(Kind::kValue, nullptr);
  auto extra = std::make_shared<detail::TrackableExtra>();
  extra->get = std::move(get);
  extra->set = std::move(set);
  t.extra_ = std::move(extra);
  return t;
}

Trackable Trackable::object(std::vector<std::pair<std::string, Trackable>> children) {
  Trackable t(Kind::kObject, nullptr);
  auto extra = std::make_shared<detail::TrackableExtra>();
  extra->children = std::move(children);
  t.extra_ = std::move(extra);
  return t;
}

const void* Trackable::identity() const {
  return (kind_ == Kind::kValue || kind_ == Kind::kObject) ? extra_.get() : ptr_;
}

// ---------------------------------------------------------------------------------------------
// GraphView

namespace detail {

namespace {
// "dense/kernel" of layer "dense" → "kernel".
std::string weight_attribute(const std::string& layer_name, const std::string& var_name) {
  if (var_name.size() > layer_name.size() + 1 &&
      var_name.compare(0, layer_name.size(), layer_name) == 0 &&
      var_name[layer_name.size()] == '/') {
    return var_name.substr(layer_name.size() + 1);
  }
  const size_t slash = var_name.find_last_of('/');
  return slash == std::string::npos ? var_name : var_name.substr(slash + 1);
}

std::string child_path(const std::string& parent, const std::string& local_name) {
  return parent.empty() ? escape_local_name(local_name)
                        : parent + "/" + escape_local_name(local_name);
}
}  // namespace

std::vector<std::pair<std::string, Trackable>> GraphView::children_of(const Trackable& t,
                                                                      const std::string& path) {
  std::vector<std::pair<std::string, Trackable>> out;
  switch (t.kind_) {
    case Trackable::Kind::kLayer: {
      auto* layer = static_cast<nn::Layer*>(t.ptr_);
      auto* model = dynamic_cast<nn::Model*>(layer);
      // The layer's (or model's) own variables.
      for (Variable* v : layer->nn::Layer::weights()) {
        out.emplace_back(weight_attribute(layer->name(), v->name()), Trackable(*v));
      }
      if (model == nullptr) break;
      UnbuiltModel unbuilt{path, {}};
      const auto& layers = model->layers();
      if (dynamic_cast<nn::Sequential*>(model) != nullptr) {
        // Keras Functional/Sequential: layer_with_weights-<j> before layer-<i>, InputLayer
        // excluded from both counts.
        int i = 0, j = 0;
        for (const auto& l : layers) {
          if (l->class_name() == "InputLayer") continue;
          if (!l->weights().empty())
            out.emplace_back(str_cat("layer_with_weights-", j++), Trackable(*l));
          out.emplace_back(str_cat("layer-", i++), Trackable(*l));
        }
      } else {
        const auto& attributes = model->layer_attributes();
        for (size_t k = 0; k < layers.size(); ++k)
          out.emplace_back(attributes[k], Trackable(*layers[k]));
      }
      for (const auto& l : layers) {
        if (!l->built() && l->class_name() != "InputLayer") unbuilt.layers.push_back(l->name());
      }
      if (!unbuilt.layers.empty()) this->unbuilt.push_back(std::move(unbuilt));
      break;
    }
    case Trackable::Kind::kOptimizer: {
      auto* opt = static_cast<optim::Optimizer*>(t.ptr_);
      out.emplace_back("iter", Trackable(opt->iterations_variable()));
      break;
    }
    case Trackable::Kind::kObject:
      out = t.extra_->children;
      break;
    default:
      break;
  }
  return out;
}

void GraphView::add_value(int node, const std::string& path, std::string_view attribute,
                          std::string full_name, std::function<Tensor()> get,
                          std::function<void(const Tensor&)> set) {
  SavedValue v;
  v.key = path + "/" + std::string(kObjectAttributesName) + "/" + escape_local_name(attribute);
  v.full_name = std::move(full_name);
  v.get = std::move(get);
  v.set = std::move(set);
  graph.nodes[static_cast<size_t>(node)].attributes.push_back(
      {std::string(attribute), v.full_name, v.key});
  values.push_back(std::move(v));
}

void GraphView::add_values(const Trackable& t, int node, const std::string& path) {
  switch (t.kind_) {
    case Trackable::Kind::kVariable: {
      auto* var = static_cast<Variable*>(t.ptr_);
      add_value(
          node, path, kVariableValueAttribute, var->name(), [var] { return var->tensor(); },
          [var](const Tensor& v) { var->assign(v); });
      break;
    }
    case Trackable::Kind::kCounter: {
      auto* c = static_cast<int64_t*>(t.ptr_);
      add_value(
          node, path, kVariableValueAttribute, path,
          [c] { return Tensor::from_vector<int64_t>({*c}, Shape{}); },
          [c](const Tensor& v) { *c = v.data<int64_t>()[0]; });
      break;
    }
    case Trackable::Kind::kRngState:
    case Trackable::Kind::kPhilox: {
      std::function<RngState()> get_state;
      std::function<void(RngState)> set_state;
      if (t.kind_ == Trackable::Kind::kRngState) {
        auto* s = static_cast<RngState*>(t.ptr_);
        get_state = [s] { return *s; };
        set_state = [s](RngState v) { *s = v; };
      } else {
        auto* p = static_cast<Philox*>(t.ptr_);
        get_state = [p] { return p->state(); };
        set_state = [p](RngState v) { p->set_state(v); };
      }
      add_value(
          node, path, "RNG_STATE", path,
          [get_state] {
            const RngState s = get_state();
            return int64_pair(std::bit_cast<int64_t>(s.seed), std::bit_cast<int64_t>(s.counter));
          },
          [set_state](const Tensor& v) {
            const int64_t* p = v.data<int64_t>();
            set_state(RngState{std::bit_cast<uint64_t>(p[0]), std::bit_cast<uint64_t>(p[1])});
          });
      break;
    }
    case Trackable::Kind::kIteratorState: {
      auto* s = static_cast<data::IteratorState*>(t.ptr_);
      add_value(
          node, path, "ITERATOR_STATE", path, [s] { return int64_pair(s->iteration, s->position); },
          [s](const Tensor& v) {
            *s = data::IteratorState{v.data<int64_t>()[0], v.data<int64_t>()[1]};
          });
      break;
    }
    case Trackable::Kind::kIterator: {
      auto* it = static_cast<data::Iterator*>(t.ptr_);
      const data::Dataset* ds = t.extra_->dataset;
      add_value(
          node, path, "ITERATOR_STATE", path,
          [it] {
            const data::IteratorState s = it->state();
            return int64_pair(s.iteration, s.position);
          },
          [it, ds](const Tensor& v) {
            *it =
                ds->iterator_from(data::IteratorState{v.data<int64_t>()[0], v.data<int64_t>()[1]});
          });
      break;
    }
    case Trackable::Kind::kValue:
      add_value(node, path, kVariableValueAttribute, path, t.extra_->get, t.extra_->set);
      break;
    default:
      break;
  }
}

GraphView GraphView::build(const Trackable* root,
                           const std::vector<std::pair<std::string, Trackable>>& root_children) {
  GraphView view;
  std::vector<std::optional<Trackable>> sources;  // per node; nullopt for a synthetic root
  std::vector<std::string> paths;
  std::map<std::pair<int, const void*>, int> ids;
  auto new_node = [&](std::optional<Trackable> t, std::string path) {
    const int id = static_cast<int>(view.graph.nodes.size());
    view.graph.nodes.emplace_back();
    if (t) ids[{static_cast<int>(t->kind_), t->identity()}] = id;
    sources.push_back(std::move(t));
    paths.push_back(std::move(path));
    return id;
  };
  new_node(root ? std::optional<Trackable>(*root) : std::nullopt, "");

  std::deque<int> queue{0};
  while (!queue.empty()) {
    const int n = queue.front();
    queue.pop_front();
    const std::string path = paths[static_cast<size_t>(n)];
    std::vector<std::pair<std::string, Trackable>> children;
    if (sources[static_cast<size_t>(n)]) {
      children = view.children_of(*sources[static_cast<size_t>(n)], path);
    }
    if (n == 0) children.insert(children.end(), root_children.begin(), root_children.end());
    std::set<std::string> names;
    for (auto& [name, child] : children) {
      DTRAIN_CHECK(!name.empty(), "Checkpoint: an object at '", path,
                   "' has a child with an empty name");
      DTRAIN_CHECK(names.insert(name).second, "Checkpoint: two children of '",
                   path.empty() ? "<root>" : path, "' are named '", name, "'");
      auto found = ids.find({static_cast<int>(child.kind_), child.identity()});
      int id;
      if (found != ids.end()) {
        id = found->second;
      } else {
        id = new_node(child, child_path(path, name));
        queue.push_back(id);
      }
      view.graph.nodes[static_cast<size_t>(n)].children.push_back({id, name});
    }
  }
  const int bfs_nodes = static_cast<int>(view.graph.nodes.size());
  for (int n = 0; n < bfs_nodes; ++n) {
    if (sources[static_cast<size_t>(n)])
      view.add_values(*sources[static_cast<size_t>(n)], n, paths[static_cast<size_t>(n)]);
  }
  // Slot variables come after the breadth-first nodes, as in TF.
  for (int o = 0; o < bfs_nodes; ++o) {
    const auto& src = sources[static_cast<size_t>(o)];
    if (!src || src->kind_ != Trackable::Kind::kOptimizer) continue;
    auto* opt = static_cast<optim::Optimizer*>(src->ptr_);
    const std::vector<std::string> slot_names = opt->slot_names();
    for (int v = 0; v < bfs_nodes; ++v) {
      const auto& vs = sources[static_cast<size_t>(v)];
      if (!vs || vs->kind_ != Trackable::Kind::kVariable) continue;
      auto* var = static_cast<Variable*>(vs->ptr_);
      if (var->dtype() != DType::kFloat32 || var == &opt->iterations_variable()) continue;
      for (size_t s = 0; s < slot_names.size(); ++s) {
        const std::string slot_path =
            paths[static_cast<size_t>(v)] + "/" + std::string(kOptimizerSlotName) + "/" +
            paths[static_cast<size_t>(o)] + "/" + escape_local_name(slot_names[s]);
        Variable* slot = opt->slot(*var, slot_names[s]);
        if (slot == nullptr) {
          if (s == 0) {
            view.potential_slots.push_back({opt, var,
                                            slot_path + "/" + std::string(kObjectAttributesName) +
                                                "/" + std::string(kVariableValueAttribute)});
          }
          continue;
        }
        const int id = static_cast<int>(view.graph.nodes.size());
        view.graph.nodes.emplace_back();
        view.add_values(Trackable(*slot), id, slot_path);
        view.graph.nodes[static_cast<size_t>(o)].slot_variables.push_back({v, slot_names[s], id});
      }
    }
  }
  return view;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// CheckpointLoadStatus

struct CheckpointLoadStatus::State {
  std::string path;
  std::vector<std::string> unused;
  std::vector<std::string> missing;
  size_t restored = 0;
  mutable bool acknowledged = false;
  ~State() {
    if (!acknowledged && !unused.empty()) {
      warn(str_cat("checkpoint ", path, ": ", unused.size(),
                   " value(s) were not restored into any object: ", join_keys(unused),
                   " (call expect_partial() on the restore status to silence this)"));
    }
  }
};

const CheckpointLoadStatus& CheckpointLoadStatus::assert_consumed() const {
  state_->acknowledged = true;
  if (!state_->unused.empty() || !state_->missing.empty()) {
    std::string msg = str_cat("checkpoint ", state_->path, ": assert_consumed failed:");
    if (!state_->unused.empty()) {
      msg += str_cat(" ", state_->unused.size(),
                     " checkpoint value(s) were not restored into any object: ",
                     join_keys(state_->unused), ";");
    }
    if (!state_->missing.empty()) {
      msg +=
          str_cat(" ", state_->missing.size(),
                  " object value(s) have no value in the checkpoint: ", join_keys(state_->missing));
    }
    throw FailedPreconditionError(msg);
  }
  return *this;
}

const CheckpointLoadStatus& CheckpointLoadStatus::assert_existing_objects_matched() const {
  state_->acknowledged = true;
  if (!state_->missing.empty()) {
    throw FailedPreconditionError(
        str_cat("checkpoint ", state_->path,
                ": assert_existing_objects_matched failed: ", state_->missing.size(),
                " object value(s) have no value in the checkpoint: ", join_keys(state_->missing)));
  }
  return *this;
}

const CheckpointLoadStatus& CheckpointLoadStatus::expect_partial() const {
  state_->acknowledged = true;
  return *this;
}

const std::string& CheckpointLoadStatus::save_path() const { return state_->path; }
const std::vector<std::string>& CheckpointLoadStatus::unused_keys() const { return state_->unused; }
const std::vector<std::string>& CheckpointLoadStatus::missing_keys() const {
  return state_->missing;
}
size_t CheckpointLoadStatus::restored_count() const { return state_->restored; }

// ---------------------------------------------------------------------------------------------
// Checkpoint

// ---------------------------------------------------------------------------------------------
// AsyncWriter

namespace detail {

// The async pipeline. Snapshots are queued in save order, written concurrently by up to
// max_in_flight writer threads (so that their fsync latencies overlap), and committed strictly
// in save order: whichever writer finds the oldest pending job written commits it, together
// with the written jobs right behind it that share its commit group (one state-file write for
// all of them). A failed write or commit is kept for the submitting thread to rethrow once;
// every job queued after it is discarded (never committed; files already written are removed).
// Thread-safe; one thread submits.
class AsyncWriter {
 public:
  using CommitFn = std::function<void(const std::vector<std::string>&)>;

  AsyncWriter(int max_in_flight, int64_t max_bytes)
      : max_in_flight_(static_cast<size_t>(max_in_flight)), max_bytes_(max_bytes) {}
  // Waits for the pending jobs (their errors stay unreported), then stops the threads.
  ~AsyncWriter() {
    drain();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Blocks until fewer than max_in_flight jobs are pending. Rethrows a detected error first
  // (once), so that a save after a failed one fails before changing anything.
  void reserve_slot() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
      if (jobs_.size() < max_in_flight_) return;
      done_cv_.wait(lock);
    }
  }

  // Blocks until `bytes` more of unwritten snapshots fit the budget (always, when none is
  // pending).
  void wait_for_bytes(int64_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock,
                  [&] { return unwritten_bytes_ == 0 || unwritten_bytes_ + bytes <= max_bytes_; });
  }

  // Queues a job: `write` writes `prefix` durably (it owns the snapshot), then `commit`, if any,
  // commits it. Never blocks on I/O.
  void submit(std::string prefix, int64_t bytes, std::string group, std::function<void()> write,
              CommitFn commit) {
    auto job = std::make_unique<Job>();
    job->prefix = std::move(prefix);
    job->bytes = bytes;
    job->group = std::move(group);
    job->write = std::move(write);
    job->commit = std::move(commit);
    std::string warning;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_) {
        // A failure was detected after this save's reserve_slot(): nothing after it commits.
        job->discarded = true;
        warning = str_cat("asynchronous checkpoint ", job->prefix,
                          " was discarded: an earlier asynchronous write failed (its error is "
                          "raised by the next call)");
      }
      unwritten_bytes_ += job->bytes;
      jobs_.push_back(std::move(job));
      if (idle_ == 0 && threads_.size() < max_in_flight_) {
        threads_.push_back(start_thread([this] { work(); }));
      }
      work_cv_.notify_one();
    }
    // Outside the lock: the warning handler may call back into the checkpoint.
    if (!warning.empty()) warn(warning);
  }

  // Whether a pending job writes `prefix`.
  bool writing(const std::string& prefix) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& j : jobs_) {
      if (same_path(j->prefix, prefix)) return true;
    }
    return false;
  }

  // Blocks until every submitted job is committed or discarded. Does not throw.
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return jobs_.empty() && !committing_; });
  }

  // The detected, unreported error (cleared), or null.
  std::exception_ptr take_error() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(error_, nullptr);
  }

 private:
  enum class JobState { kQueued, kWriting, kWritten, kFailed };
  struct Job {
    std::string prefix;
    int64_t bytes = 0;  // of its snapshot, until written
    std::string group;  // consecutive written jobs of one non-empty group commit together
    std::function<void()> write;
    CommitFn commit;
    JobState state = JobState::kQueued;
    bool discarded = false;
    std::exception_ptr error;
  };

  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      Job* job = nullptr;
      for (const auto& j : jobs_) {
        if (j->state == JobState::kQueued && !j->discarded) {
          job = j.get();
          break;
        }
      }
      if (job == nullptr) {
        if (stop_) return;
        ++idle_;
        work_cv_.wait(lock);
        --idle_;
        continue;
      }
      job->state = JobState::kWriting;
      std::function<void()> write = std::move(job->write);
      lock.unlock();
      std::exception_ptr error;
      try {
        write();
      } catch (...) {
        error = std::current_exception();
      }
      write = nullptr;  // frees the snapshot
      lock.lock();
      unwritten_bytes_ -= job->bytes;
      job->bytes = 0;
      job->error = error;
      job->state = error ? JobState::kFailed : JobState::kWritten;
      commit_ready(lock);
      done_cv_.notify_all();
    }
  }

  // Marks the failure (the first one is reported) and discards every job after the first
  // `keep` ones.
  void fail(std::exception_ptr error, size_t keep) {
    if (!error_) error_ = std::move(error);
    std::string discarded;
    for (size_t i = keep; i < jobs_.size(); ++i) {
      if (jobs_[i]->discarded) continue;
      jobs_[i]->discarded = true;
      discarded += str_cat(discarded.empty() ? "" : ", ", jobs_[i]->prefix);
    }
    if (!discarded.empty()) {
      warnings_.push_back(str_cat("asynchronous checkpoint(s) ", discarded,
                                  " queued after a failed one were discarded (the error is "
                                  "raised by the next call)"));
    }
  }

  // Commits written jobs from the head of the queue, in order, until it reaches one that is
  // not written yet. One thread at a time; the lock is released around file operations.
  void commit_ready(std::unique_lock<std::mutex>& lock) {
    if (committing_) return;
    committing_ = true;
    for (;;) {
      if (!warnings_.empty()) {
        // Emitted without the lock (the warning handler may call back into the checkpoint) but
        // before committing_ clears, so that drain() returns after them.
        std::vector<std::string> warnings = std::exchange(warnings_, {});
        lock.unlock();
        for (const std::string& w : warnings) warn(w);
        lock.lock();
        continue;
      }
      if (jobs_.empty()) break;
      Job& head = *jobs_.front();
      if (head.state == JobState::kWriting || (head.state == JobState::kQueued && !head.discarded))
        break;
      if (head.discarded) {
        const bool written = head.state == JobState::kWritten;
        const std::string prefix = head.prefix;
        if (head.state == JobState::kQueued) unwritten_bytes_ -= head.bytes;
        jobs_.pop_front();
        if (written) {
          // Never committed: remove what it wrote (index first, which makes it disappear).
          lock.unlock();
          remove_bundle_files(prefix);
          lock.lock();
        }
        continue;
      }
      if (head.state == JobState::kFailed) {
        fail(head.error, 1);
        jobs_.pop_front();
        continue;
      }
      std::vector<std::string> prefixes{head.prefix};
      size_t n = 1;
      if (!head.group.empty()) {
        while (n < jobs_.size() && jobs_[n]->state == JobState::kWritten && !jobs_[n]->discarded &&
               jobs_[n]->group == head.group) {
          prefixes.push_back(jobs_[n++]->prefix);
        }
      }
      CommitFn commit = jobs_[n - 1]->commit;
      std::exception_ptr error;
      if (commit) {
        lock.unlock();
        try {
          commit(prefixes);
        } catch (...) {
          error = std::current_exception();
        }
        lock.lock();
      }
      // A failed commit leaves these checkpoints' files (the state file may or may not name
      // them); nothing after them commits.
      if (error) fail(error, n);
      for (size_t i = 0; i < n; ++i) jobs_.pop_front();
    }
    committing_ = false;
    done_cv_.notify_all();
  }

  static void remove_bundle_files(const std::string& prefix) {
    std::error_code ec;
    for (const std::string& f : {index_filename(prefix), data_filename(prefix, 0, 1)}) {
      if (fs::is_regular_file(fs::symlink_status(f, ec))) fs::remove(f, ec);
    }
  }

  const size_t max_in_flight_;
  const int64_t max_bytes_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;        // writers: a job was queued, or stop
  std::condition_variable done_cv_;        // submitter: a job was written, committed or discarded
  std::deque<std::unique_ptr<Job>> jobs_;  // pending (not yet committed), in save order
  int64_t unwritten_bytes_ = 0;            // snapshot bytes of jobs not yet written
  bool committing_ = false;                // a writer is running commit_ready
  bool stop_ = false;
  size_t idle_ = 0;  // writer threads waiting for a job
  std::vector<std::thread> threads_;
  std::exception_ptr error_;           // the first detected failure, not yet reported
  std::vector<std::string> warnings_;  // found under the lock, emitted after releasing it
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Checkpoint

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

namespace {

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

}  // namespace

std::string Checkpoint::save(const std::string& file_prefix) {
  DTRAIN_CHECK(!file_prefix.empty(), "Checkpoint::save: empty file prefix");
  reserve_slot();  // an earlier async error surfaces here, before anything changes
  const std::string path = str_cat(file_prefix, "-", save_counter() + 1);
  const std::string dir = prefix_directory(path);
  const bool sync = options_.sync_to_disk;
  if (writing(path) || listed(dir, path)) {
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

CheckpointLoadStatus Checkpoint::restore(const std::string& save_path) {
  wait_for_write();
  DTRAIN_CHECK(!save_path.empty(), "Checkpoint::restore: empty path");
  BundleReader reader(save_path);
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
    matched[i].value->set(values[i]);
    if (matched[i].value->optional) save_counter_tracked_ = true;
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
    int tried = 0;
    bool retry = false;
    for (size_t i = 0; i < candidates.size() && !retry; ++i) {
      const std::string& c = candidates[i];
      const bool last = i + 1 == candidates.size();
      if (!index_exists(c)) {
        if (may_retry && state_changed()) {
          retry = true;
          break;
        }
        warn(str_cat("checkpoint ", c, " is named by ", join_path(directory, "checkpoint"),
                     " but its index is missing; ",
                     last ? "no older checkpoint is left" : "falling back to an older checkpoint"));
        continue;
      }
      ++tried;
      try {
        return restore(c);
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
        warn(str_cat("checkpoint ", c, " is corrupt (", e.what(), "); ",
                     last ? "no older checkpoint is left" : "falling back to an older checkpoint"));
      }
    }
    if (retry) continue;
    if (tried == 0) return std::nullopt;
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
