// Private to the train layer: what compile() sets up and the model owns (loss, optimizer,
// metrics, the strategy in scope), and the running fit() that the built-in callbacks talk to.
// User code sees none of it: callbacks get logs, the model and the epoch/step, as in Keras.
// Not thread-safe (used from the thread that calls fit()).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/data/dataset.h"
#include "dtrain/distribute/strategy.h"
#include "dtrain/nn/losses.h"
#include "dtrain/nn/metrics.h"
#include "dtrain/nn/model.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::train {

class FitLoop;

// Seconds the training step spent in its parts, summed since the model was compiled (the
// TensorBoard callback's profile_steps reports the differences per step). Only the replicated
// step (MirroredStrategy, MultiWorkerMirroredStrategy) measures them.
struct StepTimes {
  double compute = 0;        // forward, backward, the update and the metrics
  double communication = 0;  // the gradient reduction (with an update fused into it), verify_sync
  double waiting = 0;        // at a barrier before the reduction: for the slowest worker
  bool measured = false;     // the step measures these
  // Set for one fit() by TensorBoard's profile_steps (several workers, no overlap): the step waits
  // at a barrier before the gradient reduction, so that waiting for the slowest worker is
  // counted apart from the reduction itself.
  bool measure_waiting = false;
};

class TrainingState {
 public:
  std::shared_ptr<optim::Optimizer> optimizer;
  std::shared_ptr<nn::Loss> loss;
  std::vector<std::shared_ptr<nn::Metric>> metrics;
  nn::Mean loss_tracker{"loss"};
  // The strategy in scope at compile() (null: one replica, this process only).
  distribute::Strategy* strategy = nullptr;
  // Whether the chief's initial variables have been broadcast to the other workers.
  bool variables_synced = false;
  // Set by fit() for its run: the training batches are this worker's rows of each global batch
  // followed by the global batch's row count (distribute::worker_batches, what fit(x, y) uses
  // under a multi-worker strategy); otherwise they are whole global batches.
  bool per_worker_input = false;
  StepTimes step_times;
  // Keras's model.stop_training: set by request_stop_training, read after each batch.
  bool stop_training = false;
  // The fit() running on this model, if any (BackupAndRestore and TensorBoard read and report
  // through it).
  FitLoop* loop = nullptr;

  // The loss tracker and the compiled metrics, in that order (Keras's model.metrics).
  std::vector<nn::Metric*> all_metrics();
  void reset_metrics();
  // Sets running logs in place (no allocation once the keys exist).
  void fill_logs(nn::Logs& logs, const std::string& prefix = {});
  // Sums the metric states across workers so that every worker reports the global values.
  void all_reduce_metrics();
};

// The model's training state; throws FailedPreconditionError naming `fn` when the model has not
// been compiled.
TrainingState& state_of(nn::Model& model, const char* fn);
// The model's training state, or null before compile().
TrainingState* find_state(nn::Model& model);

// The train layer's access to the state a Model holds for it (nn::Model befriends it).
class TrainingAccess {
 public:
  static TrainingState* get(nn::Model& model) { return model.training_.get(); }
  static void set(nn::Model& model, std::shared_ptr<TrainingState> s) {
    model.training_ = std::move(s);
  }
};

}  // namespace dtrain::train
