// Options and results of Model::compile / fit / evaluate / predict (Keras semantics).
// Include this (or dtrain/dtrain.h) to call the training methods declared in nn/model.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/data/dataset.h"
#include "dtrain/distribute/strategy.h"
#include "dtrain/nn/losses.h"
#include "dtrain/nn/metrics.h"
#include "dtrain/nn/model.h"
#include "dtrain/optim/optimizer.h"
#include "dtrain/train/callbacks.h"

namespace dtrain::train {

// An optimizer by Keras name ("adam") or instance.
class OptimizerSpec {
 public:
  OptimizerSpec(const char* name) : name_(name) {}
  OptimizerSpec(std::string name) : name_(std::move(name)) {}
  template <class O, class = std::enable_if_t<std::is_base_of_v<optim::Optimizer, O>>>
  OptimizerSpec(std::shared_ptr<O> optimizer) : optimizer_(std::move(optimizer)) {}
  // Resolves to an instance; throws InvalidArgumentError for an unknown name.
  std::shared_ptr<optim::Optimizer> resolve() const;

 private:
  std::string name_;
  std::shared_ptr<optim::Optimizer> optimizer_;
};

// A loss by Keras name ("sparse_categorical_crossentropy") or instance.
class LossSpec {
 public:
  LossSpec() = default;
  LossSpec(const char* name) : name_(name) {}
  LossSpec(std::string name) : name_(std::move(name)) {}
  template <class L, class = std::enable_if_t<std::is_base_of_v<nn::Loss, L>>>
  LossSpec(std::shared_ptr<L> loss) : loss_(std::move(loss)) {}
  template <class L, class = std::enable_if_t<std::is_base_of_v<nn::Loss, L>>>
  LossSpec(L loss) : loss_(std::make_shared<L>(std::move(loss))) {}
  std::shared_ptr<nn::Loss> resolve() const;

 private:
  std::string name_;
  std::shared_ptr<nn::Loss> loss_;
};

struct CompileOptions {
  OptimizerSpec optimizer = "rmsprop";    // Keras's default
  LossSpec loss = {};                     // required
  std::vector<std::string> metrics = {};  // e.g. {"accuracy"}
};

// Validation data for fit(): a batched dataset, or (x, y) tensors batched by fit's batch_size.
class ValidationData {
 public:
  ValidationData(data::Dataset dataset) : dataset_(std::move(dataset)) {}
  ValidationData(std::pair<Tensor, Tensor> xy) : xy_(std::move(xy)) {}
  data::Dataset dataset(int64_t batch_size) const;

 private:
  data::Dataset dataset_;
  std::pair<Tensor, Tensor> xy_;
};

struct FitOptions {
  int64_t epochs = 1;       // train until this epoch (exclusive)
  int64_t batch_size = 32;  // for fit(x, y); datasets come batched
  std::optional<ValidationData> validation_data = std::nullopt;  // evaluated after each epoch
  std::optional<int64_t> steps_per_epoch = std::nullopt;         // default: one pass over the data
  int64_t initial_epoch = 0;                                     // epoch to start at (resuming)
  bool shuffle = true;                                           // fit(x, y): reshuffle every epoch
  std::optional<uint64_t> seed = std::nullopt;                   // fit(x, y): shuffle seed
  // 0 silent, 1 progress bar, 2 one line per epoch; -1 (auto): 1 on a terminal, else 2.
  int verbose = -1;
  std::vector<std::shared_ptr<Callback>> callbacks = {};
  // The tutorial's fit(..., save_checkpoints=true): back up the whole training state to
  // checkpoint_dir (BackupAndRestore, every checkpoint_every steps or each epoch when 0) and
  // resume from it when a backup is there, so a restarted job continues exactly.
  bool save_checkpoints = false;
  std::string checkpoint_dir = "dtrain_backup";
  int64_t checkpoint_every = 0;
  // With save_checkpoints: resume from the newest backup in checkpoint_dir when there is one
  // (false: start from initial_epoch and keep writing backups there).
  bool resume = true;
  // With save_checkpoints: snapshot the state and write it on background threads
  // (BackupAndRestoreOptions::enable_async), so that frequent backups cost the training loop
  // a memory copy instead of a synchronous write.
  bool async_checkpoints = false;
  // With save_checkpoints under `dtrain launch`: an in-memory snapshot of the same state every
  // this many steps, held by the launchers (and a ring neighbour's), restored after a failure
  // before any backup is read (BackupAndRestoreOptions::snapshot_every). nullopt: the
  // launcher's --snapshot-every; 0: none.
  std::optional<int64_t> snapshot_every = std::nullopt;
  // With save_checkpoints under MultiWorkerMirroredStrategy with several workers: sharded
  // backups (BackupAndRestoreOptions::sharded; docs/checkpoints.md, "Sharded checkpoints").
  bool sharded_checkpoints = false;
  // Write TensorBoard event files (loss, metrics, learning rate, steps/s) under this directory
  // (the TensorBoard callback, chief only). Empty: none.
  std::string logdir = "";
  // Non-finite loss or gradients. Off (Keras's behaviour: NaN propagates; TerminateOnNaN stops
  // training): with skip_nonfinite, a step whose gradients (after the all-reduce) are not all
  // finite applies no update and is left out of the metrics; after rollback_after_nonfinite
  // such steps in a row, the model and optimizer are restored from the newest backup
  // (save_checkpoints / BackupAndRestore) and training continues with the next batches.
  bool skip_nonfinite = false;
  int64_t rollback_after_nonfinite = 3;
  // Under a multi-worker strategy: every this many steps, compare a checksum of every model and
  // optimizer variable across workers and fail (InternalError naming the first diverging
  // variable) if any differs. 0: never.
  int64_t verify_sync_every = 0;
};

struct EvaluateOptions {
  int64_t batch_size = 32;                      // for evaluate(x, y)
  std::optional<int64_t> steps = std::nullopt;  // default: the whole dataset
  int verbose = 0;                              // 1: progress bar
  std::vector<std::shared_ptr<Callback>> callbacks = {};
};

struct PredictOptions {
  int64_t batch_size = 32;  // for predict(x)
};

// Per-epoch logs of fit() (keras History): history()["loss"][e] is epoch e's mean loss. An epoch
// that ends again (a survivor of a failure rolled back to a snapshot before its end) replaces
// its entry and every later one, so the history is the uninterrupted run's.
class History : public Callback {
 public:
  void on_train_begin(const Logs&) override {}
  void on_epoch_end(int64_t epoch, const Logs& logs) override;
  const std::map<std::string, std::vector<double>>& history() const { return history_; }
  const std::vector<int64_t>& epochs() const { return epochs_; }
  // The last epoch's value of `key`; throws NotFoundError.
  double last(const std::string& key) const;

 private:
  std::map<std::string, std::vector<double>> history_;
  std::vector<int64_t> epochs_;
  std::vector<Logs> logs_;  // each epoch's, as history_ was built from them
};

}  // namespace dtrain::train
