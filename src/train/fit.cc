// Model::compile / fit / evaluate / predict: the Keras training loop.
#include <algorithm>
#include <cstring>
#include <functional>
#include <iostream>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/core/random.h"
#include "dtrain/distribute/input.h"
#include "dtrain/distribute/sync_check.h"
#include "dtrain/ops/tensor_ops.h"
#include "dtrain/train/backup_and_restore.h"
#include "dtrain/train/preemption.h"
#include "dtrain/train/step_observer.h"
#include "dtrain/train/tensorboard.h"
#include "dtrain/train/training.h"
#include "fit_parameter_server.h"
#include "progress_bar.h"

namespace dtrain::train {

std::shared_ptr<optim::Optimizer> OptimizerSpec::resolve() const {
  if (optimizer_) return optimizer_;
  return std::shared_ptr<optim::Optimizer>(optim::optimizer_from_name(name_));
}

std::shared_ptr<nn::Loss> LossSpec::resolve() const {
  if (loss_) return loss_;
  DTRAIN_CHECK(!name_.empty(), "compile: a loss is required");
  return nn::loss_from_name(name_);
}

data::Dataset ValidationData::dataset(int64_t batch_size) const {
  if (dataset_.defined()) return dataset_;
  return data::Dataset::from_tensor_slices({xy_.first, xy_.second}).batch(batch_size);
}

}  // namespace dtrain::train

