// fit()'s step under ParameterServerStrategy. The chief schedules steps as closures
// ("dtrain.fit.train_step" with the batch's data position as arguments) so that a step names its
// own batch: a closure re-run on another worker after its worker died trains on the same data,
// and the servers ignore a second push of the same closure. Workers pull, compute and push; the
// chief only coordinates, checkpoints the servers (its backup callback) and evaluates. A lost
// server is restored from the newest backup and the loop rewinds to it. Not thread-safe (one
// fit per process).
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/core/random.h"
#include "dtrain/distribute/input.h"
#include "dtrain/distribute/parameter_server_strategy.h"
#include "dtrain/nn/output_mask.h"
#include "dtrain/nn/state_updates.h"
#include "fit_loop.h"
#include "train_step.h"

namespace dtrain::train {
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
  const MakeDataset* make;
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

class ParameterServerStep;

// The largest N of the "ckpt-<N>.index" files in `dir` (0 when none).
int64_t newest_number(const std::string& dir) {
  int64_t newest = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) != 0 || name.size() < 11 ||
        name.compare(name.size() - 6, 6, ".index") != 0) {
      continue;
    }
    const std::string digits = name.substr(5, name.size() - 11);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (digits.size() < 18) newest = std::max<int64_t>(newest, std::stoll(digits));
  }
  return newest;
}

// Deletes a merged checkpoint's files: `<prefix>.index` and `<prefix>.data-*`.
void remove_checkpoint_files(const std::string& prefix) {
  const std::filesystem::path p(prefix);
  const std::string stem = p.filename().string();
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name == stem + ".index" || name.rfind(stem + ".data-", 0) == 0) {
      std::filesystem::remove(e.path(), ec);
    }
  }
}

// fit(save_checkpoints) under the strategy: the servers write their shards and the chief merges
// the index (strategy.save), every checkpoint_every steps and at the end of each epoch.
class ServerBackup final : public Callback {
 public:
  explicit ServerBackup(ParameterServerStep& step) : step_(step) {}
  // Resumes from the newest valid backup of the servers in checkpoint_dir (options.resume).
  void on_train_begin(const Logs&) override;
  void on_epoch_begin(int64_t epoch, const Logs&) override { epoch_ = epoch; }
  void on_train_batch_end(int64_t batch, const Logs&) override;
  void on_epoch_end(int64_t epoch, const Logs&) override;

 private:
  ParameterServerStep& step_;
  int64_t epoch_ = 0;
};

class ParameterServerStep final : public TrainStep {
 public:
  ParameterServerStep(nn::Model& model, TrainingState& s, const FitOptions& options,
                      std::optional<uint64_t> data_seed, int64_t steps)
      : model_(model),
        s_(s),
        options_(options),
        strategy_(dynamic_cast<ParameterServerStrategy&>(*s.strategy)),
        data_seed_(data_seed),
        steps_(steps),
        parts_(strategy_.synchronous() ? strategy_.num_worker_tasks() : 1),
        restart_{options.initial_epoch, 0, ""} {
    DTRAIN_CHECK(!options.skip_nonfinite,
                 "fit: skip_nonfinite is not supported under ParameterServerStrategy (the servers "
                 "apply each worker's gradients as they arrive)");
    // The servers hold the trainable variables only: moving statistics updated on a worker
    // would stay on that worker, and the chief (which evaluates and saves) would keep their
    // initial values. Refused until they live on the servers too.
    for (nn::StatefulLayer* l : nn::stateful_layers(model)) {
      if (auto* layer = dynamic_cast<nn::Layer*>(l); layer != nullptr && layer->trainable()) {
        throw UnimplementedError(str_cat(
            "fit: ", layer->class_name(), " '", layer->name(),
            "' updates moving statistics in training, which ParameterServerStrategy does not "
            "support (the servers hold trainable variables only): use MirroredStrategy or "
            "MultiWorkerMirroredStrategy, or freeze the layer (trainable = false)"));
      }
    }
    trainable_ = model.trainable_variables();
    // The initial values, for a restart from scratch when a server is lost before any backup.
    for (Variable* v : trainable_) initial_.push_back(v->tensor().clone());
    strategy_.create_variables(trainable_, s.optimizer->get_config());
    coordinator_ = std::make_unique<ClusterCoordinator>(strategy_);
  }

