// The step of fit() under MirroredStrategy and MultiWorkerMirroredStrategy (TF's semantics):
// this worker takes its part of the global batch, each local replica computes the gradient of
// its loss scaled by (replica rows / global rows) on its own tape and thread, and
// Strategy::reduce_gradients sums them in replica order, then across workers, so that every
// worker applies the same update to its (identical) variables. With one worker, no
// non-finite check and no clipping by norm the replica threads apply the update, each on its
// own element range, in the same pass as the sum. With MultiWorkerOptions::overlap_gradients
// (one local replica, several workers) the all-reduce runs in buckets on a communication thread
// while backward goes on (distribute/gradient_overlap.h): the same sums, bitwise.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <tuple>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/distribute/gradient_overlap.h"
#include "dtrain/distribute/input.h"
#include "dtrain/distribute/sharded_update.h"
#include "dtrain/distribute/sync_check.h"
#include "dtrain/nn/output_mask.h"
#include "dtrain/ops/tensor_ops.h"
#include "dtrain/train/preemption.h"
#include "state_updates.h"
#include "train_step.h"

namespace dtrain::train {
namespace {

// Seconds since `t`, which moves to now (for StepTimes).
double lap(std::chrono::steady_clock::time_point& t) {
  const auto now = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(now - t).count();
  t = now;
  return s;
}

class ReplicatedStep final : public TrainStep {
 public:
  ReplicatedStep(nn::Model& model, TrainingState& s, const FitOptions& options)
      : model_(model),
        s_(s),
        st_(*s.strategy),
        skip_nonfinite_(options.skip_nonfinite),
        verify_sync_every_(options.verify_sync_every) {}

  void begin() override {
    trainable_ = model_.trainable_variables();
    sharded_.reset();  // hands its slots back before anything reads the optimizer
    if (verify_sync_every_ > 0) {
      sync_vars_ = model_.weights();
      s_.optimizer->build(trainable_);  // slots exist before the first check
      for (Variable* v : s_.optimizer->variables()) sync_vars_.push_back(v);
    }
    grads_.clear();
    for (Variable* v : trainable_) grads_.push_back(Tensor(v->shape()));
    replicas_.resize(static_cast<size_t>(st_.num_local_replicas()));
    per_replica_.resize(replicas_.size());
    // Preemption flag and non-finite-loss count, reduced with the gradients (one bucket), so
    // every worker learns at this step whether any of them must stop or skip.
    flags_ = Tensor(Shape{2});
    // Moving statistics (BatchNormalization) ride the same all-reduce as the flags (not under
    // logical replicas: StateUpdates::gather sums them in logical order).
    state_updates_.begin(model_, st_);
    extra_ = {flags_};
    if (state_updates_.needs_all_reduce()) extra_.push_back(state_updates_.buffer());
    update_ = [this](int r, int parts) { s_.optimizer->update_part(out_, trainable_, r, parts); };
    sharded_ = st_.make_sharded_update(trainable_, extra_, *s_.optimizer);
    if (sharded_) {
      // Each worker holds only its rows' slots now: compare the variables and the step count.
      if (verify_sync_every_ > 0) {
        sync_vars_ = model_.weights();
        sync_vars_.push_back(&s_.optimizer->iterations_variable());
      }
      grads_.clear();  // the sums live in the shards
    }
    overlap_ = sharded_ ? nullptr : st_.make_overlapped_reduction(grads_, extra_);
    if (overlap_) {
      on_final_ = [this](size_t k) { overlap_->gradient_ready(k, replicas_[0].grads[k]); };
    }
    if (!s_.variables_synced) {
      // Every worker starts from the chief's variables (TF broadcasts them when variables are
      // created in scope).
      s_.variables_synced = true;
      if (st_.num_workers() > 1) {
        std::vector<Tensor> values;
        for (Variable* v : model_.weights()) values.push_back(v->tensor());
        st_.broadcast_from_chief(values);
      }
    }
  }

