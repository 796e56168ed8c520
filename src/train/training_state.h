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
