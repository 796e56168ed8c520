// fit()'s training loop, the same for every strategy (fit_loop.h).
#include "fit_loop.h"

#include <cstdio>
#include <iostream>
#include <utility>

#include "dtrain/core/error.h"
#include "dtrain/train/backup_and_restore.h"
#include "dtrain/train/preemption.h"
#include "dtrain/train/step_observer.h"
#include "dtrain/train/tensorboard.h"
#include "evaluation.h"
#include "memory_snapshots.h"
#include "progress_bar.h"

namespace dtrain::train {
namespace {

void check_element(const data::Element& e) {
  DTRAIN_CHECK(e.size() >= 2, "fit: dataset elements must be (x, y) pairs, got ", e.size(),
               " component(s)");
}

}  // namespace

std::shared_ptr<Callback> TrainStep::make_backup(const FitOptions& options) {
  return std::make_shared<BackupAndRestore>(
      options.checkpoint_dir, BackupAndRestoreOptions{.save_freq = options.checkpoint_every,
                                                      .enable_async = options.async_checkpoints,
                                                      .restore = options.resume,
                                                      .snapshot_every = options.snapshot_every,
                                                      .sharded = options.sharded_checkpoints});
}

FitLoop::FitLoop(nn::Model& model, TrainingState& s, const MakeDataset& make_dataset,
                 std::optional<uint64_t> data_seed, const FitOptions& options)
    : model_(model), s_(s), make_dataset_(make_dataset), options_(options) {
  DTRAIN_CHECK(options.epochs >= 0 && options.initial_epoch >= 0, "fit: epochs (", options.epochs,
               ") and initial_epoch (", options.initial_epoch, ") must be non-negative");
  DTRAIN_CHECK(!options.steps_per_epoch || *options.steps_per_epoch > 0,
               "fit: steps_per_epoch must be positive");
  verbose_ = options.verbose >= 0 ? options.verbose : (detail::stdout_is_terminal() ? 1 : 2);
  dataset_ = make_dataset(data_seed);
  position_.data_seed = data_seed;
}

FitLoop::~FitLoop() = default;

void FitLoop::resume_at(const FitPosition& at, std::string from) {
  resume_ = at;
  resumed_from_ = std::move(from);
}

void FitLoop::begin_training() {
  if (!model_.built()) {
    // Build from the first batch now, so that callbacks can restore weights into the model.
    data::Iterator peek = dataset_.iterator(options_.initial_epoch);
    data::Element e;
    if (peek.next(e)) {
      check_element(e);
      model_.build(e[0].shape().without_first());
    }
  }
  if (s_.strategy == nullptr) {
    step_ = make_one_device_step(model_, s_, options_);
  } else if (is_parameter_server_strategy(s_.strategy)) {
    DTRAIN_CHECK(model_.built(), "fit: the training dataset is empty");
    step_ = make_parameter_server_step(model_, s_, options_, make_dataset_, position_.data_seed);
  } else {
    step_ = make_replicated_step(model_, s_, options_);
  }

  history_ = std::make_shared<History>();
  callbacks_ = options_.callbacks;
  if (options_.save_checkpoints) callbacks_.push_back(step_->make_backup(options_));
  // The strategy's report_tensorboard (the tutorial's option) stands in for a logdir.
  std::string logdir = options_.logdir;
  if (logdir.empty() && s_.strategy != nullptr) logdir = s_.strategy->tensorboard_logdir();
  if (!logdir.empty()) callbacks_.push_back(std::make_shared<TensorBoard>(logdir));
  callbacks_.push_back(history_);
  for (const auto& cb : callbacks_) cb->set_model(&model_);
  // At an epoch's end the backups come after the user's other callbacks, so that an epoch-end
  // backup holds their state after this epoch (EarlyStopping's count) wherever the user listed
  // BackupAndRestore, and before fit's own TensorBoard and History, which report the backup's
  // time.
  const auto is_backup = [](const Callback* cb) {
    return dynamic_cast<const BackupAndRestore*>(cb) != nullptr;
  };
  const size_t own = options_.callbacks.size();  // fit's own callbacks follow the user's
  epoch_end_order_.clear();
  for (size_t i = 0; i < own; ++i) {
    if (!is_backup(callbacks_[i].get())) epoch_end_order_.push_back(callbacks_[i].get());
  }
  for (const auto& cb : callbacks_) {
    if (is_backup(cb.get())) epoch_end_order_.push_back(cb.get());
  }
  for (size_t i = own; i < callbacks_.size(); ++i) {
    if (!is_backup(callbacks_[i].get())) epoch_end_order_.push_back(callbacks_[i].get());
  }
  if (options_.validation_data)
    validation_ = options_.validation_data->dataset(options_.batch_size);

  s_.stop_training = false;
  logs_.clear();
  for (const auto& cb : callbacks_) cb->on_train_begin(logs_);
  if (resume_) {
    for (const auto& cb : callbacks_) {
      cb->on_train_resumed(resume_->epoch, resume_->step_in_epoch, resumed_from_);
    }
    if (resume_->data_seed && resume_->data_seed != position_.data_seed) {
      dataset_ = make_dataset_(resume_->data_seed);
      position_.data_seed = resume_->data_seed;
    }
  }
  card_ = dataset_.cardinality();
  steps_known_ = options_.steps_per_epoch ? *options_.steps_per_epoch : card_ >= 0 ? card_ : -1;
  if (options_.steps_per_epoch && step_->reads_batches()) {
    stream_.emplace(resume_ ? dataset_.iterator_from(resume_->data_position)
                            : dataset_.iterator(options_.initial_epoch));
  }
}

std::pair<int64_t, int64_t> FitLoop::computed_position(int64_t epoch, int64_t step) const {
  if (!options_.steps_per_epoch) return {epoch, step};
  const int64_t g = (epoch - options_.initial_epoch) * steps_known_ + step;
  if (card_ == data::kInfiniteCardinality || card_ < 0) return {options_.initial_epoch, g};
  return {options_.initial_epoch + g / card_, g % card_};
}

History FitLoop::run() {
  struct Attach {
    TrainingState& s;
    Attach(TrainingState& state, FitLoop* loop) : s(state) { s.loop = loop; }
    ~Attach() { s.loop = nullptr; }
  } attach(s_, this);
  begin_training();

  int64_t epoch = resume_ ? resume_->epoch : options_.initial_epoch;
  int64_t step = resume_ ? resume_->step_in_epoch : 0;
  // A resumed epoch keeps its restored metric states.
  bool resumed = resume_.has_value() && step > 0;
  while (epoch < options_.epochs && !s_.stop_training) {
    int64_t next_epoch = epoch + 1;
    int64_t next_step = 0;
    if (!run_epoch(epoch, step, resumed, next_epoch, next_step)) break;
    epoch = next_epoch;
    step = next_step;
    // A survivor that rejoined after a failure continues its restored epoch's metric sums.
    resumed = std::exchange(rejoined_, false) && step > 0;
  }
  step_->sync_model();
  step_->end(verbose_);
  for (const auto& cb : callbacks_) cb->on_train_end(logs_);
  return *history_;
}

bool FitLoop::run_epoch(int64_t epoch, int64_t step, bool resumed, int64_t& next_epoch,
                        int64_t& next_step) {
  if (!resumed) s_.reset_metrics();
  logs_.clear();
  position_.epoch = epoch;
  for (const auto& cb : callbacks_) cb->on_epoch_begin(epoch, logs_);
  step_->begin_epoch(epoch);
  if (verbose_ > 0) {
    std::printf("Epoch %lld/%lld\n", static_cast<long long>(epoch + 1),
                static_cast<long long>(options_.epochs));
  }
  detail::ProgressBar bar(verbose_, steps_known_);
  const bool reads = step_->reads_batches();
  std::optional<data::Iterator> pass;
  if (reads && !stream_) {
    pass.emplace(resumed ? dataset_.iterator_from(data::IteratorState{epoch, step})
                         : dataset_.iterator(epoch));
  }
  data::Iterator* it = reads ? (stream_ ? &*stream_ : &*pass) : nullptr;
  const int64_t first_epoch = options_.initial_epoch;
  while (!options_.steps_per_epoch || step < *options_.steps_per_epoch) {
    // Steps since fit's initial epoch (the parameter-server closures' step numbers).
    const int64_t global = steps_known_ >= 0 ? (epoch - first_epoch) * steps_known_ + step : step;
    int64_t n = 1;
    if (reads) {
      const data::IteratorState at = it->state();
      if (!it->next(element_)) {
        if (options_.steps_per_epoch) out_of_data_ = true;
        break;
      }
      check_element(element_);
      inputs_.assign(1, StepInput{&element_, at.iteration, at.position, global});
    } else {
      if (steps_known_ >= 0 && step >= steps_known_) break;
      n = step_->steps_per_call(global, steps_known_ - step);
      inputs_.clear();
      for (int64_t i = 0; i < n; ++i) {
        const auto [p, q] = computed_position(epoch, step + i);
        inputs_.push_back(StepInput{nullptr, p, q, global + i});
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      for (const auto& cb : callbacks_) cb->on_train_batch_begin(step + i, logs_);
    }
    StepOutcome outcome;
    try {
      if (!step_begun_) {
        // Fix the variable list for the whole run.
        if (!model_.built()) model_.build(element_[0].shape().without_first());
        step_->begin();
        step_begun_ = true;
      }
      outcome = step_->run(inputs_);
    } catch (const Error&) {
      return resume_after_failure(next_epoch, next_step);
    }
    if (outcome.rewind) {
      if (outcome.rewind->epoch != epoch) {
        next_epoch = outcome.rewind->epoch;
        next_step = outcome.rewind->step;
        return true;
      }
      step = outcome.rewind->step;
      continue;
    }
    if (!outcome.applied) {
      on_skipped_step(epoch, step);
    } else {
      nonfinite_in_a_row_ = 0;
    }
    for (int64_t i = 0; i < n; ++i) {
      ++step;
      ++steps_run_;
      if (step_->reports_progress()) notify_step(s_.optimizer->iterations());
      position_.step_in_epoch = step;
      if (reads) {
        position_.data_position = it->state();
      } else {
        const auto [p, q] = computed_position(epoch, step);
        position_.data_position = data::IteratorState{p, q};
      }
      s_.fill_logs(logs_);
      try {
        for (const auto& cb : callbacks_) cb->on_train_batch_end(step - 1, logs_);
      } catch (const Error&) {
        // A peer lost inside a callback's collective (a backup's or snapshot's all-gather of
        // sharded slots) is survived like one lost in the step; any other error propagates.
        return resume_after_failure(next_epoch, next_step);
      }
      bar.update(step, logs_);
    }
    if (outcome.stop) preempted(epoch, step);
    if (s_.stop_training) break;
  }
  DTRAIN_CHECK(step > 0 || out_of_data_, "fit: the training dataset is empty");
  // The epoch's end has collectives too: the metrics' all-reduce, validation's, and those of
  // epoch-end callbacks (a sharded backup). A peer lost in any of them is survived like one lost
  // in a step: the loop goes back to the agreed snapshot, and this epoch ends again from there
  // (History keeps one entry per epoch).
  try {
    // Under logical replicas every worker already holds the whole batch's metrics.
    if (s_.strategy == nullptr || s_.strategy->logical_replicas() == 0) s_.all_reduce_metrics();
    s_.fill_logs(logs_);
    step_->end_epoch(logs_);
    if (validation_ && step > 0) {
      step_->sync_model();
      // As in Keras, the callbacks see validation's on_test_* hooks.
      const nn::Logs val =
          run_evaluation(model_, *validation_, std::nullopt, 0, callbacks_, "val_");
      s_.reset_metrics();  // evaluation reused the trackers; the training values are in logs
      logs_.insert(val.begin(), val.end());
    }
    bar.update(step, logs_, true);
    // The epoch is complete: callbacks that checkpoint here record "epoch + 1, step 0".
    position_.step_in_epoch = 0;
    position_.epoch = epoch + 1;
    if (reads) {
      position_.data_position = stream_ ? stream_->state() : data::IteratorState{epoch + 1, 0};
    } else {
      const auto [p, q] = computed_position(epoch + 1, 0);
      position_.data_position = data::IteratorState{p, q};
    }
    for (Callback* cb : epoch_end_order_) cb->on_epoch_end(epoch, logs_);
  } catch (const Error&) {
    return resume_after_failure(next_epoch, next_step);
  }
  if (out_of_data_) {
    std::cerr << "fit: the input ran out of data after epoch " << epoch + 1
              << "; make sure the dataset can produce steps_per_epoch * epochs batches "
                 "(e.g. with repeat())\n";
    return false;
  }
  return true;
}

void FitLoop::before_checkpoint() {
  // No step between a survivor's rejoin (which drops the failed generation's step) and the next
  // step's begin(): nothing is sharded then.
  if (step_ && step_begun_) step_->before_checkpoint();
}

bool FitLoop::resume_after_failure(int64_t& next_epoch, int64_t& next_step) {
  if (!rejoin_after_failure()) throw;
  next_epoch = resume_->epoch;
  next_step = resume_->step_in_epoch;
  return true;
}

bool FitLoop::rejoin_after_failure() {
  if (!MemorySnapshots::survives_failures()) return false;
  BackupAndRestore* backups = nullptr;
  for (const auto& cb : callbacks_) {
    if (auto* b = dynamic_cast<BackupAndRestore*>(cb.get()); b != nullptr && !backups) backups = b;
  }
  if (backups == nullptr) return false;
  // The failed generation's step (and the reductions that hold its collectives) goes first.
  step_.reset();
  while (true) {
    if (!backups->rejoin_after_failure()) return false;
    // The collectives a fresh fit() runs before its first step, in its order, so that the
    // survivors meet the restarted workers': fit(x, y)'s shuffle-seed agreement under several
    // workers (Model::fit in fit.cc; the value is the snapshot's anyway), then the chief's
    // broadcast in the new step's begin().
    // Then the survivor's broadcast of the snapshot to the newcomers, which receive it where a
    // fresh fit() restores (BackupAndRestore::on_train_begin).
    try {
      if (position_.data_seed && s_.strategy->num_workers() > 1) {
        const uint64_t mine = *position_.data_seed & ((uint64_t{1} << 52) - 1);
        s_.strategy->all_reduce_scalar(s_.strategy->is_chief() ? static_cast<double>(mine) : 0.0,
                                       distribute::ReduceOp::kSum);
      }
      backups->share_state_after_rejoin();
      break;
    } catch (const Error&) {
      // A peer failed again: the generation after this one.
    }
  }
  // A fresh step on the new collectives, whose begin() broadcasts the chief's variables as the
  // restarted workers' does (the values are the snapshot's everywhere).
  step_ = make_replicated_step(model_, s_, options_);
  step_begun_ = false;
  s_.variables_synced = false;
  if (resume_->data_seed && resume_->data_seed != position_.data_seed) {
    dataset_ = make_dataset_(resume_->data_seed);
    position_.data_seed = resume_->data_seed;
  }
  if (stream_) stream_.emplace(dataset_.iterator_from(resume_->data_position));
  rejoined_ = true;
  return true;
}

void FitLoop::on_skipped_step(int64_t epoch, int64_t step) {
  ++nonfinite_in_a_row_;
  std::cerr << "fit: non-finite loss or gradients at epoch " << epoch + 1 << " step " << step + 1
            << "; update skipped (" << nonfinite_in_a_row_ << " in a row)\n";
  if (nonfinite_in_a_row_ < options_.rollback_after_nonfinite) return;
  bool restored = false;
  before_checkpoint();  // full-size slots to restore into
  for (const auto& cb : callbacks_) restored = cb->restore_last_good() || restored;
  std::cerr << (restored ? "fit: rolled back to the last good checkpoint\n"
                         : "fit: no checkpoint to roll back to (use save_checkpoints)\n");
  nonfinite_in_a_row_ = 0;
}

void FitLoop::preempted(int64_t epoch, int64_t step) {
  // Every worker stops after this same step; callbacks save; the caller maps the error to the
  // process's exit code (the dtrain binary: preemption_exit_code()).
  for (const auto& cb : callbacks_) cb->on_preemption(epoch, step);
  std::fflush(stdout);
  const int code = preemption_exit_code();
  throw PreemptedError(code,
                       str_cat("fit: preempted (SIGTERM) at epoch ", epoch + 1, " step ", step,
                               "; state saved by callbacks; exiting with code ", code),
                       epoch, step);
}

}  // namespace dtrain::train
