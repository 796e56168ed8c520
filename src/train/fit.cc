// Model::compile and Model::fit: resolve the compile options, then run the training loop
// (fit_loop.h) with the step of the strategy in scope (train_step.h).
#include "dtrain/core/random.h"
#include "dtrain/distribute/input.h"
#include "dtrain/nn/functional.h"
#include "dtrain/train/training.h"
#include "fit_loop.h"
#include "training_state.h"

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

namespace {

// fit(dataset) and fit(x, y): `make_dataset(seed)` returns the training data; fit(x, y) builds
// it from the shuffle seed, so that a resumed run can rebuild the exact order it had.
// `per_worker`: make_dataset yields distribute::worker_batches (TrainingState::per_worker_input).
History run_fit(nn::Model& model, const MakeDataset& make_dataset,
                std::optional<uint64_t> data_seed, const FitOptions& options,
                bool per_worker = false) {
  if (auto* f = dynamic_cast<nn::Functional*>(&model);
      f != nullptr && (f->inputs().size() != 1 || f->outputs().size() != 1)) {
    throw UnimplementedError(str_cat("fit: Functional model '", model.name(), "' has ",
                                     f->inputs().size(), " inputs and ", f->outputs().size(),
                                     " outputs; dtrain trains models with one input and one "
                                     "output (call_list() runs the others)"));
  }
  TrainingState& s = state_of(model, "fit");
  DTRAIN_CHECK(s.loop == nullptr, "fit: model '", model.name(), "' is already training");
  if (is_parameter_server_strategy(s.strategy) && !s.strategy->is_chief()) {
    // A worker task: it serves the chief's step closures until the chief is done.
    serve_parameter_server_steps(model, s, make_dataset, options);
    return History();
  }
  s.per_worker_input = per_worker;
  s.step_times.measure_waiting = false;  // a TensorBoard callback profiling this fit sets it
  FitLoop loop(model, s, make_dataset, data_seed, options);
  return loop.run();
}

}  // namespace
}  // namespace dtrain::train

namespace dtrain::nn {

void Model::compile(const train::CompileOptions& options) {
  auto s = std::make_shared<train::TrainingState>();
  s->loss = options.loss.resolve();
  s->optimizer = options.optimizer.resolve();
  for (const std::string& name : options.metrics) {
    s->metrics.push_back(nn::metric_from_name(name, s->loss.get()));
  }
  s->strategy = distribute::current_strategy();
  train::TrainingAccess::set(*this, std::move(s));
}

bool Model::compiled() const { return training_ != nullptr; }

optim::Optimizer* Model::optimizer() { return training_ ? training_->optimizer.get() : nullptr; }

Loss* Model::loss() { return training_ ? training_->loss.get() : nullptr; }

std::vector<Metric*> Model::metrics() {
  return training_ ? training_->all_metrics() : std::vector<Metric*>{};
}

train::History Model::fit(const data::Dataset& dataset, const train::FitOptions& options) {
  return train::run_fit(
      *this, [&dataset](std::optional<uint64_t>) { return dataset; }, std::nullopt, options);
}

train::History Model::fit(const Tensor& x, const Tensor& y, const train::FitOptions& options) {
  DTRAIN_CHECK(options.batch_size > 0, "fit: batch_size must be positive, got ",
               options.batch_size);
  DTRAIN_CHECK(x.defined() && y.defined() && x.rank() >= 1 && y.rank() >= 1 && x.dim(0) == y.dim(0),
               "fit: x and y must have the same number of examples, got ", x.shape().to_string(),
               " and ", y.shape().to_string());
  if (const distribute::Strategy* st = training_ ? training_->strategy : nullptr;
      st != nullptr && st->logical_replicas() > 0) {
    const int64_t l = st->logical_replicas();
    if (options.batch_size < l || options.batch_size % l != 0) {
      throw InvalidArgumentError(str_cat("fit: batch_size ", options.batch_size,
                                         " does not split into ", l,
                                         " logical replicas of equal size (", st->name(),
                                         " logical_replicas); use a multiple of ", l));
    }
  }
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
  // Under a multi-worker strategy each worker shuffles row indices and gathers only its rows of
  // each global batch (the same rows, in the same order, as slicing the global batches).
  distribute::Strategy* st = training_ ? training_->strategy : nullptr;
  const bool per_worker =
      st != nullptr && st->num_workers() > 1 && !train::is_parameter_server_strategy(st);
  return train::run_fit(
      *this,
      [&x, &y, n, batch, shuffle, per_worker, st](std::optional<uint64_t> s) {
        if (per_worker) {
          return distribute::worker_batches(
              {x, y}, {.batch_size = batch, .shuffle = shuffle, .seed = s}, *st);
        }
        data::Dataset ds = data::Dataset::from_tensor_slices({x, y});
        if (shuffle) ds = ds.shuffle(n, s, /*reshuffle_each_iteration=*/true);
        return ds.batch(batch);
      },
      seed, options, per_worker);
}

}  // namespace dtrain::nn