  StepOutcome run(std::span<const StepInput> steps) override {
    const data::Element& batch = *steps[0].batch;
    const Tensor& x = batch[0];
    const Tensor& y = batch[1];
    const int local = st_.num_local_replicas();
    const int parts = st_.num_replicas_in_sync();
    // Per-worker input: x and y hold this worker's rows, then comes the global row count.
    int64_t global = x.dim(0), first_row = 0;
    if (s_.per_worker_input) {
      DTRAIN_INTERNAL_CHECK(batch.size() == 3 && batch[2].dtype() == DType::kInt64,
                            "fit: per-worker batches carry the global row count");
      global = batch[2].data<int64_t>()[0];
      first_row = distribute::worker_rows(global, st_).first;
    }
    for (int r = 0; r < local; ++r) {
      const auto [b, e] = distribute::replica_rows(global, parts, st_.replica_id(r));
      replicas_[r].x = x.slice(b - first_row, e - first_row);
      replicas_[r].y = y.slice(b - first_row, e - first_row);
    }
    global_ = global;
    StepTimes& times = s_.step_times;
    times.measured = true;
    auto t = std::chrono::steady_clock::now();
    try {
      st_.run([this](int r) { compute(r); });
    } catch (...) {
      if (overlap_) overlap_->abandon();
      throw;
    }
    state_updates_.gather(local);
    times.compute += lap(t);
    // Profiling (TensorBoard profile_steps): the time until the slowest worker is ready is
    // waiting, not communication. Not with overlap: its buckets are on the wire already.
    if (times.measure_waiting && !overlap_ && st_.num_workers() > 1) {
      st_.barrier();
      times.waiting += lap(t);
    }

    int64_t nonfinite_loss = 0;
    for (int r = 0; r < local; ++r) {
      per_replica_[r] = std::move(replicas_[r].grads);  // moved back below: no allocation
      if (replicas_[r].y_pred.defined() && !std::isfinite(replicas_[r].loss)) ++nonfinite_loss;
    }
    // One replica whose gradients are all defined: reduce in place (no copy).
    const bool in_place = !overlap_ && local == 1 && per_replica_[0].size() == trainable_.size() &&
                          std::all_of(per_replica_[0].begin(), per_replica_[0].end(),
                                      [](const Tensor& g) { return g.defined(); });
    out_ = in_place ? std::span<Tensor>(per_replica_[0]) : std::span<Tensor>(grads_);
    flags_.data<float>()[0] = preemption_requested() ? 1.0f : 0.0f;
    flags_.data<float>()[1] = static_cast<float>(nonfinite_loss);
    // Fused: the replica threads update their element ranges as soon as they are summed. Not
    // when a non-finite step may be skipped, nor when clipping by norm needs the norm of the
    // whole reduced gradient before any range is updated (prepare_update computes it after the
    // reduction, serially, so the result is the same for any number of replicas).
    const bool update_now = !skip_nonfinite_ && !s_.optimizer->clipping().by_norm();
    if (sharded_) {
      StepOutcome outcome = run_sharded();
      times.communication += lap(t);
      for (int r = 0; r < local; ++r) replicas_[r].grads = std::move(per_replica_[r]);
      return finish_step(outcome, t);
    }
    if (overlap_) {
      // The buckets were reduced as backward finished them; the flags and moving statistics go
      // last. The update then runs as after reduce_gradients with several workers.
      overlap_->finish();
      times.communication += lap(t);
      if (update_now) {
        s_.optimizer->prepare_update(out_, trainable_);
        update_(0, 1);
      }
    } else {
      if (update_now) s_.optimizer->prepare_update(out_, trainable_);
      times.compute += lap(t);
      st_.reduce_gradients(
          per_replica_, out_, distribute::ReduceOp::kSum,
          {.extra = std::span<Tensor>(extra_), .then = update_now ? &update_ : nullptr});
      times.communication += lap(t);
    }
    // Applied whether or not the gradients are (the forward pass ran, as in Keras).
    state_updates_.apply(st_.num_replicas_in_sync());
    StepOutcome outcome;
    outcome.stop = flags_.data<float>()[0] > 0.0f;
    if (update_now) {
      s_.optimizer->finish_update();
    } else {
      // After the reduction every worker sees the same sums and flags, so all skip (or apply)
      // together: the same rule as the one-device step (loss and gradients).
      outcome.applied = !skip_nonfinite_ || (flags_.data<float>()[1] == 0.0f && all_finite(out_));
      if (outcome.applied) {
        s_.optimizer->prepare_update(out_, trainable_);
        if (local == 1) {
          update_(0, 1);
        } else {
          st_.run([this, local](int r) { update_(r, local); });
        }
        s_.optimizer->finish_update();
      }
    }
    for (int r = 0; r < local; ++r) replicas_[r].grads = std::move(per_replica_[r]);
    return finish_step(outcome, t);
  }