namespace dtrain::nn {

using train::detail::ProgressBar;

namespace {

train::TrainingState& state_of(Model& m, const char* fn) {
  if (m.training_state() == nullptr) {
    throw FailedPreconditionError(
        str_cat(fn, ": model '", m.name(),
                "' must be compiled first: call model.compile({.optimizer = ..., .loss = ...})"));
  }
  return *m.training_state();
}

int resolve_verbose(int verbose) {
  if (verbose >= 0) return verbose;
  return train::detail::stdout_is_terminal() ? 1 : 2;
}

void check_element(const data::Element& e, const char* fn) {
  DTRAIN_CHECK(e.size() >= 2, fn, ": dataset elements must be (x, y) pairs, got ", e.size(),
               " component(s)");
}

// Sets running logs in place (no allocation once the keys exist).
void fill_logs(train::TrainingState& s, Logs& logs, const std::string& prefix = {}) {
  logs[prefix + "loss"] = s.loss_tracker.result();
  for (const auto& m : s.metrics) logs[prefix + m->name()] = m->result();
}

void reset_metrics(train::TrainingState& s) {
  s.loss_tracker.reset_state();
  for (const auto& m : s.metrics) m->reset_state();
}

// True when every gradient is finite (undefined ones are skipped).
bool all_finite(const std::vector<Tensor>& grads, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (grads[i].defined() && !ops::all_finite(grads[i])) return false;
  }
  return true;
}

// One optimization step on a batch: forward under a tape, loss, gradients, update.
void train_step(Model& model, train::TrainingState& s, const Tensor& x, const Tensor& y,
                bool skip_nonfinite) {
  Tensor y_pred;
  Tensor loss;
  {
    GradientTape tape;
    y_pred = model(x, /*training=*/true);
    loss = (*s.loss)(y, y_pred);
    tape.gradient(loss, s.trainable, s.grads);
  }
  s.last_step_applied =
      !skip_nonfinite || (ops::all_finite(loss) && all_finite(s.grads, s.grads.size()));
  if (!s.last_step_applied) return;
  s.optimizer->apply_gradients(s.grads, s.trainable);
  const double batch = x.rank() > 0 ? static_cast<double>(x.dim(0)) : 1.0;
  s.loss_tracker.update_state(loss.item(), batch);
  const Tensor pred = stop_gradient(y_pred);
  for (const auto& m : s.metrics) m->update_state(y, pred);
}

// Sums the local replicas' gradients into s.grads in replica order (deterministic), on this
// thread. A replica without a gradient for a variable contributes nothing; a variable no replica
// has a gradient for gets zeros.
void sum_local_gradients(train::TrainingState& s, int64_t local) {
  s.grads.resize(s.trainable.size());
  for (size_t v = 0; v < s.trainable.size(); ++v) {
    Tensor& sum = s.grads[v];
    bool first = true;
    for (int64_t r = 0; r < local; ++r) {
      const auto& g = s.replicas[r].grads;
      if (g.empty() || !g[v].defined()) continue;
      if (first) {
        if (g[v].use_count() == 1) {
          // Only this replica's list holds its gradient: sum into it in place, no copy.
          sum = g[v];
        } else {
          if (!sum.defined() || sum.shape() != g[v].shape() || sum.use_count() > 1) {
            sum = Tensor(g[v].shape());
          }
          sum.copy_from(g[v]);
        }
        first = false;
      } else {
        float* d = sum.data<float>();
        const float* src = g[v].data<float>();
        for (int64_t i = 0, n = sum.num_elements(); i < n; ++i) d[i] += src[i];
      }
    }
    if (first) {
      // No local replica produced this gradient (e.g. every local part was empty): contribute 0.
      if (!sum.defined() || sum.shape() != s.trainable[v]->shape()) {
        sum = Tensor(s.trainable[v]->shape());
      }
      sum.fill(0);
    }
  }
}

// One synchronous data-parallel step (TF's MirroredStrategy / MultiWorkerMirroredStrategy
// semantics): this worker takes its part of the global batch, each local replica computes the
// gradient of its loss scaled by (replica rows / global rows) on its own tape and thread, the
// replicas' gradients are summed in replica order, then across workers, and every worker
// applies the same update to its (identical) variables.
void distributed_train_step(Model& model, train::TrainingState& s, const Tensor& x, const Tensor& y,
                            bool skip_nonfinite) {
  distribute::Strategy& st = *s.strategy;
  const int64_t global = x.dim(0);
  const int64_t workers = st.num_workers(), local = st.num_local_replicas();
  const int64_t parts = workers * local;
  if (static_cast<int64_t>(s.replicas.size()) != local)
    s.replicas.resize(static_cast<size_t>(local));
  for (int64_t r = 0; r < local; ++r) {
    const auto [b, e] = distribute::replica_rows(global, static_cast<int>(parts), st.replica_id(r));
    s.replicas[r].x = x.slice(b, e);
    s.replicas[r].y = y.slice(b, e);
  }
  struct Ctx {
    Model* model;
    train::TrainingState* s;
    int64_t global;
  } ctx{&model, &s, global};
  st.run([c = &ctx](int r) {
    train::TrainingState::Replica& rep = c->s->replicas[r];
    const int64_t rows = rep.x.dim(0);
    if (rows == 0) {
      rep.grads.clear();
      rep.y_pred = Tensor();
      rep.loss = 0;
      return;
    }
    GradientTape tape;
    const Tensor y_pred = (*c->model)(rep.x, /*training=*/true);
    const Tensor loss = (*c->s->loss)(rep.y, y_pred);
    // Σ over replicas of (mean loss over the replica's rows · rows / global) is the mean over the
    // global batch, so summed gradients are the global batch's gradient.
    const Tensor scaled = scale(loss, static_cast<float>(rows) / static_cast<float>(c->global));
    tape.gradient(scaled, c->s->trainable, rep.grads);
    rep.loss = loss.item();
    rep.y_pred = stop_gradient(y_pred);
  });
  const size_t n = s.trainable.size();
  // With several local replicas whose gradients are all defined (the usual case), the replica
  // threads sum the gradients and, with one worker, apply the update, each on its own element
  // range of every variable (Optimizer::element_range), so that neither runs serially.
  const bool parallel =
      local > 1 && std::all_of(s.replicas.begin(), s.replicas.end(), [&](auto& rep) {
        return rep.grads.size() == n && std::all_of(rep.grads.begin(), rep.grads.end(),
                                                    [](const Tensor& g) { return g.defined(); });
      });
  const bool fused_update = parallel && workers == 1 && !skip_nonfinite;
  if (parallel) {
    s.grads.resize(n);
    for (size_t v = 0; v < n; ++v) {
      Tensor& sum = s.grads[v];
      if (!sum.defined() || sum.shape() != s.trainable[v]->shape() || sum.use_count() > 1) {
        sum = Tensor(s.trainable[v]->shape());
      }
    }
    if (fused_update) s.optimizer->prepare_update(s.grads, s.trainable);
    st.run([c = &ctx, fused_update](int r) {
      train::TrainingState& ts = *c->s;
      const int parts = static_cast<int>(ts.replicas.size());
      for (size_t v = 0; v < ts.grads.size(); ++v) {
        float* d = ts.grads[v].data<float>();
        const auto [begin, end] =
            optim::Optimizer::element_range(ts.grads[v].num_elements(), r, parts);
        // Replica order, as the serial sum: bitwise the same result.
        const float* g0 = ts.replicas[0].grads[v].data<float>();
        for (int64_t i = begin; i < end; ++i) d[i] = g0[i];
        for (int q = 1; q < parts; ++q) {
          const float* g = ts.replicas[static_cast<size_t>(q)].grads[v].data<float>();
          for (int64_t i = begin; i < end; ++i) d[i] += g[i];
        }
      }
      if (fused_update) ts.optimizer->update_part(ts.grads, ts.trainable, r, parts);
    });
  } else {
    sum_local_gradients(s, local);
  }
  if (workers > 1) {
    // The preemption flag rides in the same all-reduce as the gradients (one more float in a
    // bucket), so every worker learns at this step whether any of them must stop.
    if (!s.stop_flag.defined()) s.stop_flag = Tensor(Shape{1});
    s.stop_flag.fill(train::preemption_requested() ? 1.0 : 0.0);
    s.grads.resize(n + 1);
    s.grads[n] = s.stop_flag;
    st.all_reduce_across_workers(s.grads, distribute::ReduceOp::kSum);
    s.stop_agreed = s.stop_flag.data<float>()[0] > 0.0f;
    s.grads.resize(n);
  } else {
    s.stop_agreed = train::preemption_requested();
  }
  if (fused_update) {
    s.optimizer->finish_update();
    s.last_step_applied = true;
  } else {
    // After the all-reduce every worker sees the same sums, so all skip (or apply) together.
    s.last_step_applied = !skip_nonfinite || all_finite(s.grads, n);
    if (!s.last_step_applied) return;
    if (parallel) {
      s.optimizer->prepare_update(s.grads, s.trainable);
      st.run([c = &ctx](int r) {
        train::TrainingState& ts = *c->s;
        ts.optimizer->update_part(ts.grads, ts.trainable, r, static_cast<int>(ts.replicas.size()));
      });
      s.optimizer->finish_update();
    } else {
      s.optimizer->apply_gradients(s.grads, s.trainable);
    }
  }
  for (int64_t r = 0; r < local; ++r) {
    const train::TrainingState::Replica& rep = s.replicas[r];
    if (!rep.y_pred.defined()) continue;
    s.loss_tracker.update_state(rep.loss, static_cast<double>(rep.x.dim(0)));
    for (const auto& m : s.metrics) m->update_state(rep.y, rep.y_pred);
  }
}

// Sums the epoch's metric states across workers so every worker reports the global values.
void all_reduce_metrics(train::TrainingState& s) {
  if (s.strategy == nullptr || s.strategy->num_workers() == 1) return;
  auto reduce = [&](nn::Metric& m) {
    const auto [total, count] = m.state();
    m.set_state(s.strategy->all_reduce_scalar(total, distribute::ReduceOp::kSum),
                s.strategy->all_reduce_scalar(count, distribute::ReduceOp::kSum));
  };
  reduce(s.loss_tracker);
  for (const auto& m : s.metrics) reduce(*m);
}

// Before the first step under a multi-worker strategy: every worker starts from the chief's
// variables (TF broadcasts them when variables are created in scope).
void sync_initial_variables(Model& model, train::TrainingState& s) {
  if (s.variables_synced || s.strategy == nullptr) return;
  s.variables_synced = true;
  if (s.strategy->num_workers() == 1) return;
  std::vector<Tensor> values;
  for (Variable* v : model.weights()) values.push_back(v->tensor());
  s.strategy->broadcast_from_chief(values);
}

void test_step(Model& model, train::TrainingState& s, const Tensor& x, const Tensor& y) {
  const Tensor y_pred = model(x, /*training=*/false);
  const Tensor loss = (*s.loss)(y, y_pred);
  s.loss_tracker.update_state(loss.item(), x.rank() > 0 ? static_cast<double>(x.dim(0)) : 1.0);
  for (const auto& m : s.metrics) m->update_state(y, y_pred);
}

Logs run_evaluation(Model& model, const data::Dataset& dataset, std::optional<int64_t> steps,
                    int verbose, const std::vector<std::shared_ptr<train::Callback>>& callbacks,
                    const std::string& prefix) {
  train::TrainingState& s = state_of(model, "evaluate");
  NoGradGuard no_grad;
  reset_metrics(s);
  Logs logs;
  for (const auto& cb : callbacks) cb->on_test_begin(logs);
  distribute::Strategy* st = s.strategy;
  const bool split = st != nullptr && st->num_workers() > 1;
  const int64_t card = dataset.cardinality();
  ProgressBar bar(verbose, steps ? *steps : (card >= 0 ? card : -1));
  data::Iterator it = dataset.iterator();
  data::Element e;
  int64_t step = 0;
  while ((!steps || step < *steps) && it.next(e)) {
    check_element(e, "evaluate");
    if (split) {
      // Each worker evaluates its part of every batch; the totals are summed below.
      const auto [b, end] = distribute::worker_rows(e[0].dim(0), *st);
      if (end > b) test_step(model, s, e[0].slice(b, end), e[1].slice(b, end));
    } else {
      test_step(model, s, e[0], e[1]);
    }
    ++step;
    fill_logs(s, logs);
    for (const auto& cb : callbacks) cb->on_test_batch_end(step - 1, logs);
    bar.update(step, logs);
  }
  DTRAIN_CHECK(step > 0, "evaluate: the dataset is empty");
  all_reduce_metrics(s);
  fill_logs(s, logs);
  bar.update(step, logs, true);
  for (const auto& cb : callbacks) cb->on_test_end(logs);
  if (prefix.empty()) return logs;
  Logs prefixed;
  for (const auto& [k, v] : logs) prefixed[prefix + k] = v;
  return prefixed;
}

}  // namespace

