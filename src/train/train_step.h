// Private to the train layer: what a strategy contributes to fit(). The loop (fit_loop.h) owns
// epochs, steps, callbacks, resume, preemption, rollback and validation; a TrainStep owns only
// how one step (or, for the parameter-server chief, a chunk of steps) is computed and applied:
//   one device       one_device_step.cc       forward, loss, gradients, update on this thread
//   replicated       replicated_step.cc       Mirrored / MultiWorkerMirrored: local replicas on
//                                             their threads, Strategy::reduce_gradients, update
//   parameter server parameter_server_step.cc the chief schedules closures that workers run
// Not thread-safe: used from the thread that calls fit().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "dtrain/data/dataset.h"
#include "dtrain/nn/model.h"
#include "dtrain/train/callbacks.h"
#include "dtrain/train/training.h"
#include "training_state.h"

namespace dtrain::train {

// One step handed to TrainStep::run.
struct StepInput {
  const data::Element* batch = nullptr;  // (x, y, ...); null when the step reads no batches
  int64_t pass = 0;                      // the batch's data position (pass, batch index)
  int64_t position = 0;
  int64_t global_step = 0;  // steps since this fit() began, counting resumed ones (0-based)
};

struct StepOutcome {
  // False when the update was skipped (non-finite loss or gradients, with skip_nonfinite): the
  // step is left out of the metrics. Every worker of a job sees the same value.
  bool applied = true;
  // A preemption was requested on some worker: every worker stops after this same step.
  bool stop = false;
  // The parameter-server chief lost a server and restored it from a backup: the loop continues
  // at this epoch and step instead (the steps after it are computed again).
  struct Rewind {
    int64_t epoch = 0;
    int64_t step = 0;
  };
  std::optional<Rewind> rewind;
};

class TrainStep {
 public:
  virtual ~TrainStep() = default;

  // False for a step that finds its own batches from their positions (the parameter-server
  // chief: its workers read the data), so that the loop does not read them.
  virtual bool reads_batches() const { return true; }
  // The most steps the loop should hand over in one run(), starting at `global_step` with `left`
  // steps before the end of the epoch; callbacks see the steps after the call returns.
  virtual int64_t steps_per_call(int64_t /*global_step*/, int64_t /*left*/) const { return 1; }
  // Whether the loop reports the optimizer's iterations after each step to the step observer
  // (train/step_observer.h: the launcher's watchdog). The parameter-server chief's optimizer
  // does not count: its servers do.
  virtual bool reports_progress() const { return true; }
  // Before the first step, with the model built (and restored by callbacks): fixes the variable
  // list, and under a multi-worker strategy makes every worker start from the chief's values.
  virtual void begin() = 0;
  // Runs steps.size() consecutive steps (1 unless steps_per_call said more) and updates the
  // loss tracker and metrics with the applied ones.
  virtual StepOutcome run(std::span<const StepInput> steps) = 0;
  // Before the epoch's first step (metrics were just reset).
  virtual void begin_epoch(int64_t /*epoch*/) {}
  // At the end of an epoch, after the metrics were combined: adds the strategy's own logs.
  virtual void end_epoch(nn::Logs& /*logs*/) {}
  // Before evaluating validation data and at the end of training: makes the model's variables
  // hold the trained values (the parameter-server chief pulls them).
  virtual void sync_model() {}
  // After the last epoch (the parameter-server chief releases its workers).
  virtual void end(int /*verbose*/) {}
  // On every worker at the same step, before the training state is captured (a backup, an
  // in-memory snapshot) or restored into the live objects (a rollback): makes the optimizer
  // hold full-size slots. Under sharded optimizer state that is an all-gather of the slots
  // (a collective); the next step shards them again.
  virtual void before_checkpoint() {}
  // The callback that backs the training state up for fit(save_checkpoints = true).
  virtual std::shared_ptr<Callback> make_backup(const FitOptions& options);
};

using MakeDataset = std::function<data::Dataset(std::optional<uint64_t>)>;

std::unique_ptr<TrainStep> make_one_device_step(nn::Model& model, TrainingState& s,
                                                const FitOptions& options);
std::unique_ptr<TrainStep> make_replicated_step(nn::Model& model, TrainingState& s,
                                                const FitOptions& options);
// On the parameter-server chief. `make_dataset` and `data_seed` name the data its workers read.
std::unique_ptr<TrainStep> make_parameter_server_step(nn::Model& model, TrainingState& s,
                                                      const FitOptions& options,
                                                      const MakeDataset& make_dataset,
                                                      std::optional<uint64_t> data_seed);

// True when `strategy` is a ParameterServerStrategy.
bool is_parameter_server_strategy(const distribute::Strategy* strategy);
// On a parameter-server worker (not the chief): builds the model from the data, serves the
// chief's step closures until the chief is done, and returns.
void serve_parameter_server_steps(nn::Model& model, TrainingState& s,
                                  const MakeDataset& make_dataset, const FitOptions& options);

// True when every defined tensor of `grads` is finite.
bool all_finite(std::span<const Tensor> grads);

}  // namespace dtrain::train
