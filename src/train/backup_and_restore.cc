// BackupAndRestore: the state fit() needs to resume exactly, tracked by one Checkpoint.
#include "dtrain/train/backup_and_restore.h"

#include <cctype>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/checkpoint_manager.h"
#include "dtrain/distribute/coordination.h"
#include "dtrain/distribute/launcher_env.h"
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"
#include "dtrain/nn/attention.h"
#include "dtrain/nn/layers.h"
#include "dtrain/ops/tensor_ops.h"
#include "dtrain/train/preemption.h"
#include "dtrain/train/sharded_checkpoints.h"
#include "dtrain/train/step_observer.h"
#include "dtrain/train/training.h"
#include "fit_loop.h"
#include "memory_snapshots.h"
#include "peer_backups.h"
#include "training_state.h"

namespace dtrain::train {

namespace fs = std::filesystem;

namespace {

// A callback that carries state across epochs (Callback::state_name), saved under
// "callbacks/<name>/<i>": `current` is what capture() took; a restore fills `restored`, which
// apply_callback_states() hands over.
struct CallbackState {
  Callback* callback = nullptr;
  std::vector<Tensor> current;
  std::vector<Tensor> restored;
  size_t received = 0;
};

}  // namespace

// Plain values mirrored into and out of the checkpoint around each save and restore.
struct BackupAndRestore::State {
  int64_t epoch = 0;
  int64_t step = 0;
  data::IteratorState position;
  int64_t data_seed = -1;  // bit pattern of the seed; -1 with has_seed = 0: none
  int64_t has_seed = 0;
  std::vector<nn::Dropout*> dropouts;
  std::vector<RngState> dropout_rngs;
  std::vector<nn::Metric*> metrics;  // the loss tracker first
  Tensor metric_state;               // float64 [metrics, 2]: (total, count) per metric
  std::unique_ptr<checkpoint::Checkpoint> ckpt;
  std::unique_ptr<checkpoint::CheckpointManager> manager;  // the chief's only
  bool writer = true;     // owns the manager: the chief (or the only process), or a host's copy
  bool sharded = false;   // every worker writes its shard of each backup
  bool per_host = false;  // every host keeps its own copy (peer_backups.h)
  std::vector<std::pair<std::string, checkpoint::Trackable>> children;  // what ckpt tracks
  std::vector<CallbackState> callback_states;  // fit()'s callbacks with state
};

namespace {

// Every Dropout whose RNG state a resumed run needs: the model's own, those of nested models
// (a TransformerBlock's) and MultiHeadAttention's inner one, depth first in tracking order.
void collect_dropouts(nn::Model& model, std::vector<nn::Dropout*>& out) {
  for (const auto& layer : model.layers()) {
    if (auto* d = dynamic_cast<nn::Dropout*>(layer.get())) {
      out.push_back(d);
    } else if (auto* mha = dynamic_cast<nn::MultiHeadAttention*>(layer.get())) {
      if (mha->dropout_layer().rate() > 0.0f) out.push_back(&mha->dropout_layer());
    } else if (auto* sub = dynamic_cast<nn::Model*>(layer.get())) {
      collect_dropouts(*sub, out);
    }
  }
}

// The "callbacks" node: one child per callback with state, named by its state_name() (made
// unique as Keras names layers: "early_stopping", "early_stopping_1"), whose values are its
// state's tensors "0", "1", ....
std::optional<checkpoint::Trackable> track_callback_states(
    const std::vector<std::shared_ptr<Callback>>& callbacks, std::vector<CallbackState>& out) {
  for (const auto& cb : callbacks) {
    if (cb && !cb->state_name().empty()) out.push_back(CallbackState{cb.get(), {}, {}, 0});
  }
  if (out.empty()) return std::nullopt;
  std::map<std::string, int> seen;
  std::vector<std::pair<std::string, checkpoint::Trackable>> nodes;
  for (auto& cs : out) {
    cs.current = cs.callback->state();
    cs.restored.assign(cs.current.size(), Tensor());
    std::string name = cs.callback->state_name();
    if (const int n = seen[name]++; n > 0) name = str_cat(name, "_", n);
    std::vector<std::pair<std::string, checkpoint::Trackable>> values;
    for (size_t i = 0; i < cs.current.size(); ++i) {
      values.emplace_back(std::to_string(i),
                          checkpoint::Trackable::value([&cs, i] { return cs.current.at(i); },
                                                       [&cs, i](const Tensor& t) {
                                                         cs.restored.at(i) = t;
                                                         ++cs.received;
                                                       }));
    }
    nodes.emplace_back(name, checkpoint::Trackable::object(std::move(values)));
  }
  return checkpoint::Trackable::object(std::move(nodes));
}

}  // namespace

BackupAndRestore::BackupAndRestore(std::string backup_dir, BackupAndRestoreOptions options)
    : dir_(std::move(backup_dir)), options_(options) {
  DTRAIN_CHECK(!dir_.empty(), "BackupAndRestore: backup_dir is empty");
  DTRAIN_CHECK(options_.save_freq >= 0, "BackupAndRestore: save_freq must be >= 0, got ",
               options_.save_freq);
  DTRAIN_CHECK(options_.max_to_keep >= 1, "BackupAndRestore: max_to_keep must be >= 1");
}

BackupAndRestore::~BackupAndRestore() = default;

void BackupAndRestore::attach() {
  nn::Model& m = *model();
  TrainingState* ts = find_state(m);
  DTRAIN_CHECK(ts != nullptr && ts->optimizer != nullptr, "BackupAndRestore: model '", m.name(),
               "' must be compiled before fit()");
  state_ = std::make_unique<State>();
  State& st = *state_;
  collect_dropouts(m, st.dropouts);
  st.dropout_rngs.resize(st.dropouts.size());
  st.metrics.push_back(&ts->loss_tracker);
  for (const auto& metric : ts->metrics) st.metrics.push_back(metric.get());
  st.metric_state =
      Tensor::zeros(Shape{static_cast<int64_t>(st.metrics.size()), 2}, DType::kFloat64);

  std::vector<std::pair<std::string, checkpoint::Trackable>> rngs;
  for (size_t i = 0; i < st.dropout_rngs.size(); ++i) {
    rngs.emplace_back(st.dropouts[i]->name(), checkpoint::Trackable(st.dropout_rngs[i]));
  }
  // The optimizer's position in the object graph is "optimizer", as in Keras's training
  // checkpoints; the rest are dtrain's own keys (docs/fault-tolerance.md).
  std::vector<std::pair<std::string, checkpoint::Trackable>> children = {
      {"model", checkpoint::Trackable(m)},
      {"optimizer", checkpoint::Trackable(*ts->optimizer)},
      {"epoch", checkpoint::Trackable(st.epoch)},
      {"step_in_epoch", checkpoint::Trackable(st.step)},
      {"data_iterator", checkpoint::Trackable(st.position)},
      {"data_seed", checkpoint::Trackable(st.data_seed)},
      {"has_data_seed", checkpoint::Trackable(st.has_seed)},
      {"metric_states",
       checkpoint::Trackable::value([&st] { return st.metric_state; },
                                    [&st](const Tensor& t) { st.metric_state.copy_from(t); })},
  };
  if (!rngs.empty()) children.emplace_back("dropout_rngs", checkpoint::Trackable::object(rngs));
  if (ts->loop != nullptr) {
    if (auto node = track_callback_states(ts->loop->callbacks(), st.callback_states)) {
      children.emplace_back("callbacks", std::move(*node));
    }
  }
  st.children = children;
  st.ckpt = std::make_unique<checkpoint::Checkpoint>(
      std::move(children), checkpoint::CheckpointOptions{.enable_async = options_.enable_async});
  // Under a multi-worker strategy the variables are mirrored, so only the chief writes (and
  // sweeps the directory); the other workers only read the chief's committed backups. Under
  // `dtrain launch` with several nodes, the first worker of every host also writes a full copy
  // into its own directory (that host's disk), so no host depends on another's filesystem.
  st.writer = ts->strategy == nullptr || ts->strategy->is_chief();
  st.sharded = options_.sharded && ts->strategy != nullptr && ts->strategy->num_workers() > 1;
  st.per_host = backups_per_host(ts->strategy);
  const auto make_manager = [&] {
    return std::make_unique<checkpoint::CheckpointManager>(
        *st.ckpt, dir_,
        checkpoint::CheckpointManagerOptions{.max_to_keep = options_.max_to_keep,
                                             .checkpoint_name = "backup"});
  };
  if (st.writer) st.manager = make_manager();
  if (!st.per_host) {
    if (st.sharded) st.ckpt->set_sharding(sharded_save_options(*ts->strategy, m));
    return;
  }
  // The chief holds its directory's lock before any host writer tries: a host whose directory
  // is the chief's (a shared filesystem after all) finds it taken and only reads it.
  ts->strategy->barrier();
  bool locked_out = false;
  if (!st.writer && writes_host_copy()) {
    try {
      st.manager = make_manager();
      st.writer = true;
    } catch (const FailedPreconditionError& e) {
      locked_out = true;
      std::cerr << "BackupAndRestore: " << dir_ << " has a writer already (a directory shared "
                << "with another host?), so this host only reads it: " << e.what() << "\n";
    }
  }
  if (!st.sharded) return;
  // Sharded: every host's workers write a whole sharded backup into their host's directory.
  if (auto host = host_sharding(*ts->strategy, m, locked_out)) {
    st.ckpt->set_sharding(std::move(*host));
    return;
  }
  // A directory shared between hosts: one sharded backup for the whole job, in it.
  if (!ts->strategy->is_chief()) {
    st.manager.reset();
    st.writer = false;
  }
  st.per_host = false;
  st.ckpt->set_sharding(sharded_save_options(*ts->strategy, m));
}

namespace {

// Deletes what the backups' manager wrote into `dir` — "backup-<N>.*" files (with their temp and
// recycled spares) and the state file — and then `dir` itself if nothing else is left in it: a
// file of the user's in the directory survives the end of training.
void remove_backup_files(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == "checkpoint" || name.rfind("checkpoint.tmp", 0) == 0 ||
                      (name.rfind("backup-", 0) == 0 && name.size() > 7 &&
                       std::isdigit(static_cast<unsigned char>(name[7])));
    std::error_code type_ec;
    if (ours && entry.is_regular_file(type_ec)) fs::remove(entry.path(), ec);
    // A copy fetched from a peer by a worker that was killed before it restored it.
    if (name.rfind(".peer-backup-r", 0) == 0) fs::remove_all(entry.path(), ec);
  }
  fs::remove(dir, ec);  // only when empty
}

// Under dtrain launch with a coordination service, tells the launcher where this worker
// resumed ("resumed/<generation>/<rank>" = the global step), so its restart report can say how
// much work was lost. Best effort: a failure to report never stops training.
// `generation`: the one this worker resumed in (default: the one it was started in).
void report_resume_to_launcher(const std::string& path, int64_t global_step,
                               std::optional<int64_t> generation = std::nullopt) {
  try {
    if (!distribute::LauncherEnv::present()) return;
    const distribute::LauncherEnv env = distribute::LauncherEnv::from_environment();
    if (!env.master) return;  // no coordination service (several nodes on file:// or redis://)
    const int64_t g = generation.value_or(env.generation);
    const std::string checkpoint = std::filesystem::path(path).filename().string();
    // The progress reporter's connection, off this thread: a connection of its own costs a
    // recovery's critical path a few milliseconds on a small VM.
    if (notify_resumed(g, global_step, checkpoint)) return;
    distribute::CoordinationClient client(
        env.master->to_string(),
        {.connect_timeout = std::chrono::seconds(5), .rpc_timeout = std::chrono::seconds(5)});
    // resumed_from first: the launcher reads it once it sees resumed.
    client.set(str_cat("resumed_from/", g, "/", env.rank), checkpoint);
    client.set(str_cat("resumed/", g, "/", env.rank), std::to_string(global_step));
  } catch (const Error& e) {
    std::cerr << "BackupAndRestore: could not report the resume point to the launcher: " << e.what()
              << "\n";
  }
}

}  // namespace

