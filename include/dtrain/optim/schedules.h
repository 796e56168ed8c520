// Learning-rate schedules, as keras.optimizers.schedules: a schedule maps the optimizer's step
// count (iterations before the update) to a learning rate. Schedules are immutable after
// construction, so one schedule may be shared by several optimizers and threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::optim {

// A schedule's Keras config: its class name and its arguments in Keras's order. Scalars are in
// `scalars` (booleans as 0/1), lists in `lists`.
// Arguments that are schedules themselves (LinearWarmup's after_warmup_lr_sched) are in
// `schedules`.
struct ScheduleConfig {
  std::string class_name;                                               // "ExponentialDecay"
  std::vector<std::pair<std::string, double>> scalars;                  // ("decay_steps", 1000)
  std::vector<std::pair<std::string, std::vector<double>>> lists = {};  // ("boundaries", {..})
  std::vector<std::pair<std::string, ScheduleConfig>> schedules = {};   // nested schedules
};

class LearningRateSchedule {
 public:
  virtual ~LearningRateSchedule() = default;
  // The learning rate at `step` (0 for the first update). Does not allocate.
  virtual float operator()(int64_t step) const = 0;
  // The Keras config that schedule_from_config() turns back into an equal schedule.
  virtual ScheduleConfig get_config() const = 0;
};

// initial_learning_rate · decay_rate^(step / decay_steps), with the exponent floored when
// `staircase` (keras.optimizers.schedules.ExponentialDecay). Throws InvalidArgumentError when
// decay_steps <= 0.
class ExponentialDecay final : public LearningRateSchedule {
 public:
  ExponentialDecay(double initial_learning_rate, int64_t decay_steps, double decay_rate,
                   bool staircase = false);
  float operator()(int64_t step) const override;
  ScheduleConfig get_config() const override;

 private:
  double initial_learning_rate_;
  int64_t decay_steps_;
  double decay_rate_;
  bool staircase_;
};

// values[0] while step <= boundaries[0], values[i] while boundaries[i-1] < step <=
// boundaries[i], values.back() after the last boundary (keras PiecewiseConstantDecay). Throws
// InvalidArgumentError unless values.size() == boundaries.size() + 1 and the boundaries are
// non-decreasing.
class PiecewiseConstantDecay final : public LearningRateSchedule {
 public:
  PiecewiseConstantDecay(std::vector<int64_t> boundaries, std::vector<double> values);
  float operator()(int64_t step) const override;
  ScheduleConfig get_config() const override;

 private:
  std::vector<int64_t> boundaries_;
  std::vector<double> values_;
};

// keras.optimizers.schedules.CosineDecay (Keras 3, with its linear warmup). With s = min(step,
// decay_steps + warmup_steps):
//   no warmup_target: s = min(step, decay_steps); lr = initial·d(s)
//   s < warmup_steps: lr = initial + (warmup_target − initial)·s / warmup_steps
//   otherwise:        lr = warmup_target·d(s − warmup_steps)
// where d(t) = (1 − alpha)·½(1 + cos(π·t / decay_steps)) + alpha. Throws InvalidArgumentError
// when decay_steps <= 0, warmup_steps < 0, or warmup_steps > 0 without a warmup_target.
struct CosineDecayOptions {
  double initial_learning_rate = 0.0;  // the start (of the warmup, or of the decay without one)
  int64_t decay_steps = 0;             // steps of the cosine decay, after the warmup
  double alpha = 0.0;                  // the final learning rate as a fraction of the peak
  std::optional<double> warmup_target = std::nullopt;  // the peak after warmup; none: no warmup
  int64_t warmup_steps = 0;
};
class CosineDecay final : public LearningRateSchedule {
 public:
  explicit CosineDecay(const CosineDecayOptions& options);
  float operator()(int64_t step) const override;
  ScheduleConfig get_config() const override;

 private:
  CosineDecayOptions o_;
};

// A linear warmup to a constant or into another schedule (TF Model Garden's LinearWarmup, with
// its config keys; Keras has it only inside CosineDecay):
//   step < warmup_steps: lr = warmup_learning_rate + (peak − warmup_learning_rate)·step /
//   warmup_steps otherwise:           lr = after(step)   (the wrapped schedule sees the global
//   step)
// where `after` is after_warmup_schedule, or the constant after_warmup_learning_rate, and peak
// = after(warmup_steps). Throws InvalidArgumentError when warmup_steps < 0 or a rate is not
// finite.
struct LinearWarmupOptions {
  double warmup_learning_rate = 0.0;        // the rate at step 0
  int64_t warmup_steps = 0;                 // 0: no warmup
  double after_warmup_learning_rate = 0.0;  // the constant after the warmup (without a schedule)
  std::shared_ptr<const LearningRateSchedule> after_warmup_schedule = nullptr;
};
class LinearWarmup final : public LearningRateSchedule {
 public:
  explicit LinearWarmup(LinearWarmupOptions options);
  float operator()(int64_t step) const override;
  // {"LinearWarmup", {warmup_steps, warmup_learning_rate[, after_warmup_lr_sched]}}, with the
  // wrapped schedule's config in `schedules` as after_warmup_lr_sched.
  ScheduleConfig get_config() const override;

 private:
  double after(int64_t step) const;
  LinearWarmupOptions o_;
};

// Builds the schedule a ScheduleConfig describes. Throws InvalidArgumentError for an unknown
// class name (listing the known ones), a missing or unknown argument, or invalid values.
std::shared_ptr<LearningRateSchedule> schedule_from_config(const ScheduleConfig& config);

}  // namespace dtrain::optim