void Model::compile(const train::CompileOptions& options) {
  auto s = std::make_shared<train::TrainingState>();
  s->loss = options.loss.resolve();
  s->optimizer = options.optimizer.resolve();
  for (const std::string& name : options.metrics) {
    s->metrics.push_back(nn::metric_from_name(name, s->loss.get()));
  }
  s->strategy = distribute::current_strategy();
  set_training_state(std::move(s));
}

bool Model::compiled() const { return training_ != nullptr; }

optim::Optimizer* Model::optimizer() { return training_ ? training_->optimizer.get() : nullptr; }

namespace {

// The training loop shared by fit(dataset) and fit(x, y). `make_dataset(seed)` returns the
// training data; fit(x, y) builds it from the shuffle seed, so a resumed run can rebuild the
// exact order it had.
train::History run_fit(Model& model,
                       const std::function<data::Dataset(std::optional<uint64_t>)>& make_dataset,
                       std::optional<uint64_t> data_seed, const train::FitOptions& options) {
  train::TrainingState& s = state_of(model, "fit");
  if (train::detail::is_parameter_server_strategy(s.strategy)) {
    // Parameter servers hold the variables: src/train/fit_parameter_server.cc.
    return train::detail::fit_parameter_server(model, make_dataset, data_seed, options);
  }
  DTRAIN_CHECK(options.epochs >= 0 && options.initial_epoch >= 0, "fit: epochs (", options.epochs,
               ") and initial_epoch (", options.initial_epoch, ") must be non-negative");
  DTRAIN_CHECK(!options.steps_per_epoch || *options.steps_per_epoch > 0,
               "fit: steps_per_epoch must be positive");
  const int verbose = resolve_verbose(options.verbose);
  auto history = std::make_shared<train::History>();
  std::vector<std::shared_ptr<train::Callback>> callbacks = options.callbacks;
  if (options.save_checkpoints) {
    callbacks.push_back(std::make_shared<train::BackupAndRestore>(
        options.checkpoint_dir,
        train::BackupAndRestoreOptions{.save_freq = options.checkpoint_every,
                                       .enable_async = options.async_checkpoints}));
  }
  // The strategy's report_tensorboard (the tutorial's option) stands in for a logdir.
  std::string logdir = options.logdir;
  if (logdir.empty() && s.strategy != nullptr) logdir = s.strategy->tensorboard_logdir();
  if (!logdir.empty()) callbacks.push_back(std::make_shared<train::TensorBoard>(logdir));
  callbacks.push_back(history);
  for (const auto& cb : callbacks) cb->set_model(&model);
  std::optional<data::Dataset> validation;
  if (options.validation_data) validation = options.validation_data->dataset(options.batch_size);

  data::Dataset dataset = make_dataset(data_seed);
  s.data_seed = data_seed;
  data::Element e;
  if (!model.built()) {
    // Build from the first batch now, so that callbacks can restore weights into the model.
    data::Iterator peek = dataset.iterator(options.initial_epoch);
    if (peek.next(e)) {
      check_element(e, "fit");
      model.build(e[0].shape().without_first());
    }
  }
  s.stop_training = false;
  s.resume = {};
  Logs logs;
  for (const auto& cb : callbacks) cb->on_train_begin(logs);

  int64_t first_epoch = options.initial_epoch;
  int64_t first_step = 0;
  const bool resuming = s.resume.epoch >= 0;
  if (resuming) {
    // Say in TensorBoard where this run picked up (the launcher reports the failure itself).
    for (const auto& cb : callbacks) {
      auto* tb = dynamic_cast<train::TensorBoard*>(cb.get());
      if (tb == nullptr) continue;
      std::string from;
      for (const auto& other : callbacks) {
        if (auto* b = dynamic_cast<train::BackupAndRestore*>(other.get());
            b && b->restored_from()) {
          from = *b->restored_from();
        }
      }
      tb->text("dtrain/recovery",
               str_cat("resumed from ", from.empty() ? std::string("a backup") : from, " at epoch ",
                       s.resume.epoch + 1, ", step ", s.resume.step, " (global step ",
                       s.optimizer->iterations(), ")"),
               s.optimizer->iterations());
    }
  }
  if (resuming) {
    first_epoch = s.resume.epoch;
    first_step = s.resume.step;
    if (s.resume.data_seed && s.resume.data_seed != s.data_seed) {
      dataset = make_dataset(s.resume.data_seed);
      s.data_seed = s.resume.data_seed;
    }
  }

  const int64_t card = dataset.cardinality();
  const int64_t steps_known = options.steps_per_epoch ? *options.steps_per_epoch
                              : card >= 0             ? card
                                                      : -1;
  // With steps_per_epoch the data stream continues across epochs (Keras semantics for
  // repeated datasets); otherwise each epoch is one pass, reshuffled by its epoch number.
  std::optional<data::Iterator> stream;
  if (options.steps_per_epoch) {
    stream.emplace(resuming ? dataset.iterator_from(s.resume.data_position)
                            : dataset.iterator(options.initial_epoch));
  }
  bool out_of_data = false;
  int64_t global_step = 0;
  int64_t nonfinite_in_a_row = 0;
  for (const auto& cb : callbacks) {
    if (dynamic_cast<train::BackupAndRestore*>(cb.get()) != nullptr) {
      train::install_preemption_handler();
    }
  }
  std::vector<Variable*> sync_vars;
  if (options.verify_sync_every > 0) {
    sync_vars = model.weights();
    s.optimizer->build(model.trainable_variables());  // slots exist before the first check
    for (Variable* v : s.optimizer->variables()) sync_vars.push_back(v);
  }
  for (int64_t epoch = first_epoch; epoch < options.epochs && !s.stop_training; ++epoch) {
    const bool resumed_epoch = resuming && epoch == first_epoch && first_step > 0;
    if (!resumed_epoch) reset_metrics(s);  // a resumed epoch keeps its restored metric states
    logs.clear();
    s.epoch = epoch;
    for (const auto& cb : callbacks) cb->on_epoch_begin(epoch, logs);
    if (verbose > 0)
      std::printf("Epoch %lld/%lld\n", static_cast<long long>(epoch + 1),
                  static_cast<long long>(options.epochs));
    ProgressBar bar(verbose, steps_known);
    std::optional<data::Iterator> pass;
    int64_t step = resumed_epoch ? first_step : 0;
    if (!stream) {
      pass.emplace(resumed_epoch ? dataset.iterator_from(data::IteratorState{epoch, step})
                                 : dataset.iterator(epoch));
    }
    data::Iterator& it = stream ? *stream : *pass;
    while (!options.steps_per_epoch || step < *options.steps_per_epoch) {
      if (!it.next(e)) {
        if (options.steps_per_epoch) out_of_data = true;
        break;
      }
      check_element(e, "fit");
      for (const auto& cb : callbacks) cb->on_train_batch_begin(step, logs);
      if (s.trainable.empty()) {
        // Fix the variable list for the whole run.
        if (!model.built()) model.build(e[0].shape().without_first());
        s.trainable = model.trainable_variables();
        sync_initial_variables(model, s);
      }
      if (s.strategy != nullptr) {
        distributed_train_step(model, s, e[0], e[1], options.skip_nonfinite);
      } else {
        train_step(model, s, e[0], e[1], options.skip_nonfinite);
        s.stop_agreed = train::preemption_requested();
      }
      if (!s.last_step_applied) {
        ++nonfinite_in_a_row;
        std::cerr << "fit: non-finite gradients at epoch " << epoch + 1 << " step " << step + 1
                  << "; update skipped (" << nonfinite_in_a_row << " in a row)\n";
        if (nonfinite_in_a_row >= options.rollback_after_nonfinite) {
          bool restored = false;
          for (const auto& cb : callbacks) restored = cb->restore_last_good() || restored;
          std::cerr << (restored ? "fit: rolled back to the last good checkpoint\n"
                                 : "fit: no checkpoint to roll back to (use save_checkpoints)\n");
          nonfinite_in_a_row = 0;
        }
      } else {
        nonfinite_in_a_row = 0;
      }
      ++step;
      ++global_step;
      train::notify_step(s.optimizer->iterations());
      if (options.verify_sync_every > 0 && s.strategy != nullptr &&
          global_step % options.verify_sync_every == 0) {
        distribute::verify_sync(*s.strategy, sync_vars, global_step);
      }
      s.step_in_epoch = step;
      s.data_position = it.state();
      fill_logs(s, logs);
      for (const auto& cb : callbacks) cb->on_train_batch_end(step - 1, logs);
      bar.update(step, logs);
      if (s.stop_agreed) {
        // Preempted: every worker stops after this same step; callbacks save; then exit.
        for (const auto& cb : callbacks) cb->on_preemption(epoch, step);
        const int code = train::preemption_exit_code();
        std::fflush(stdout);
        std::cerr << "fit: preempted (SIGTERM) at epoch " << epoch + 1 << " step " << step
                  << "; state saved by callbacks; exiting with code " << code << "\n";
        std::exit(code);
      }
      if (s.stop_training) break;
    }
    DTRAIN_CHECK(step > 0 || out_of_data, "fit: the training dataset is empty");
    all_reduce_metrics(s);
    fill_logs(s, logs);
    if (validation && step > 0) {
      const Logs val = run_evaluation(model, *validation, std::nullopt, 0, {}, "val_");
      reset_metrics(s);  // evaluation reused the trackers; the training values are in logs
      logs.insert(val.begin(), val.end());
    }
    bar.update(step, logs, true);
    // The epoch is complete: callbacks that checkpoint here record "epoch + 1, step 0".
    s.step_in_epoch = 0;
    s.epoch = epoch + 1;
    s.data_position = stream ? stream->state() : data::IteratorState{epoch + 1, 0};
    for (const auto& cb : callbacks) cb->on_epoch_end(epoch, logs);
    if (out_of_data) {
      std::cerr << "fit: the input ran out of data after epoch " << epoch + 1
                << "; make sure the dataset can produce steps_per_epoch * epochs batches "
                   "(e.g. with repeat())\n";
      break;
    }
  }
  for (const auto& cb : callbacks) cb->on_train_end(logs);
  return *history;
}

}  // namespace