  bool reads_batches() const override { return false; }
  bool reports_progress() const override { return false; }

  int64_t steps_per_call(int64_t global_step, int64_t left) const override {
    int64_t n = std::min(left, kChunk - global_step % kChunk);
    if (options_.save_checkpoints && options_.checkpoint_every > 0) {
      n = std::min(n, options_.checkpoint_every - global_step % options_.checkpoint_every);
    }
    return std::max<int64_t>(n, 1);
  }

  void begin() override {}
  void begin_epoch(int64_t epoch) override {
    epoch_ = epoch;
    results_.clear();
  }

  StepOutcome run(std::span<const StepInput> steps) override {
    std::vector<std::vector<RemoteValue>> values;
    try {
      for (const StepInput& in : steps) {
        auto& per_step = values.emplace_back();
        for (int p = 0; p < parts_; ++p) {
          per_step.push_back(coordinator_->schedule(
              kTrainStep, {in.pass, in.position, p, parts_, data_seed_ ? 1 : 0,
                           static_cast<int64_t>(data_seed_.value_or(0)), in.global_step}));
        }
        // Synchronous mode: the servers apply step i when all its parts arrived; the next
        // step must pull after that.
        if (parts_ > 1) coordinator_->join();
      }
      coordinator_->join();
    } catch (const UnavailableError& e) {
      return recover(e);
    }
    for (const auto& per_step : values) {
      std::vector<double> sum;
      for (const RemoteValue& rv : per_step) {
        const std::vector<double> r = rv.fetch();
        if (sum.empty()) sum.assign(r.size(), 0.0);
        for (size_t k = 0; k < r.size() && k < sum.size(); ++k) {
          sum[k] = k == kStaleness ? std::max(sum[k], r[k]) : sum[k] + r[k];
        }
      }
      results_.push_back(std::move(sum));
    }
    set_metric_states();
    return {};
  }

  void end_epoch(nn::Logs& logs) override {
    const double n = std::max(1.0, static_cast<double>(results_.size()));
    logs["staleness_mean"] = totals_.staleness_sum / n;
    logs["staleness_max"] = totals_.staleness_max;
    logs["pull_ms"] = totals_.pull_ms / std::max(1.0, totals_.closures);
    logs["push_ms"] = totals_.push_ms / std::max(1.0, totals_.closures);
  }

  void sync_model() override { strategy_.pull(trainable_); }

  void end(int verbose) override {
    coordinator_->shutdown_workers();
    if (verbose > 0) {
      const distribute::CoordinatorStats cs = coordinator_->stats();
      std::fprintf(stderr,
                   "fit: %lld closures on %d workers (%lld re-run after a worker was lost), "
                   "%d server recoveries\n",
                   static_cast<long long>(cs.completed), strategy_.num_worker_tasks(),
                   static_cast<long long>(cs.reassigned), recoveries_);
    }
  }

  std::shared_ptr<Callback> make_backup(const FitOptions&) override {
    return std::make_shared<ServerBackup>(*this);
  }

  // ServerBackup: after step `step` of `epoch` (1-based), at a checkpoint_every boundary.
  void maybe_save(int64_t epoch, int64_t step) {
    if (options_.checkpoint_every <= 0 || step >= steps_) return;
    const int64_t global = (epoch - options_.initial_epoch) * steps_ + step;
    if (global % options_.checkpoint_every == 0) save(epoch, step);
  }
  void save(int64_t epoch, int64_t step) {
    const std::string prefix = str_cat(options_.checkpoint_dir, "/ckpt-", ++checkpoints_);
    strategy_.save(prefix, {.epoch = epoch, .step = step});
    restart_ = {epoch, step, prefix};
    // Keep the newest kKeep backups this run wrote (the older ones' files go).
    written_.push_back(prefix);
    while (written_.size() > kKeep) {
      remove_checkpoint_files(written_.front());
      written_.erase(written_.begin());
    }
  }