void BackupAndRestore::on_train_begin(const Logs&) {
  attach();
  // A SIGTERM now means: back up at the next step boundary (on_preemption), then stop.
  install_preemption_handler();
  steps_since_backup_ = 0;
  restored_from_.reset();
  snapshots_ = MemorySnapshots::from_environment(options_.snapshot_every);
  if (snapshots_) snapshots_->begin(state_->children);
  if (options_.restore && snapshots_) {
    TrainingState& ts = state_of(*model(), "BackupAndRestore");
    auto* strategy = dynamic_cast<distribute::MultiWorkerMirroredStrategy*>(ts.strategy);
    if (strategy != nullptr && strategy->num_workers() > 1 && MemorySnapshots::broadcast_root()) {
      // A newcomer of a survivors recovery: the state comes from a survivor by broadcast.
      restored_from_ = snapshots_->receive_state(*state_->ckpt, strategy->collectives(),
                                                 strategy->logical_replicas() > 0);
    } else {
      restored_from_ = snapshots_->restore_agreed(*state_->ckpt);
    }
  }
  if (options_.restore && !restored_from_) {
    if (state_->manager) {
      restored_from_ = state_->manager->restore_or_initialize();
    } else if (auto status = checkpoint::restore_newest_checkpoint(*state_->ckpt, dir_, "backup")) {
      // The same choice as the chief's manager, also when the state file is damaged.
      restored_from_ = status->save_path();
    }
    if (state_->per_host) {
      // Each host restored its own newest copy; now all take the job's newest, from a peer's
      // disk where this host lacks it.
      TrainingState& ts = state_of(*model(), "BackupAndRestore");
      restored_from_ = agree_on_host_backups(*ts.strategy, *state_->ckpt, dir_, restored_from_,
                                             [&ts] { return ts.optimizer->iterations(); });
    }
  }
  if (!restored_from_) return;
  TrainingState& ts = state_of(*model(), "BackupAndRestore");
  DTRAIN_CHECK(ts.loop != nullptr, "BackupAndRestore: on_train_begin outside fit()");
  resume_loop(ts);
  std::cerr << "BackupAndRestore: resumed from " << *restored_from_ << " at epoch "
            << state_->epoch + 1 << ", step " << state_->step << "\n";
  report_resume_to_launcher(*restored_from_, ts.optimizer->iterations());
}

