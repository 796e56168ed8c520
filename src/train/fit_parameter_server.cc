// Model::fit under ParameterServerStrategy. The chief dispatches steps as closures
// ("dtrain.fit.train_step" with the batch's data position as arguments) so that a step names its
// own batch: a closure re-run on another worker after its worker died trains on the same data,
// and the servers ignore a second push of the same closure. Workers pull, compute and push; the
// chief only coordinates, checkpoints and evaluates. Not thread-safe (one fit per process).
#include "fit_parameter_server.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/core/random.h"
#include "dtrain/distribute/input.h"
#include "dtrain/distribute/parameter_server_strategy.h"
#include "dtrain/train/tensorboard.h"
#include "progress_bar.h"

namespace dtrain::train::detail {
namespace {

using distribute::ClusterCoordinator;
using distribute::ParameterServerStrategy;
using distribute::RemoteValue;
using Clock = std::chrono::steady_clock;

constexpr const char* kTrainStep = "dtrain.fit.train_step";
// Steps scheduled before the chief waits for them (TF's steps_per_execution-like chunk): the
// progress bar and callbacks advance per chunk, and checkpoints fall on chunk boundaries.
constexpr int64_t kChunk = 32;
constexpr int kMaxRecoveries = 5;

// Closure arguments: data pass and position, part, parts, seed present, seed bits, global step.
enum Arg { kPass, kPosition, kPart, kParts, kHasSeed, kSeed, kGlobalStep, kNumArgs };
// Closure results: loss * rows, rows, staleness, pull ms, push ms, then (total, count) per metric.
enum Result { kLossSum, kRows, kStaleness, kPullMs, kPushMs, kNumFixedResults };

// The worker's view of the training data: rebuilds the dataset when the chief's shuffle seed
// changes and walks forward through a pass without restarting it.
struct BatchSource {
  const std::function<data::Dataset(std::optional<uint64_t>)>* make;
  std::optional<uint64_t> seed;
  data::Dataset dataset;
  std::optional<data::Iterator> it;