  // ServerBackup::on_train_begin: the servers take the newest valid backup in checkpoint_dir;
  // returns where training continues and the backup's prefix.
  std::optional<std::pair<FitPosition, std::string>> restore_latest() {
    // Number new backups after every existing one, whether or not it is restored.
    checkpoints_ = std::max(checkpoints_, newest_number(options_.checkpoint_dir));
    if (!options_.resume) return std::nullopt;
    const auto found = strategy_.restore_latest(options_.checkpoint_dir);
    if (!found) return std::nullopt;
    restart_ = {found->position.epoch, found->position.step, found->prefix};
    FitPosition at;
    at.epoch = found->position.epoch;
    at.step_in_epoch = found->position.step;
    at.data_seed = data_seed_;
    std::fprintf(stderr, "fit: resumed the parameter servers from %s at epoch %lld, step %lld\n",
                 found->prefix.c_str(), static_cast<long long>(at.epoch + 1),
                 static_cast<long long>(at.step_in_epoch));
    return std::make_pair(at, found->prefix);
  }

 private:
  struct RestartPoint {
    int64_t epoch;
    int64_t step;
    std::string prefix;  // "": the initial values
  };
  struct Totals {
    double loss = 0, rows = 0, staleness_sum = 0, staleness_max = 0, pull_ms = 0, push_ms = 0;
    double closures = 0;
  };

  StepOutcome recover(const UnavailableError& e) {
    if (++recoveries_ > kMaxRecoveries) throw e;
    std::fprintf(stderr, "fit: parameter server lost: %s\nfit: restoring every server from %s\n",
                 e.what(),
                 restart_.prefix.empty() ? "the initial values" : restart_.prefix.c_str());
    std::fflush(stderr);
    if (restart_.prefix.empty()) {
      for (size_t v = 0; v < trainable_.size(); ++v) trainable_[v]->assign(initial_[v]);
    }
    // recover() retries until every server is back and holds the restored state, and calls wait
    // for a reconnecting channel, so the closures can be rescheduled at once.
    strategy_.recover(trainable_, restart_.prefix);
    coordinator_->reset_error();
    StepOutcome out;
    if (restart_.epoch != epoch_) {
      out.rewind = StepOutcome::Rewind{restart_.epoch, 0};
    } else {
      out.rewind = StepOutcome::Rewind{epoch_, restart_.step};
      results_.resize(static_cast<size_t>(restart_.step));
      set_metric_states();
    }
    return out;
  }

  // Running totals over the epoch so far, into the loss tracker and metrics.
  void set_metric_states() {
    totals_ = {};
    std::vector<std::pair<double, double>> metrics(s_.metrics.size(), {0.0, 0.0});
    for (const auto& r : results_) {
      totals_.loss += r[kLossSum];
      totals_.rows += r[kRows];
      totals_.staleness_sum += r[kStaleness];
      totals_.staleness_max = std::max(totals_.staleness_max, r[kStaleness]);
      totals_.pull_ms += r[kPullMs];
      totals_.push_ms += r[kPushMs];
      totals_.closures += parts_;
      for (size_t m = 0; m < s_.metrics.size(); ++m) {
        metrics[m].first += r[kNumFixedResults + 2 * m];
        metrics[m].second += r[kNumFixedResults + 2 * m + 1];
      }
    }
    s_.loss_tracker.set_state(totals_.loss, totals_.rows);
    for (size_t m = 0; m < s_.metrics.size(); ++m) {
      s_.metrics[m]->set_state(metrics[m].first, metrics[m].second);
    }
  }

  nn::Model& model_;
  TrainingState& s_;
  const FitOptions& options_;
  ParameterServerStrategy& strategy_;
  const std::optional<uint64_t> data_seed_;
  const int64_t steps_;
  const int parts_;
  std::vector<Variable*> trainable_;
  std::vector<Tensor> initial_;
  std::unique_ptr<ClusterCoordinator> coordinator_;
  static constexpr size_t kKeep = 3;
  RestartPoint restart_;
  int64_t checkpoints_ = 0;
  std::vector<std::string> written_;  // backups this run wrote, oldest first
  int recoveries_ = 0;
  int64_t epoch_ = 0;
  std::vector<std::vector<double>> results_;  // per step of this epoch, summed over parts
  Totals totals_;
};