void BackupAndRestore::resume_loop(TrainingState& ts) {
  State& st = *state_;
  for (size_t i = 0; i < st.dropouts.size(); ++i) st.dropouts[i]->set_rng_state(st.dropout_rngs[i]);
  const double* ms = st.metric_state.data<double>();
  for (size_t i = 0; i < st.metrics.size(); ++i) st.metrics[i]->set_state(ms[2 * i], ms[2 * i + 1]);
  FitPosition at{.epoch = st.epoch,
                 .step_in_epoch = st.step,
                 .data_position = st.position,
                 .data_seed = std::nullopt};
  if (st.has_seed) at.data_seed = static_cast<uint64_t>(st.data_seed);
  ts.loop->resume_at(at, *restored_from_);
}

bool BackupAndRestore::rejoin_after_failure() {
  if (!state_ || !snapshots_ || !MemorySnapshots::survives_failures()) return false;
  TrainingState& ts = state_of(*model(), "BackupAndRestore");
  auto* strategy = dynamic_cast<distribute::MultiWorkerMirroredStrategy*>(ts.strategy);
  if (strategy == nullptr || ts.loop == nullptr || !strategy->collectives().broken()) return false;
  const int64_t failed = strategy->collectives().generation();
  // The snapshot the launchers agree on may be one that only a slot's trailer holds so far: its
  // files exist before the announcement is read (the broadcast's root packs them at once).
  snapshots_->materialize();
  const NextGeneration next = MemorySnapshots::await_next_generation(failed, &strategy->store());
  strategy->rejoin(next.generation);
  if (state_->manager) state_->manager->sync();  // the chief's backups in flight
  snapshots_->roll_back(*state_->ckpt, next);
  restored_from_ = next.restore;
  // Count the steps to the next backup from the resume, as the restarted workers do (a fresh
  // fit() starts at 0): a sharded backup, or ZeRO's gather of the slots before any backup, is a
  // collective, and a survivor that counted on from before the failure would back up at other
  // steps than its newcomers and run collectives they do not.
  steps_since_backup_ = 0;
  resume_loop(ts);
  // The callbacks' state goes back too: an epoch that ends again is not counted twice.
  apply_callback_states();
  std::cerr << "BackupAndRestore: generation " << next.generation << " resumes at epoch "
            << state_->epoch + 1 << ", step " << state_->step << "\n";
  // The launcher's progress for this worker goes back to the restored step.
  notify_step(ts.optimizer->iterations());
  report_resume_to_launcher(next.restore, ts.optimizer->iterations(), next.generation);
  return true;
}