  void end_epoch(nn::Logs& logs) override {
    if (!sharded_) return;
    // Per worker: what sharding saves (optimizer slots; gradients with stage 2).
    logs["optimizer_slot_bytes"] = static_cast<double>(sharded_->slot_bytes());
    logs["gradient_bytes"] = static_cast<double>(sharded_->gradient_bytes());
  }

  void end(int /*verbose*/) override {
    // The optimizer looks unsharded again (full slots), for model.save and checkpoints.
    if (sharded_) sharded_->gather_slots();
  }

  // A checkpoint's object graph asks the optimizer for every variable's slots: gather them
  // (every worker backs up and snapshots at the same steps); the next reduce() shards them.
  void before_checkpoint() override {
    if (sharded_) sharded_->gather_slots();
  }

 private:
  // The ZeRO step: the gradients summed into this worker's shard, the flags and moving
  // statistics everywhere; the update of its rows; the variables all-gathered.
  StepOutcome run_sharded() {
    sharded_->reduce(per_replica_[0]);
    state_updates_.apply(st_.num_replicas_in_sync());
    StepOutcome outcome;
    outcome.stop = flags_.data<float>()[0] > 0.0f;
    outcome.applied =
        !skip_nonfinite_ || (flags_.data<float>()[1] == 0.0f && sharded_->all_finite());
    if (outcome.applied) sharded_->apply();
    return outcome;
  }

  // `t`: when the step's last timed part ended (StepTimes).
  StepOutcome finish_step(const StepOutcome& outcome, std::chrono::steady_clock::time_point t) {
    const int local = st_.num_local_replicas();
    StepTimes& times = s_.step_times;
    times.compute += lap(t);
    ++steps_run_;
    if (verify_sync_every_ > 0 && steps_run_ % verify_sync_every_ == 0) {
      distribute::verify_sync(st_, sync_vars_, steps_run_);
      times.communication += lap(t);
    }
    if (!outcome.applied) return outcome;
    if (st_.logical_replicas() > 0) {
      update_metrics_by_logical_replica();
      times.compute += lap(t);
      return outcome;
    }
    for (int r = 0; r < local; ++r) {
      const Replica& rep = replicas_[r];
      if (!rep.y_pred.defined()) continue;
      s_.loss_tracker.update_state(rep.loss, static_cast<double>(rep.x.dim(0)));
      for (const auto& m : s_.metrics) m->update_state(rep.y, rep.y_pred, rep.mask);
    }
    times.compute += lap(t);
    return outcome;
  }

 private:
  struct Replica {
    std::vector<Tensor> grads;
    Tensor x, y, y_pred, mask;  // mask: y_pred's Keras mask (nn/output_mask.h)
    double loss = 0;
  };