void ServerBackup::on_train_begin(const Logs&) {
  const auto at = step_.restore_latest();
  if (!at) return;
  TrainingState& s = state_of(*model(), "fit");
  s.loop->resume_at(at->first, at->second);
}

void ServerBackup::on_train_batch_end(int64_t batch, const Logs&) {
  step_.maybe_save(epoch_, batch + 1);
}
void ServerBackup::on_epoch_end(int64_t epoch, const Logs&) { step_.save(epoch + 1, 0); }

}  // namespace

bool is_parameter_server_strategy(const distribute::Strategy* strategy) {
  return dynamic_cast<const ParameterServerStrategy*>(strategy) != nullptr;
}

std::unique_ptr<TrainStep> make_parameter_server_step(nn::Model& model, TrainingState& s,
                                                      const FitOptions& options,
                                                      const MakeDataset& make_dataset,
                                                      std::optional<uint64_t> data_seed) {
  const int64_t card = make_dataset(data_seed).cardinality();
  DTRAIN_CHECK(options.steps_per_epoch || card >= 0,
               "fit under ParameterServerStrategy: the dataset's length is unknown; pass "
               "steps_per_epoch");
  const int64_t steps = options.steps_per_epoch ? *options.steps_per_epoch : card;
  return std::make_unique<ParameterServerStep>(model, s, options, data_seed, steps);
}

void serve_parameter_server_steps(nn::Model& model, TrainingState& s,
                                  const MakeDataset& make_dataset, const FitOptions& options) {
  auto& strategy = dynamic_cast<ParameterServerStrategy&>(*s.strategy);
  if (!model.built()) {
    data::Iterator peek = make_dataset(std::nullopt).iterator(options.initial_epoch);
    data::Element e;
    DTRAIN_CHECK(peek.next(e) && e.size() >= 2, "fit: the training dataset is empty or not (x, y)");
    model.build(e[0].shape().without_first());
  }
  std::vector<Variable*> trainable = model.trainable_variables();
  std::vector<Tensor> grads(trainable.size());
  strategy.attach_variables(trainable);
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
    const distribute::PullToken token = strategy.pull(trainable);
    const double pull_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::vector<double> out(kNumFixedResults, 0.0);
    if (rows > 0) {
      // Each worker task draws from its own random stream (Dropout), so that workers training on
      // different batches do not all apply the same masks.
      struct StreamScope {
        explicit StreamScope(int worker) { set_current_replica_stream({worker, 0}); }
        ~StreamScope() { set_current_replica_stream({}); }
      } stream_scope(strategy.cluster().task_type == "worker" ? strategy.cluster().task_index : 0);
      GradientTape tape;
      const auto [y_pred, mask] = nn::call_with_output_mask(model, x, /*training=*/true);
      const Tensor loss = (*s.loss)(y, y_pred, mask);
      // As in MultiWorkerMirrored: a part's mean loss weighted by its share of the global batch,
      // so the server's sum of the parts is the global batch's gradient.
      const Tensor scaled =
          parts > 1 ? scale(loss, static_cast<float>(rows) / static_cast<float>(global)) : loss;
      tape.gradient(scaled, trainable, grads);
      out[kLossSum] = loss.item() * static_cast<double>(rows);
      const Tensor pred = stop_gradient(y_pred);
      for (const auto& m : s.metrics) {
        m->reset_state();
        m->update_state(y, pred, mask);
        const auto [total, count] = m->state();
        out.push_back(total);
        out.push_back(count);
      }
    } else {
      for (size_t v = 0; v < trainable.size(); ++v) grads[v] = Tensor::zeros(trainable[v]->shape());
      for (size_t m = 0; m < s.metrics.size(); ++m) {
        out.push_back(0);
        out.push_back(0);
      }
    }
    const distribute::PushResult pushed = strategy.push(token, grads,
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
}

}  // namespace dtrain::train