void BackupAndRestore::share_state_after_rejoin() {
  if (!state_ || !snapshots_) return;
  TrainingState& ts = state_of(*model(), "BackupAndRestore");
  auto* strategy = dynamic_cast<distribute::MultiWorkerMirroredStrategy*>(ts.strategy);
  if (strategy == nullptr) return;
  // A newcomer's on_train_begin: with backups per host (several nodes), attach()'s barrier comes
  // before it receives the state; the survivor meets it there.
  if (state_->per_host) strategy->barrier();
  snapshots_->share_state(strategy->collectives());
}

void BackupAndRestore::backup() {
  DTRAIN_CHECK(state_ != nullptr, "BackupAndRestore::backup: fit() has not started");
  State& st = *state_;
  TrainingState& ts = state_of(*model(), "BackupAndRestore::backup");
  DTRAIN_CHECK(ts.loop != nullptr, "BackupAndRestore::backup: fit() is not running");
  // Every worker, writer or not, at the same steps: sharded optimizer slots are gathered, and
  // the checks below see the same (mirrored) values everywhere, so every worker retries at the
  // same next step after a skipped backup.
  ts.loop->before_checkpoint();
  // Never write a poisoned state: a backup must be something worth rolling back to.
  for (Variable* v : model()->weights()) {
    if (!ops::all_finite(v->tensor())) {
      std::cerr << "BackupAndRestore: not backing up: variable '" << v->name()
                << "' has non-finite values\n";
      return;
    }
  }
  for (Variable* v : ts.optimizer->variables()) {
    if (!ops::all_finite(v->tensor())) {
      std::cerr << "BackupAndRestore: not backing up: optimizer variable '" << v->name()
                << "' has non-finite values\n";
      return;
    }
  }
  if (!st.writer && !st.sharded) {
    steps_since_backup_ = 0;
    return;
  }
  capture();
  const auto start = std::chrono::steady_clock::now();
  if (st.manager) {
    st.manager->save();
  } else {
    // A sharded backup's other workers: the same number as the chief's manager gives it (every
    // worker's save_counter is the same), written without touching the state file.
    st.ckpt->save((fs::path(dir_) / "backup").string());
  }
  ts.loop->set_checkpoint_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  steps_since_backup_ = 0;
}

