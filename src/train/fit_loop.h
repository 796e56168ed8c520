// Private to the train layer: fit()'s one training loop — epochs, steps, callbacks, resume,
// preemption, non-finite rollback and validation — for every strategy; the strategy contributes
// only its TrainStep (train_step.h). The built-in callbacks that checkpoint the loop
// (BackupAndRestore) and report on it (TensorBoard) read its position and hand it a resume
// point through this class while it runs (TrainingState::loop). Not thread-safe.
#pragma once

#include <optional>
#include <string>

#include "dtrain/train/training.h"
#include "train_step.h"
#include "training_state.h"

namespace dtrain::train {

// Where fit() is: the epoch, the steps done in it, the position of the data iterator after
// them, and the shuffle seed fit(x, y) uses (unset for fit(dataset)).
struct FitPosition {
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
  data::IteratorState data_position;
  std::optional<uint64_t> data_seed;
};

class FitLoop {
 public:
  FitLoop(nn::Model& model, TrainingState& s, const MakeDataset& make_dataset,
          std::optional<uint64_t> data_seed, const FitOptions& options);
  ~FitLoop();
  FitLoop(const FitLoop&) = delete;
  FitLoop& operator=(const FitLoop&) = delete;

  // Trains; returns the History. Throws PreemptedError after a preemption (the callbacks have
  // saved the state) and whatever the step and callbacks throw.
  History run();

  // For the built-in callbacks, while run() runs.
  const FitPosition& position() const { return position_; }
  // Every callback of this fit(), in the order their hooks run (the user's, then fit's own).
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return callbacks_; }
  // From a callback's on_train_begin: start at `at` (the epoch's restored metric states are
  // kept) instead of options.initial_epoch; `from` names the checkpoint for the callbacks'
  // on_train_resumed.
  void resume_at(const FitPosition& at, std::string from);
  // Seconds the last backup kept the loop waiting (reported as epoch_checkpoint_save_seconds).
  void set_checkpoint_seconds(double seconds) { checkpoint_seconds_ = seconds; }
  double checkpoint_seconds() const { return checkpoint_seconds_; }
  // For the callbacks that checkpoint, on every worker at the same step before they capture the
  // state: TrainStep::before_checkpoint (under sharded optimizer state, a collective).
  void before_checkpoint();

 private:
  void begin_training();
  // Runs epoch `epoch` from step `step` (`resumed`: a restored epoch, whose metric states are
  // kept). Returns false when training must end; sets next_epoch/next_step when the step rewound
  // to another epoch (else they stay epoch + 1, 0).
  bool run_epoch(int64_t epoch, int64_t step, bool resumed, int64_t& next_epoch,
                 int64_t& next_step);
  // Under `dtrain launch --on-failure survivors`, after the step's collectives failed: joins the
  // next generation with the state of the agreed snapshot (BackupAndRestore::rejoin_after_failure)
  // and sets resume_ to its position; false when this worker does not survive failures.
  bool rejoin_after_failure();
  // Called in a catch block of run_epoch: rejoin_after_failure(), then the epoch and step to go
  // on from (always true); rethrows the error being handled when this worker does not survive it.
  bool resume_after_failure(int64_t& next_epoch, int64_t& next_step);
  // After a step that skipped its update: counts, and rolls back after too many in a row.
  void on_skipped_step(int64_t epoch, int64_t step);
  [[noreturn]] void preempted(int64_t epoch, int64_t step);
  // The data position of step `step` of `epoch` for a step that reads no batches.
  std::pair<int64_t, int64_t> computed_position(int64_t epoch, int64_t step) const;

  nn::Model& model_;
  TrainingState& s_;
  const MakeDataset& make_dataset_;
  const FitOptions& options_;
  int verbose_ = 0;
  std::unique_ptr<TrainStep> step_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<Callback*> epoch_end_order_;  // callbacks_ in on_epoch_end's order
  std::shared_ptr<History> history_;
  std::optional<data::Dataset> validation_;
  data::Dataset dataset_;
  int64_t card_ = -1;
  int64_t steps_known_ = -1;  // steps per epoch, or -1 when unknown
  // With steps_per_epoch the data stream continues across epochs (Keras semantics for repeated
  // datasets); otherwise each epoch is one pass, reshuffled by its epoch number.
  std::optional<data::Iterator> stream_;
  bool out_of_data_ = false;
  bool step_begun_ = false;
  bool rejoined_ = false;  // rejoin_after_failure() set resume_: continue at its epoch and step
  int64_t nonfinite_in_a_row_ = 0;
  int64_t steps_run_ = 0;  // steps this fit() ran, resumed ones not counted
  FitPosition position_;
  std::optional<FitPosition> resume_;
  std::string resumed_from_;
  double checkpoint_seconds_ = 0;
  nn::Logs logs_;
  data::Element element_;          // the batch, reused every step
  std::vector<StepInput> inputs_;  // the steps handed to TrainStep::run, reused
};

}  // namespace dtrain::train