  // Logical replicas: every worker holds the metrics of the whole global batch, each logical
  // replica's contribution added in logical order, so the partial sums (and a backup or snapshot
  // of any rank) do not depend on the number of workers. Each local replica's contribution is
  // taken alone (the metric reset, updated with its rows, read, put back), all-gathered (zeros
  // for the logical replicas of other workers: adding them changes no bit) and added in order.
  void update_metrics_by_logical_replica() {
    const int num_logical = st_.logical_replicas();
    std::vector<nn::Metric*> metrics = s_.all_metrics();
    const int64_t m = static_cast<int64_t>(metrics.size());
    if (!metric_parts_.defined() || metric_parts_.num_elements() != num_logical * m * 2) {
      metric_parts_ = Tensor(DType::kFloat64, Shape{num_logical * m * 2});
      metric_gathered_ = Tensor(DType::kFloat64, Shape{st_.num_workers(), num_logical * m * 2});
    }
    double* parts = metric_parts_.data<double>();
    std::fill(parts, parts + metric_parts_.num_elements(), 0.0);
    std::vector<std::pair<double, double>> saved;
    for (nn::Metric* metric : metrics) saved.push_back(metric->state());
    for (int r = 0; r < st_.num_local_replicas(); ++r) {
      const Replica& rep = replicas_[r];
      if (!rep.y_pred.defined()) continue;
      double* at = parts + st_.replica_id(r) * m * 2;
      s_.loss_tracker.reset_state();
      s_.loss_tracker.update_state(rep.loss, static_cast<double>(rep.x.dim(0)));
      for (int64_t i = 1; i < m; ++i) {
        metrics[i]->reset_state();
        metrics[i]->update_state(rep.y, rep.y_pred, rep.mask);
      }
      for (int64_t i = 0; i < m; ++i) std::tie(at[2 * i], at[2 * i + 1]) = metrics[i]->state();
    }
    st_.all_gather_across_workers(metric_parts_, metric_gathered_);
    const double* all = metric_gathered_.data<double>();
    const int64_t row = num_logical * m * 2;
    for (int64_t i = 0; i < m; ++i) {
      auto [total, count] = saved[i];
      for (int l = 0; l < num_logical; ++l) {
        double t = 0, c = 0;
        for (int w = 0; w < st_.num_workers(); ++w) {
          t += all[w * row + (l * m + i) * 2];
          c += all[w * row + (l * m + i) * 2 + 1];
        }
        total += t;
        count += c;
      }
      metrics[i]->set_state(total, count);
    }
  }

  // On replica thread r: forward, loss scaled by its share of the global batch, gradients.
  void compute(int r) {
    Replica& rep = replicas_[r];
    const int64_t rows = rep.x.dim(0);
    if (rows == 0) {
      rep.grads.clear();
      rep.y_pred = Tensor();
      rep.mask = Tensor();
      rep.loss = 0;
      return;
    }
    GradientTape tape;
    Tensor y_pred;
    std::tie(y_pred, rep.mask) = nn::call_with_output_mask(model_, rep.x, /*training=*/true);
    const Tensor loss = (*s_.loss)(rep.y, y_pred, rep.mask);
    // Σ over replicas of (mean loss over the replica's rows · rows / global) is the mean over the
    // global batch, so summed gradients are the global batch's gradient.
    const Tensor scaled = scale(loss, static_cast<float>(rows) / static_cast<float>(global_));
    tape.gradient(scaled, trainable_, rep.grads, overlap_ ? &on_final_ : nullptr);
    rep.loss = loss.item();
    rep.y_pred = stop_gradient(y_pred);
  }

  nn::Model& model_;
  TrainingState& s_;
  distribute::Strategy& st_;
  const bool skip_nonfinite_;
  // Every this many steps, compare a checksum of every variable across workers (FitOptions).
  const int64_t verify_sync_every_;
  std::vector<Variable*> sync_vars_;
  int64_t steps_run_ = 0;
  std::vector<Variable*> trainable_;
  std::vector<Tensor> grads_;  // the reduced gradients when not reduced in place
  std::vector<Replica> replicas_;
  std::vector<std::vector<Tensor>> per_replica_;
  std::span<Tensor> out_;
  Tensor flags_;
  StateUpdates state_updates_;
  std::vector<Tensor> extra_;  // flags_, then the state updates (sharing their buffers)
  int64_t global_ = 0;
  Tensor metric_parts_, metric_gathered_;  // logical replicas' metric contributions
  std::function<void(int, int)> update_;
  // The overlapped all-reduce (null unless the strategy overlaps) and the tape's hook into it.
  std::unique_ptr<distribute::OverlappedGradientReduction> overlap_;
  std::function<void(size_t)> on_final_;
  std::unique_ptr<distribute::ShardedOptimizerUpdate> sharded_;  // ZeRO; null when not sharded
};

}  // namespace

std::unique_ptr<TrainStep> make_replicated_step(nn::Model& model, TrainingState& s,
                                                const FitOptions& options) {
  return std::make_unique<ReplicatedStep>(model, s, options);
}

}  // namespace dtrain::train
