// TensorBoard callback over summary::SummaryWriter.
#include "dtrain/train/tensorboard.h"

#include <filesystem>

#include "dtrain/summary/summary_writer.h"
#include "dtrain/train/training.h"
#include "fit_loop.h"
#include "training_state.h"

namespace dtrain::train {

TensorBoard::TensorBoard(std::string log_dir, TensorBoardOptions options)
    : log_dir_(std::move(log_dir)), options_(options) {
  DTRAIN_CHECK(!log_dir_.empty(), "TensorBoard: log_dir is empty");
  DTRAIN_CHECK(options_.update_freq >= 0, "TensorBoard: update_freq must be >= 0");
}

TensorBoard::~TensorBoard() = default;

void TensorBoard::on_train_begin(const Logs&) {
  const TrainingState* s = find_state(*model());
  if (s != nullptr && s->strategy != nullptr && !s->strategy->is_chief()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!train_) {
    // A disk that fills up during training costs the summaries, not the training (a warning
    // on stderr, as TF's summary writer logs the error); one that cannot take the first
    // record fails here, before training starts.
    const summary::SummaryWriterOptions o{.warn_on_error = true};
    train_ = std::make_unique<summary::SummaryWriter>(
        (std::filesystem::path(log_dir_) / "train").string(), o);
    validation_ = std::make_unique<summary::SummaryWriter>(
        (std::filesystem::path(log_dir_) / "validation").string(), o);
  }
  if (s != nullptr && s->optimizer != nullptr) global_step_ = s->optimizer->iterations();
}

void TensorBoard::on_epoch_begin(int64_t, const Logs&) {
  epoch_start_ = std::chrono::steady_clock::now();
  epoch_steps_ = 0;
}

void TensorBoard::on_train_batch_end(int64_t, const Logs& logs) {
  ++global_step_;
  ++epoch_steps_;
  if (options_.update_freq == 0 || global_step_ % options_.update_freq != 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!train_) return;
  for (const auto& [k, v] : logs) train_->scalar("batch_" + k, v, global_step_);
}

void TensorBoard::on_epoch_end(int64_t epoch, const Logs& logs) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!train_) return;
  for (const auto& [k, v] : logs) {
    if (k.rfind("val_", 0) == 0) {
      validation_->scalar("epoch_" + k.substr(4), v, epoch);
    } else {
      train_->scalar("epoch_" + k, v, epoch);
    }
  }
  const TrainingState* s = find_state(*model());
  if (s != nullptr && s->optimizer != nullptr) {
    train_->scalar("epoch_learning_rate", s->optimizer->learning_rate(), epoch);
  }
  if (s != nullptr && s->loop != nullptr && s->loop->checkpoint_seconds() > 0) {
    train_->scalar("epoch_checkpoint_save_seconds", s->loop->checkpoint_seconds(), epoch);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count();
  if (epoch_steps_ > 0 && secs > 0) {
    train_->scalar("epoch_steps_per_second", static_cast<double>(epoch_steps_) / secs, epoch);
  }
  train_->flush();
  validation_->flush();
}

void TensorBoard::on_train_resumed(int64_t epoch, int64_t step_in_epoch, const std::string& from) {
  // Say in TensorBoard where this run picked up (the launcher reports the failure itself).
  const int64_t global = model()->optimizer() != nullptr ? model()->optimizer()->iterations() : 0;
  text("dtrain/recovery",
       str_cat("resumed from ", from.empty() ? std::string("a backup") : from, " at epoch ",
               epoch + 1, ", step ", step_in_epoch, " (global step ", global, ")"),
       global);
}

void TensorBoard::on_train_end(const Logs&) {
  std::lock_guard<std::mutex> lock(mu_);
  if (train_) train_->flush();
  if (validation_) validation_->flush();
}

void TensorBoard::text(const std::string& tag, const std::string& markdown, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!train_) return;
  train_->text(tag, markdown, step);
  train_->flush();
}

void TensorBoard::scalar(const std::string& tag, double value, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!train_) return;
  train_->scalar(tag, value, step);
}

}  // namespace dtrain::train
