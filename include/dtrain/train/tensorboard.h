// The TensorBoard callback (keras.callbacks.TensorBoard): writes TensorBoard event files under
// log_dir/train and log_dir/validation as Keras does — "epoch_loss", "epoch_accuracy", ... at
// step = epoch, "epoch_learning_rate", "epoch_steps_per_second" and, with backups,
// "epoch_checkpoint_save_seconds", and with update_freq = N
// also "batch_loss", ... every N steps at the global step. With profile_steps = N, every N steps
// each worker's step-time split and memory go to log_dir/profile/worker_<rank> (one run per
// worker, so TensorBoard overlays the workers): "profile/step_seconds" (per step, averaged over
// the N steps) = "profile/compute_seconds" + "profile/communication_seconds" +
// "profile/waiting_seconds" + "profile/other_seconds" (input, callbacks, epoch ends), and
// "memory/peak_rss_bytes" (the process's RSS high-water mark), "memory/tensor_peak_bytes" and
// "memory/tensor_bytes_in_use" (the tensor allocator's). Under a multi-worker strategy the
// workers all-gather these (every worker must run the callback with the same profile_steps, as
// `dtrain fit --profile-steps` does) and only the chief writes. Text entries (failures, restarts,
// recoveries) go to log_dir/train through text(). Used from the thread that calls fit(); text() is
// thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/train/callbacks.h"

namespace dtrain::summary {
class SummaryWriter;
}

namespace dtrain::train {

struct TensorBoardOptions {
  int64_t update_freq = 0;  // also write batch-level scalars every this many steps; 0: epochs only
  // Every this many steps, write each worker's step-time split and peak memory (0: never).
  int64_t profile_steps = 0;
};

class TensorBoard : public Callback {
 public:
  explicit TensorBoard(std::string log_dir = "logs", TensorBoardOptions options = {});
  ~TensorBoard() override;

  void on_train_begin(const Logs& logs) override;
  void on_epoch_begin(int64_t epoch, const Logs& logs) override;
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
  void on_epoch_end(int64_t epoch, const Logs& logs) override;
  // Writes a "dtrain/recovery" text entry: where the run resumed.
  void on_train_resumed(int64_t epoch, int64_t step_in_epoch, const std::string& from) override;
  void on_train_end(const Logs& logs) override;

  // Writes a markdown text entry with `tag` at `step` to the train run (e.g. a failure report);
  // flushed at once. A no-op on workers other than the chief, or before on_train_begin.
  void text(const std::string& tag, const std::string& markdown, int64_t step);
  // Writes one scalar to the train run (e.g. "checkpoint_save_seconds", "restarts").
  void scalar(const std::string& tag, double value, int64_t step);

  const std::string& log_dir() const { return log_dir_; }

 private:
  std::string log_dir_;
  TensorBoardOptions options_;
  std::mutex mu_;
  std::unique_ptr<summary::SummaryWriter> train_;       // guarded by mu_
  std::unique_ptr<summary::SummaryWriter> validation_;  // guarded by mu_
  // profile_steps: the per-worker runs (guarded by mu_), and the step times, clock and step at
  // the last report.
  void profile();
  std::vector<std::unique_ptr<summary::SummaryWriter>> profile_;
  double last_compute_ = 0, last_communication_ = 0, last_waiting_ = 0;
  std::chrono::steady_clock::time_point last_profile_;
  int64_t last_profile_step_ = 0;
  int64_t global_step_ = 0;
  int64_t epoch_steps_ = 0;
  std::chrono::steady_clock::time_point epoch_start_;
};

}  // namespace dtrain::train
