// TensorBoard callback over summary::SummaryWriter.
#include "dtrain/train/tensorboard.h"

#include <sys/resource.h>

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
  DTRAIN_CHECK(options_.profile_steps >= 0, "TensorBoard: profile_steps must be >= 0");
}

TensorBoard::~TensorBoard() = default;

void TensorBoard::on_train_begin(const Logs&) {
  TrainingState* s = find_state(*model());
  if (s != nullptr && options_.profile_steps > 0) {
    // Every worker takes part in the reports' all-gather; the chief writes them.
    s->step_times.measure_waiting = s->strategy != nullptr && s->strategy->num_workers() > 1;
    last_compute_ = s->step_times.compute;
    last_communication_ = s->step_times.communication;
    last_waiting_ = s->step_times.waiting;
    last_profile_ = std::chrono::steady_clock::now();
    last_profile_step_ = s->optimizer != nullptr ? s->optimizer->iterations() : 0;
  }
  if (s != nullptr && s->optimizer != nullptr) global_step_ = s->optimizer->iterations();
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
  if (options_.profile_steps > 0 && global_step_ % options_.profile_steps == 0) profile();
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
  for (const auto& p : profile_) p->flush();
}

void TensorBoard::on_train_resumed(int64_t epoch, int64_t step_in_epoch, const std::string& from) {
  // Say in TensorBoard where this run picked up (the launcher reports the failure itself).
  const int64_t global = model()->optimizer() != nullptr ? model()->optimizer()->iterations() : 0;
  text("dtrain/recovery",
       str_cat("resumed from ", from.empty() ? std::string("a backup") : from, " at epoch ",
               epoch + 1, ", step ", step_in_epoch, " (global step ", global, ")"),
       global);
}

void TensorBoard::profile() {
  TrainingState* s = find_state(*model());
  if (s == nullptr) return;
  const auto now = std::chrono::steady_clock::now();
  const double steps = static_cast<double>(std::max<int64_t>(1, global_step_ - last_profile_step_));
  const StepTimes& t = s->step_times;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const AllocatorStats a = allocator_stats();
  constexpr int kValues = 7;
  Tensor mine(DType::kFloat64, Shape{kValues});
  double* v = mine.data<double>();
  v[0] = std::chrono::duration<double>(now - last_profile_).count() / steps;
  v[1] = t.measured ? (t.compute - last_compute_) / steps : -1;  // -1: not measured
  v[2] = (t.communication - last_communication_) / steps;
  v[3] = (t.waiting - last_waiting_) / steps;
  v[4] = static_cast<double>(usage.ru_maxrss) * 1024.0;  // Linux: KiB
  v[5] = static_cast<double>(a.peak_bytes_in_use);
  v[6] = static_cast<double>(a.bytes_in_use);
  last_compute_ = t.compute;
  last_communication_ = t.communication;
  last_waiting_ = t.waiting;
  last_profile_step_ = global_step_;
  Tensor all = mine.reshape(Shape{1, kValues});
  distribute::Strategy* st = s->strategy;
  if (st != nullptr && st->num_workers() > 1) {
    all = Tensor(DType::kFloat64, Shape{st->num_workers(), kValues});
    st->all_gather_across_workers(mine, all);
  }
  // The clock restarts after the gather, so that its wait counts in the next window's "other".
  last_profile_ = now;
  std::lock_guard<std::mutex> lock(mu_);
  if (!train_) return;  // not the chief
  const int64_t workers = all.dim(0);
  for (int64_t w = static_cast<int64_t>(profile_.size()); w < workers; ++w) {
    profile_.push_back(std::make_unique<summary::SummaryWriter>(
        (std::filesystem::path(log_dir_) / "profile" / str_cat("worker_", w)).string(),
        summary::SummaryWriterOptions{.warn_on_error = true}));
  }
  for (int64_t w = 0; w < workers; ++w) {
    const double* x = all.data<double>() + w * kValues;
    summary::SummaryWriter& out = *profile_[static_cast<size_t>(w)];
    out.scalar("profile/step_seconds", x[0], global_step_);
    if (x[1] >= 0) {
      out.scalar("profile/compute_seconds", x[1], global_step_);
      out.scalar("profile/communication_seconds", x[2], global_step_);
      out.scalar("profile/waiting_seconds", x[3], global_step_);
      out.scalar("profile/other_seconds", std::max(0.0, x[0] - x[1] - x[2] - x[3]), global_step_);
    }
    out.scalar("memory/peak_rss_bytes", x[4], global_step_);
    out.scalar("memory/tensor_peak_bytes", x[5], global_step_);
    out.scalar("memory/tensor_bytes_in_use", x[6], global_step_);
  }
}

void TensorBoard::on_train_end(const Logs&) {
  std::lock_guard<std::mutex> lock(mu_);
  if (train_) train_->flush();
  if (validation_) validation_->flush();
  for (const auto& p : profile_) p->flush();
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
