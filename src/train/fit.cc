// Model::compile / fit / evaluate / predict: the Keras training loop.
#include <algorithm>
#include <cstring>
#include <iostream>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/train/training.h"
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

// One optimization step on a batch: forward under a tape, loss, gradients, update.
void train_step(Model& model, train::TrainingState& s, const Tensor& x, const Tensor& y) {
  Tensor y_pred;
  Tensor loss;
  {
    GradientTape tape;
    y_pred = model(x, /*training=*/true);
    loss = (*s.loss)(y, y_pred);
    tape.gradient(loss, s.trainable, s.grads);
  }
  s.optimizer->apply_gradients(s.grads, s.trainable);
  const double batch = x.rank() > 0 ? static_cast<double>(x.dim(0)) : 1.0;
  s.loss_tracker.update_state(loss.item(), batch);
  const Tensor pred = stop_gradient(y_pred);
  for (const auto& m : s.metrics) m->update_state(y, pred);
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
  const int64_t card = dataset.cardinality();
  ProgressBar bar(verbose, steps ? *steps : (card >= 0 ? card : -1));
  data::Iterator it = dataset.iterator();
  data::Element e;
  int64_t step = 0;
  while ((!steps || step < *steps) && it.next(e)) {
    check_element(e, "evaluate");
    test_step(model, s, e[0], e[1]);
    ++step;
    fill_logs(s, logs);
    for (const auto& cb : callbacks) cb->on_test_batch_end(step - 1, logs);
    bar.update(step, logs);
  }
  DTRAIN_CHECK(step > 0, "evaluate: the dataset is empty");
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
  set_training_state(std::move(s));
}

bool Model::compiled() const { return training_ != nullptr; }

optim::Optimizer* Model::optimizer() { return training_ ? training_->optimizer.get() : nullptr; }

train::History Model::fit(const data::Dataset& dataset, const train::FitOptions& options) {
  train::TrainingState& s = state_of(*this, "fit");
  DTRAIN_CHECK(options.epochs >= 0 && options.initial_epoch >= 0, "fit: epochs (", options.epochs,
               ") and initial_epoch (", options.initial_epoch, ") must be non-negative");
  DTRAIN_CHECK(!options.steps_per_epoch || *options.steps_per_epoch > 0,
               "fit: steps_per_epoch must be positive");
  const int verbose = resolve_verbose(options.verbose);
  auto history = std::make_shared<train::History>();
  std::vector<std::shared_ptr<train::Callback>> callbacks = options.callbacks;
  callbacks.push_back(history);
  for (const auto& cb : callbacks) cb->set_model(this);
  std::optional<data::Dataset> validation;
  if (options.validation_data) validation = options.validation_data->dataset(options.batch_size);

  s.stop_training = false;
  Logs logs;
  for (const auto& cb : callbacks) cb->on_train_begin(logs);

  const int64_t card = dataset.cardinality();
  const int64_t steps_known = options.steps_per_epoch ? *options.steps_per_epoch
                              : card >= 0             ? card
                                                      : -1;
  // With steps_per_epoch the data stream continues across epochs (Keras semantics for
  // repeated datasets); otherwise each epoch is one pass, reshuffled by its epoch number.
  std::optional<data::Iterator> stream;
  if (options.steps_per_epoch) stream.emplace(dataset.iterator(options.initial_epoch));
  data::Element e;
  bool out_of_data = false;
  for (int64_t epoch = options.initial_epoch; epoch < options.epochs && !s.stop_training; ++epoch) {
    reset_metrics(s);
    logs.clear();
    for (const auto& cb : callbacks) cb->on_epoch_begin(epoch, logs);
    if (verbose > 0)
      std::printf("Epoch %lld/%lld\n", static_cast<long long>(epoch + 1),
                  static_cast<long long>(options.epochs));
    ProgressBar bar(verbose, steps_known);
    std::optional<data::Iterator> pass;
    if (!stream) pass.emplace(dataset.iterator(epoch));
    data::Iterator& it = stream ? *stream : *pass;
    int64_t step = 0;
    while (!options.steps_per_epoch || step < *options.steps_per_epoch) {
      if (!it.next(e)) {
        if (options.steps_per_epoch) out_of_data = true;
        break;
      }
      check_element(e, "fit");
      for (const auto& cb : callbacks) cb->on_train_batch_begin(step, logs);
      if (step == 0 && s.trainable.empty()) {
        // Build on the first batch, then fix the variable list for the whole run.
        if (!built()) build(e[0].shape().without_first());
        s.trainable = trainable_variables();
      }
      train_step(*this, s, e[0], e[1]);
      ++step;
      fill_logs(s, logs);
      for (const auto& cb : callbacks) cb->on_train_batch_end(step - 1, logs);
      bar.update(step, logs);
      if (s.stop_training) break;
    }
    DTRAIN_CHECK(step > 0 || out_of_data, "fit: the training dataset is empty");
    if (validation && step > 0) {
      const Logs val = run_evaluation(*this, *validation, std::nullopt, 0, {}, "val_");
      reset_metrics(s);  // evaluation reused the trackers; restore the epoch's training values
      logs.insert(val.begin(), val.end());
    }
    bar.update(step, logs, true);
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

train::History Model::fit(const Tensor& x, const Tensor& y, const train::FitOptions& options) {
  DTRAIN_CHECK(options.batch_size > 0, "fit: batch_size must be positive, got ",
               options.batch_size);
  data::Dataset ds = data::Dataset::from_tensor_slices({x, y});
  if (options.shuffle) ds = ds.shuffle(x.dim(0), options.seed, /*reshuffle_each_iteration=*/true);
  return fit(ds.batch(options.batch_size), options);
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