void BackupAndRestore::capture() {
  State& st = *state_;
  TrainingState& ts = state_of(*model(), "BackupAndRestore");
  const FitPosition& at = ts.loop->position();
  st.epoch = at.epoch;
  st.step = at.step_in_epoch;
  st.position = at.data_position;
  st.has_seed = at.data_seed.has_value();
  st.data_seed = at.data_seed ? static_cast<int64_t>(*at.data_seed) : -1;
  for (size_t i = 0; i < st.dropouts.size(); ++i) st.dropout_rngs[i] = st.dropouts[i]->rng_state();
  double* ms = st.metric_state.data<double>();
  for (size_t i = 0; i < st.metrics.size(); ++i) {
    const auto [total, count] = st.metrics[i]->state();
    ms[2 * i] = total;
    ms[2 * i + 1] = count;
  }
  for (CallbackState& cs : st.callback_states) {
    std::vector<Tensor> now = cs.callback->state();
    DTRAIN_CHECK(now.size() == cs.current.size(), "BackupAndRestore: callback '",
                 cs.callback->state_name(), "' changed its state from ", cs.current.size(), " to ",
                 now.size(), " tensors; a state's layout must not depend on its values");
    cs.current = std::move(now);
  }
}

void BackupAndRestore::apply_callback_states() {
  if (!state_) return;
  for (CallbackState& cs : state_->callback_states) {
    if (cs.received == cs.restored.size()) {
      cs.callback->set_state(cs.restored);
    } else if (cs.received > 0) {
      std::cerr << "BackupAndRestore: the checkpoint holds " << cs.received << " of the "
                << cs.restored.size() << " state tensors of callback '" << cs.callback->state_name()
                << "'; it starts afresh\n";
    }
    // A checkpoint without this callback's state (one written before it was added) leaves it
    // as on_train_begin set it.
    cs.received = 0;
    cs.restored.assign(cs.restored.size(), Tensor());
  }
}

