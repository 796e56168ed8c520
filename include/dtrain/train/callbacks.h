// Keras-style training callbacks: hooks that fit()/evaluate() call at the start and end of
// training, epochs and batches, with the running logs ({"loss": ..., "accuracy": ...}).
// Callbacks run on the thread that calls fit(); they are not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/nn/model.h"

namespace dtrain::train {

using nn::Logs;

class Callback {
 public:
  virtual ~Callback() = default;
  // fit() hands every callback its model before training starts.
  void set_model(nn::Model* model) { model_ = model; }
  nn::Model* model() const { return model_; }

  virtual void on_train_begin(const Logs& /*logs*/) {}
  virtual void on_train_end(const Logs& /*logs*/) {}
  virtual void on_epoch_begin(int64_t /*epoch*/, const Logs& /*logs*/) {}
  // `logs` holds the epoch's training metrics and, with validation data, "val_"-prefixed ones.
  virtual void on_epoch_end(int64_t /*epoch*/, const Logs& /*logs*/) {}
  virtual void on_train_batch_begin(int64_t /*batch*/, const Logs& /*logs*/) {}
  // `logs` holds the running (epoch-to-date) metrics.
  virtual void on_train_batch_end(int64_t /*batch*/, const Logs& /*logs*/) {}
  virtual void on_test_begin(const Logs& /*logs*/) {}
  virtual void on_test_end(const Logs& /*logs*/) {}
  virtual void on_test_batch_end(int64_t /*batch*/, const Logs& /*logs*/) {}
  // fit() resumes from a backup (BackupAndRestore restored it in on_train_begin): training
  // continues at `epoch` (0-based) after `step_in_epoch` of its steps; `from` names the
  // checkpoint. Called after every callback's on_train_begin. (A dtrain addition to Keras's hooks.)
  virtual void on_train_resumed(int64_t /*epoch*/, int64_t /*step_in_epoch*/,
                                const std::string& /*from*/) {}
  // The process is being preempted (SIGTERM) after this step: save what must survive now;
  // fit() throws PreemptedError when every callback has returned (see train/preemption.h).
  virtual void on_preemption(int64_t /*epoch*/, int64_t /*step_in_epoch*/) {}
  // fit() saw too many non-finite steps in a row: put the model and optimizer back to the last
  // good state if you can. Returns whether it did (BackupAndRestore does).
  virtual bool restore_last_good() { return false; }

  // State across epochs that training needs to continue as if it had never stopped
  // (EarlyStopping's wait count and best value). BackupAndRestore saves it with every backup and
  // in-memory snapshot, under "callbacks/<state_name()>" (a second callback of the same name gets
  // "_1", and so on), and hands it back through set_state() when fit() resumes — after every
  // on_train_begin — and when the survivors of a failure roll back to a snapshot (so an epoch
  // that ends again is not counted twice). The tensors' number, dtypes and shapes must not
  // depend on the values (a restore checks them against state()'s). An empty name: no state.
  // (A dtrain addition to Keras's callbacks, which restart such counts after a restore.)
  virtual std::string state_name() const { return {}; }
  virtual std::vector<Tensor> state() const { return {}; }
  virtual void set_state(const std::vector<Tensor>& /*state*/) {}

 private:
  nn::Model* model_ = nullptr;
};

// Asks a running fit() to stop after the current batch (Keras's model.stop_training = True).
void request_stop_training(nn::Model& model);

// Callback from plain functions (keras.callbacks.LambdaCallback); unset members do nothing.
struct LambdaCallbackOptions {
  std::function<void(const Logs&)> on_train_begin = {};
  std::function<void(const Logs&)> on_train_end = {};
  std::function<void(int64_t, const Logs&)> on_epoch_begin = {};
  std::function<void(int64_t, const Logs&)> on_epoch_end = {};
  std::function<void(int64_t, const Logs&)> on_batch_begin = {};
  std::function<void(int64_t, const Logs&)> on_batch_end = {};
};

class LambdaCallback : public Callback {
 public:
  explicit LambdaCallback(LambdaCallbackOptions options) : o_(std::move(options)) {}
  void on_train_begin(const Logs& l) override {
    if (o_.on_train_begin) o_.on_train_begin(l);
  }
  void on_train_end(const Logs& l) override {
    if (o_.on_train_end) o_.on_train_end(l);
  }
  void on_epoch_begin(int64_t e, const Logs& l) override {
    if (o_.on_epoch_begin) o_.on_epoch_begin(e, l);
  }
  void on_epoch_end(int64_t e, const Logs& l) override {
    if (o_.on_epoch_end) o_.on_epoch_end(e, l);
  }
  void on_train_batch_begin(int64_t b, const Logs& l) override {
    if (o_.on_batch_begin) o_.on_batch_begin(b, l);
  }
  void on_train_batch_end(int64_t b, const Logs& l) override {
    if (o_.on_batch_end) o_.on_batch_end(b, l);
  }

 private:
  LambdaCallbackOptions o_;
};

struct EarlyStoppingOptions {
  std::string monitor = "val_loss";  // a key of the epoch logs
  double min_delta = 0.0;            // smaller improvements do not count
  int64_t patience = 0;              // epochs without improvement before stopping
  std::string mode = "auto";         // "min", "max", or "auto" (max for accuracy-like names)
  std::optional<double> baseline = std::nullopt;  // must beat this to count as improving
  bool restore_best_weights = false;              // copy back the best epoch's weights
  int64_t start_from_epoch = 0;                   // warm-up epochs not monitored
};

// Stops training when the monitored value stops improving (keras.callbacks.EarlyStopping).
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options = {});
  void on_train_begin(const Logs& logs) override;
  void on_epoch_end(int64_t epoch, const Logs& logs) override;
  void on_train_end(const Logs& logs) override;
  // The epoch at which training was stopped (0-based), or -1.
  int64_t stopped_epoch() const { return stopped_epoch_; }
  // Epochs without improvement so far.
  int64_t wait() const { return wait_; }
  // "early_stopping": float64 [4] = {wait, best, stopped epoch, whether best weights are held},
  // then, with restore_best_weights, one tensor per model weight (the best epoch's values, or
  // the current ones while none are held).
  std::string state_name() const override { return "early_stopping"; }
  std::vector<Tensor> state() const override;
  void set_state(const std::vector<Tensor>& state) override;

 private:
  bool improved(double current, double reference) const;

  EarlyStoppingOptions o_;
  bool maximize_ = false;
  int64_t wait_ = 0;
  int64_t stopped_epoch_ = -1;
  double best_ = 0;
  std::vector<Tensor> best_weights_;
};

// Stops training as soon as a batch loss is NaN or infinite (keras.callbacks.TerminateOnNaN).
class TerminateOnNaN : public Callback {
 public:
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
};

}  // namespace dtrain::train