train::History Model::fit(const data::Dataset& dataset, const train::FitOptions& options) {
  return run_fit(
      *this, [&dataset](std::optional<uint64_t>) { return dataset; }, std::nullopt, options);
}

train::History Model::fit(const Tensor& x, const Tensor& y, const train::FitOptions& options) {
  DTRAIN_CHECK(options.batch_size > 0, "fit: batch_size must be positive, got ",
               options.batch_size);
  DTRAIN_CHECK(x.defined() && y.defined() && x.rank() >= 1 && y.rank() >= 1 && x.dim(0) == y.dim(0),
               "fit: x and y must have the same number of examples, got ", x.shape().to_string(),
               " and ", y.shape().to_string());
  std::optional<uint64_t> seed;
  if (options.shuffle) {
    seed = options.seed;
    if (training_ && training_->strategy != nullptr && training_->strategy->num_workers() > 1) {
      // Every worker must walk the same permutation and take its part of each global batch:
      // agree on the chief's seed (52 bits travel exactly in a double).
      const uint64_t mine = (seed ? *seed : next_seed()) & ((uint64_t{1} << 52) - 1);
      seed = static_cast<uint64_t>(training_->strategy->all_reduce_scalar(
          training_->strategy->is_chief() ? static_cast<double>(mine) : 0.0,
          distribute::ReduceOp::kSum));
    } else if (!seed) {
      seed = next_seed();
    }
  }
  const int64_t n = x.dim(0), batch = options.batch_size;
  const bool shuffle = options.shuffle;
  return run_fit(
      *this,
      [&x, &y, n, batch, shuffle](std::optional<uint64_t> s) {
        data::Dataset ds = data::Dataset::from_tensor_slices({x, y});
        if (shuffle) ds = ds.shuffle(n, s, /*reshuffle_each_iteration=*/true);
        return ds.batch(batch);
      },
      seed, options);
}