void BackupAndRestore::on_train_resumed(int64_t, int64_t, const std::string&) {
  // After every callback's on_train_begin, which resets their state.
  apply_callback_states();
}

void BackupAndRestore::on_preemption(int64_t, int64_t) {
  if (!state_) return;
  backup();
  if (state_->manager) state_->manager->sync();
}

bool BackupAndRestore::restore_last_good() {
  if (!state_) return false;
  // Restore into the live objects, keeping the data position: the batches that went bad are
  // not replayed. Every worker restores the chief's newest committed backup.
  State& st = *state_;
  const int64_t epoch = st.epoch, step = st.step, seed = st.data_seed, has_seed = st.has_seed;
  const data::IteratorState position = st.position;
  std::optional<checkpoint::CheckpointLoadStatus> status;
  if (st.manager) st.manager->sync();
  status = st.ckpt->restore_latest(dir_);
  bool restored = status.has_value();
  if (st.per_host) {
    // Every host its own newest copy, then the job's newest one (as when fit() starts).
    TrainingState& ts = state_of(*model(), "BackupAndRestore");
    std::optional<std::string> local;
    if (status) local = status->save_path();
    restored = agree_on_host_backups(*ts.strategy, *st.ckpt, dir_, local, [&ts] {
                 return ts.optimizer->iterations();
               }).has_value();
  }
  st.epoch = epoch;
  st.step = step;
  st.position = position;
  st.data_seed = seed;
  st.has_seed = has_seed;
  // Like the data position, the callbacks keep their live state (the epochs did happen).
  for (CallbackState& cs : st.callback_states) {
    cs.received = 0;
    cs.restored.assign(cs.restored.size(), Tensor());
  }
  return restored;
}

void BackupAndRestore::on_train_batch_end(int64_t, const Logs&) {
  if (options_.save_freq > 0 && ++steps_since_backup_ >= options_.save_freq) backup();
  if (snapshots_) snapshots_->after_step(*this, state_of(*model(), "BackupAndRestore"));
}

void BackupAndRestore::on_epoch_end(int64_t, const Logs&) {
  if (options_.save_freq == 0) backup();
}

void BackupAndRestore::on_train_end(const Logs&) {
  if (!state_) return;
  if (snapshots_) snapshots_->end();
  snapshots_.reset();
  if (!state_->writer) {
    state_.reset();
    return;
  }
  state_->manager->sync();
  // A run that ends (all epochs, or stopped by a callback such as EarlyStopping) deletes its
  // backups, as Keras does; a crashed run never gets here.
  if (options_.delete_checkpoint) {
    state_->manager.reset();
    state_->ckpt.reset();
    remove_backup_files(dir_);
  }
  state_.reset();
}

}  // namespace dtrain::train