  data::Element batch(std::optional<uint64_t> want_seed, int64_t pass, int64_t position) {
    if (!dataset.defined() || want_seed != seed) {
      dataset = (*make)(want_seed);
      seed = want_seed;
      it.reset();
    }
    if (!it || it->state().iteration != pass || it->state().position > position) {
      it.emplace(dataset.iterator_from(data::IteratorState{pass, position}));
    }
    data::Element e;
    while (it->state().position < position) {
      DTRAIN_CHECK(it->next(e), "fit: the training data ended before position ", position);
    }
    DTRAIN_CHECK(it->next(e), "fit: the training data has no batch at pass ", pass, " position ",
                 position);
    DTRAIN_CHECK(e.size() >= 2, "fit: dataset elements must be (x, y) pairs");
    return e;
  }
};

History serve_steps(nn::Model& model, ParameterServerStrategy& strategy, TrainingState& s,
                    const std::function<data::Dataset(std::optional<uint64_t>)>& make_dataset) {
  strategy.attach_variables(s.trainable);
  auto source = std::make_shared<BatchSource>();
  source->make = &make_dataset;
  strategy.register_function(kTrainStep, [&, source](std::span<const int64_t> args) {
    DTRAIN_CHECK(args.size() == kNumArgs, "fit: train step got ", args.size(), " arguments");
    const std::optional<uint64_t> seed =
        args[kHasSeed] != 0 ? std::optional<uint64_t>(static_cast<uint64_t>(args[kSeed]))
                            : std::nullopt;
    data::Element e = source->batch(seed, args[kPass], args[kPosition]);
    const int64_t global = e[0].dim(0);
    Tensor x = e[0], y = e[1];
    const int parts = static_cast<int>(args[kParts]);
    if (parts > 1) {
      const auto [b, end] = distribute::replica_rows(global, parts, static_cast<int>(args[kPart]));
      x = e[0].slice(b, end);
      y = e[1].slice(b, end);
    }
    const int64_t rows = x.dim(0);
    const auto t0 = Clock::now();
    const distribute::PullToken token = strategy.pull(s.trainable);
    const double pull_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::vector<double> out(kNumFixedResults, 0.0);
    s.grads.resize(s.trainable.size());
    if (rows > 0) {
      // Each worker task draws from its own random stream (Dropout), so that workers training on
      // different batches do not all apply the same masks.
      struct StreamScope {
        explicit StreamScope(int worker) { set_current_replica_stream({worker, 0}); }
        ~StreamScope() { set_current_replica_stream({}); }
      } stream_scope(strategy.cluster().task_type == "worker" ? strategy.cluster().task_index : 0);
      GradientTape tape;
      const Tensor y_pred = model(x, /*training=*/true);
      const Tensor loss = (*s.loss)(y, y_pred);
      // As in MultiWorkerMirrored: a part's mean loss weighted by its share of the global batch,
      // so the server's sum of the parts is the global batch's gradient.
      const Tensor scaled =
          parts > 1 ? scale(loss, static_cast<float>(rows) / static_cast<float>(global)) : loss;
      tape.gradient(scaled, s.trainable, s.grads);
      out[kLossSum] = loss.item() * static_cast<double>(rows);
      const Tensor pred = stop_gradient(y_pred);
      for (const auto& m : s.metrics) {
        m->reset_state();
        m->update_state(y, pred);
        const auto [total, count] = m->state();
        out.push_back(total);
        out.push_back(count);
      }
    } else {
      for (size_t v = 0; v < s.trainable.size(); ++v)
        s.grads[v] = Tensor::zeros(s.trainable[v]->shape());
      for (size_t m = 0; m < s.metrics.size(); ++m) {
        out.push_back(0);
        out.push_back(0);
      }
    }
    const distribute::PushResult pushed = strategy.push(token, s.grads,
                                                        {.closure_id = -1,
                                                         .step = args[kGlobalStep],
                                                         .part = static_cast<int>(args[kPart]),
                                                         .num_parts = parts});
    out[kRows] = static_cast<double>(rows);
    out[kStaleness] = static_cast<double>(pushed.staleness);
    out[kPullMs] = pull_ms;
    out[kPushMs] = pushed.push_ms;
    return out;
  });
  strategy.serve();
  return History();
}

struct Totals {
  double loss = 0, rows = 0, staleness_sum = 0, staleness_max = 0, pull_ms = 0, push_ms = 0;
  double closures = 0;
  std::vector<std::pair<double, double>> metrics;
};

}  // namespace

bool is_parameter_server_strategy(const distribute::Strategy* strategy) {
  return dynamic_cast<const ParameterServerStrategy*>(strategy) != nullptr;
}

History fit_parameter_server(
    nn::Model& model, const std::function<data::Dataset(std::optional<uint64_t>)>& make_dataset,
    std::optional<uint64_t> data_seed, const FitOptions& options) {
  TrainingState& s = *model.training_state();
  auto& strategy = dynamic_cast<ParameterServerStrategy&>(*s.strategy);
  DTRAIN_CHECK(options.epochs >= 0 && options.initial_epoch >= 0,
               "fit: epochs and initial_epoch must be non-negative");
  DTRAIN_CHECK(!options.steps_per_epoch || *options.steps_per_epoch > 0,
               "fit: steps_per_epoch must be positive");
  data::Dataset dataset = make_dataset(data_seed);
  if (!model.built()) {
    data::Iterator peek = dataset.iterator(options.initial_epoch);
    data::Element e;
    DTRAIN_CHECK(peek.next(e) && e.size() >= 2, "fit: the training dataset is empty or not (x, y)");
    model.build(e[0].shape().without_first());
  }
  s.trainable = model.trainable_variables();
  if (!strategy.is_chief()) return serve_steps(model, strategy, s, make_dataset);

  const int64_t card = dataset.cardinality();
  DTRAIN_CHECK(options.steps_per_epoch || card >= 0,
               "fit under ParameterServerStrategy: the dataset's length is unknown; pass "
               "steps_per_epoch");
  const int64_t steps = options.steps_per_epoch ? *options.steps_per_epoch : card;
  const int verbose = options.verbose >= 0 ? options.verbose : (stdout_is_terminal() ? 1 : 2);
  const int parts = strategy.synchronous() ? strategy.num_worker_tasks() : 1;

  // The initial values, for a restart from scratch when a server is lost before any checkpoint.
  std::vector<Tensor> initial;
  for (Variable* v : s.trainable) initial.push_back(v->tensor().clone());
  strategy.create_variables(s.trainable, s.optimizer->get_config());
  ClusterCoordinator coordinator(strategy);

  auto history = std::make_shared<History>();
  std::vector<std::shared_ptr<Callback>> callbacks = options.callbacks;
  if (!options.logdir.empty()) callbacks.push_back(std::make_shared<TensorBoard>(options.logdir));
  callbacks.push_back(history);
  for (const auto& cb : callbacks) cb->set_model(&model);
  std::optional<data::Dataset> validation;
  if (options.validation_data) validation = options.validation_data->dataset(options.batch_size);

  struct RestartPoint {
    int64_t epoch;
    int64_t step;
    std::string prefix;  // "" : the initial values
  } restart{options.initial_epoch, 0, ""};
  int64_t checkpoints = 0;
  auto save = [&](int64_t epoch, int64_t step) {
    const std::string prefix = str_cat(options.checkpoint_dir, "/ckpt-", ++checkpoints);
    strategy.save(prefix);
    restart = {epoch, step, prefix};
  };

  // Position of the data for step `step` of epoch `epoch` (Keras: with steps_per_epoch the data
  // stream continues across epochs; otherwise each epoch is one pass).
  auto position = [&](int64_t epoch, int64_t step) -> std::pair<int64_t, int64_t> {
    if (!options.steps_per_epoch) return {epoch, step};
    const int64_t g = (epoch - options.initial_epoch) * steps + step;
    if (card == data::kInfiniteCardinality || card < 0) return {options.initial_epoch, g};
    return {options.initial_epoch + g / card, g % card};
  };

  Logs logs;
  s.stop_training = false;
  for (const auto& cb : callbacks) cb->on_train_begin(logs);
  int64_t epoch = options.initial_epoch, step = 0;
  std::vector<std::vector<double>> results;  // per step of this epoch, summed over parts
  std::optional<ProgressBar> bar;
  int recoveries = 0;
  while (epoch < options.epochs && !s.stop_training) {
    if (step == 0) {
      results.clear();
      logs.clear();
      s.epoch = epoch;
      for (const auto& cb : callbacks) cb->on_epoch_begin(epoch, logs);
      if (verbose > 0)
        std::printf("Epoch %lld/%lld\n", static_cast<long long>(epoch + 1),
                    static_cast<long long>(options.epochs));
      bar.emplace(verbose, steps);
    }
    int64_t end = std::min(steps, (step / kChunk + 1) * kChunk);
    if (options.save_checkpoints && options.checkpoint_every > 0) {
      end = std::min(end, (step / options.checkpoint_every + 1) * options.checkpoint_every);
    }
    std::vector<std::vector<RemoteValue>> values;
    try {
      for (int64_t i = step; i < end; ++i) {
        const auto [pass, pos] = position(epoch, i);
        const int64_t global_step = (epoch - options.initial_epoch) * steps + i;
        auto& per_step = values.emplace_back();
        for (int p = 0; p < parts; ++p) {
          per_step.push_back(coordinator.schedule(
              kTrainStep, {pass, pos, p, parts, data_seed ? 1 : 0,
                           static_cast<int64_t>(data_seed.value_or(0)), global_step}));
        }
        // Synchronous mode: the servers apply step i when all its parts arrived; the next
        // step must pull after that.
        if (parts > 1) coordinator.join();
      }
      coordinator.join();
    } catch (const UnavailableError& e) {
      if (++recoveries > kMaxRecoveries) throw;
      std::fprintf(stderr, "fit: parameter server lost: %s\nfit: restoring every server from %s\n",
                   e.what(),
                   restart.prefix.empty() ? "the initial values" : restart.prefix.c_str());
      std::fflush(stderr);
      if (restart.prefix.empty()) {
        for (size_t v = 0; v < s.trainable.size(); ++v) s.trainable[v]->assign(initial[v]);
      }
      strategy.recover(s.trainable, restart.prefix);
      // The workers' channels to the restarted server may still be in gRPC's reconnect backoff
      // (at most 500 ms, see ps_channel in parameter_server_strategy.cc), where calls fail at once:
      // let them reconnect before rescheduling, or every retry would fail and count as a new
      // recovery.
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      coordinator.reset_error();
      if (restart.epoch != epoch) {
        epoch = restart.epoch;
        step = 0;
        continue;
      }
      step = restart.step;
      results.resize(static_cast<size_t>(step));
      continue;
    }
    for (int64_t i = step; i < end; ++i) {
      std::vector<double> sum;
      for (const RemoteValue& rv : values[static_cast<size_t>(i - step)]) {
        const std::vector<double> r = rv.fetch();
        if (sum.empty()) sum.assign(r.size(), 0.0);
        for (size_t k = 0; k < r.size() && k < sum.size(); ++k) {
          sum[k] = k == kStaleness ? std::max(sum[k], r[k]) : sum[k] + r[k];
        }
      }
      results.push_back(std::move(sum));
    }
    // Running logs over the epoch so far.
    Totals t;
    t.metrics.assign(s.metrics.size(), {0.0, 0.0});
    for (const auto& r : results) {
      t.loss += r[kLossSum];
      t.rows += r[kRows];
      t.staleness_sum += r[kStaleness];
      t.staleness_max = std::max(t.staleness_max, r[kStaleness]);
      t.pull_ms += r[kPullMs];
      t.push_ms += r[kPushMs];
      t.closures += parts;
      for (size_t m = 0; m < s.metrics.size(); ++m) {
        t.metrics[m].first += r[kNumFixedResults + 2 * m];
        t.metrics[m].second += r[kNumFixedResults + 2 * m + 1];
      }
    }
    s.loss_tracker.set_state(t.loss, t.rows);
    for (size_t m = 0; m < s.metrics.size(); ++m) {
      s.metrics[m]->set_state(t.metrics[m].first, t.metrics[m].second);
    }
    logs["loss"] = s.loss_tracker.result();
    for (const auto& m : s.metrics) logs[m->name()] = m->result();
    for (int64_t i = step; i < end; ++i) {
      for (const auto& cb : callbacks) cb->on_train_batch_end(i, logs);
    }
    step = end;
    s.step_in_epoch = step;
    bar->update(step, logs);
    const int64_t global_step = (epoch - options.initial_epoch) * steps + step;
    const bool epoch_done = step >= steps || s.stop_training;
    if (options.save_checkpoints && options.checkpoint_every > 0 && !epoch_done &&
        global_step % options.checkpoint_every == 0) {
      save(epoch, step);
    }
    if (!epoch_done) continue;
    const double n = std::max(1.0, static_cast<double>(results.size()));
    logs["staleness_mean"] = t.staleness_sum / n;
    logs["staleness_max"] = t.staleness_max;
    logs["pull_ms"] = t.pull_ms / std::max(1.0, t.closures);
    logs["push_ms"] = t.push_ms / std::max(1.0, t.closures);
    if (validation) {
      strategy.pull(s.trainable);
      const Logs val = model.evaluate(*validation, {});
      for (const auto& [k, v] : val) logs["val_" + k] = v;
    }
    bar->update(step, logs, true);
    if (options.save_checkpoints) save(epoch + 1, 0);
    s.epoch = epoch + 1;
    s.step_in_epoch = 0;
    for (const auto& cb : callbacks) cb->on_epoch_end(epoch, logs);
    ++epoch;
    step = 0;
  }
  strategy.pull(s.trainable);  // the chief's model holds the trained values
  coordinator.shutdown_workers();
  if (verbose > 0) {
    const distribute::CoordinatorStats cs = coordinator.stats();
    std::fprintf(stderr,
                 "fit: %lld closures on %d workers (%lld re-run after a worker was lost), "
                 "%d server recoveries\n",
                 static_cast<long long>(cs.completed), strategy.num_worker_tasks(),
                 static_cast<long long>(cs.reassigned), recoveries);
  }
  for (const auto& cb : callbacks) cb->on_train_end(logs);
  return *history;
}

}  // namespace dtrain::train::detail