Logs Model::evaluate(const data::Dataset& dataset, const train::EvaluateOptions& options) {
  return run_evaluation(*this, dataset, options.steps, options.verbose, options.callbacks, "");
}

Logs Model::evaluate(const Tensor& x, const Tensor& y, const train::EvaluateOptions& options) {
  DTRAIN_CHECK(options.batch_size > 0, "evaluate: batch_size must be positive");
  return evaluate(data::Dataset::from_tensor_slices({x, y}).batch(options.batch_size), options);
}

Tensor Model::predict(const data::Dataset& dataset, const train::PredictOptions&) {
  NoGradGuard no_grad;
  std::vector<Tensor> outputs;
  data::Iterator it = dataset.iterator();
  data::Element e;
  int64_t rows = 0;
  while (it.next(e)) {
    DTRAIN_CHECK(!e.empty(), "predict: empty dataset element");
    outputs.push_back((*this)(e[0], false));
    rows += outputs.back().dim(0);
  }
  DTRAIN_CHECK(!outputs.empty(), "predict: the dataset is empty");
  Tensor out(outputs[0].dtype(), outputs[0].shape().without_first().with_first(rows));
  char* dst = static_cast<char*>(out.raw_data());
  for (const Tensor& o : outputs) {
    std::memcpy(dst, o.raw_data(), o.nbytes());
    dst += o.nbytes();
  }
  return out;
}

Tensor Model::predict(const Tensor& x, const train::PredictOptions& options) {
  DTRAIN_CHECK(options.batch_size > 0, "predict: batch_size must be positive");
  return predict(data::Dataset::from_tensor_slices({x}).batch(options.batch_size), options);
}

}  // namespace dtrain::nn
