// Optimizer: the base of dtrain's optimizers, with the semantics of Keras >= 2.11
// (tf.keras.optimizers.Optimizer, the "new" optimizers): an int64 "iteration" counter, slot
// variables created per model variable and named "<OptName>/<slot>/<variable name>", an optional
// learning-rate schedule evaluated at the step count before each update, and decoupled weight
// decay. An optimizer is not thread-safe: one thread calls apply_gradients at a time (replicas
// all-reduce gradients first and then apply the same update).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/core/tensor.h"
#include "dtrain/optim/schedules.h"

namespace dtrain::optim {

// An optimizer's Keras config: class name, name, and hyperparameters under Keras's config keys
// in Keras's order (booleans as 0/1; weight_decay 0 means None). When the learning rate is a
// schedule, "learning_rate" is absent and `learning_rate_schedule` holds the schedule's config.
struct OptimizerConfig {
  std::string class_name;  // "SGD", "Adam", "AdamW", "RMSprop"
  std::string name;        // the optimizer's name(); empty means the class's default
  std::vector<std::pair<std::string, double>> hyperparameters;
  std::shared_ptr<const ScheduleConfig> learning_rate_schedule = nullptr;
  // Optimizer::exclude_from_weight_decay's names (not part of Keras's config, see saving).
  std::vector<std::string> exclude_from_weight_decay = {};

  // The value under `key`, or nullptr.
  const double* find(std::string_view key) const;
};

// Keras's gradient clipping arguments, applied to the gradients before weight decay and the
// update (0 = None). At most one may be set (Keras raises otherwise):
//   clipnorm:        g ← g·clipnorm / max(‖g‖, clipnorm) for each variable (tf.clip_by_norm);
//   global_clipnorm: every g ← g·clip·min(1/N, 1/clip), N = √(Σ‖g‖²) over all the gradients of
//                    the update (tf.clip_by_global_norm; a non-finite N gives NaN gradients);
//   clipvalue:       g ← clip(g, −clipvalue, clipvalue) element-wise.
// Norms are summed in double: each row (slice of the first axis; a scalar is one row) element by
// element, then the rows in order, then the variables in order (Optimizer::squared_norm). So they
// do not depend on how update_part splits the work, and a worker holding whole rows of the summed
// gradient computes the same partial sums (sharded optimizer state, distribute/sharded_update.h).
struct GradientClipping {
  double clipnorm = 0.0;
  double clipvalue = 0.0;
  double global_clipnorm = 0.0;
  bool any() const { return clipnorm > 0.0 || clipvalue > 0.0 || global_clipnorm > 0.0; }
  bool by_norm() const { return clipnorm > 0.0 || global_clipnorm > 0.0; }
};

class Optimizer {
 public:
  // Most slots any optimizer keeps per variable (Adam with amsgrad: m, v, vhat).
  static constexpr int kMaxSlots = 3;

  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Applies one update: for each i, updates *vars[i] with grads[i], then increments
  // iterations(). An undefined grads[i] skips vars[i] (TF does the same for None gradients).
  // Creates missing slots first (as build(vars)); after that it allocates nothing. Checks every
  // argument before changing anything; throws InvalidArgumentError when the sizes differ, a
  // variable is null or not float32, a gradient's dtype or shape differs from its variable's
  // (naming the variable and both shapes), or every gradient is undefined. Each variable may
  // appear once.
  void apply_gradients(std::span<const Tensor> grads, std::span<Variable* const> vars);
  // apply_gradients split for several threads (MirroredStrategy's replicas): prepare_update()
  // checks the arguments and creates missing slots as apply_gradients does (and throws the
  // same errors); then update_part(grads, vars, p, parts) for every p in [0, parts), called
  // concurrently from different threads, updates elements element_range(n, p, parts) of each
  // variable (every optimizer's update is element-wise); finish_update() increments
  // iterations(). Between prepare_update and finish_update nothing else may use the optimizer.
  // The result is bitwise that of apply_gradients. Allocates nothing once the slots exist.
  // With clipnorm or global_clipnorm (clipping().by_norm()), prepare_update also computes the
  // gradients' norms, so it must see the final (reduced) gradients: call it after the
  // all-reduce, not before (clipvalue and no clipping allow either).
  // `clip_scales`, when given (one per gradient), replaces the scales clipping by norm would
  // compute from `grads`: for an update of shards of the variables, whose norms need rows other
  // workers hold (the caller computes them with the functions below).
  void prepare_update(std::span<const Tensor> grads, std::span<Variable* const> vars,
                      std::span<const float> clip_scales = {});
  void update_part(std::span<const Tensor> grads, std::span<Variable* const> vars, int part,
                   int parts);
  void finish_update();
  // Part `part` of `parts` of [0, n) as [first, second): contiguous, in order, covering [0, n),
  // with inner boundaries on multiples of 16 elements (64-byte cache lines of float32).
  static std::pair<int64_t, int64_t> element_range(int64_t n, int part, int parts);

  // Clipping's sums (GradientClipping): Σ x² of `n` floats in double, in order (one row); the
  // squared norm of a gradient as its rows' sums added in row order; and the scale that
  // clipnorm gives a gradient of squared norm `squared`, and global_clipnorm every gradient when
  // the squared norms add up (variable by variable, in order) to `total`.
  static double row_sum_of_squares(const float* p, int64_t n);
  static double squared_norm(const Tensor& g);
  static float clipnorm_scale(double squared, double clipnorm);
  static float global_clipnorm_scale(double total, double global_clipnorm);

  // Forgets the slots of `vars` (and frees them): for sharded optimizer state, whose shard
  // variables die before the optimizer (distribute/sharded_update.h). Variables without slots
  // are ignored. Must not be called between prepare_update and finish_update.
  void drop_slots(std::span<Variable* const> vars);

  // Creates the slot variables (zeros, non-trainable) of each variable that has none yet, slot
  // by slot as Keras does (all "m", then all "v"), so a checkpoint can be restored into them
  // before the first step. Throws InvalidArgumentError for a null or non-float32 variable.
  void build(std::span<Variable* const> vars);

  // The clipping arguments (see GradientClipping).
  const GradientClipping& clipping() const { return clipping_; }

  // Keras 3's exclude_from_weight_decay(var_names=...): variables whose name contains any of
  // `var_names` as a substring (Keras searches the names as regular expressions; dtrain matches
  // them literally) get no weight decay. Must be called before the optimizer is built (its first
  // update or build()); throws FailedPreconditionError otherwise. Replaces earlier names.
  void exclude_from_weight_decay(std::vector<std::string> var_names);
  const std::vector<std::string>& excluded_from_weight_decay() const { return exclude_names_; }
  // Whether weight decay applies to `var` (weight_decay > 0 and its name matches no exclusion).
  bool uses_weight_decay(const Variable& var) const;

  // Number of updates applied so far.
  int64_t iterations() const;
  // The int64 scalar variable "iteration" (non-trainable) that holds iterations(), for
  // checkpoints.
  Variable& iterations_variable() { return iterations_; }

  // The learning rate the next update uses: the schedule evaluated at iterations() when there is
  // one, else the constant.
  float learning_rate() const;
  // Sets a constant learning rate (dropping any schedule).
  void set_learning_rate(float learning_rate);
  // Makes the learning rate follow `schedule` (throws InvalidArgumentError if null).
  void set_learning_rate_schedule(std::shared_ptr<LearningRateSchedule> schedule);
  // The schedule, or nullptr when the learning rate is constant.
  const std::shared_ptr<LearningRateSchedule>& learning_rate_schedule() const { return schedule_; }

  // "Adam", "SGD", ... (the options' name).
  const std::string& name() const { return name_; }
  // The names of the slots each variable gets, in creation order ({"m", "v"} for Adam).
  std::vector<std::string> slot_names() const { return slot_names_; }
  // The slot `slot_name` of `var`, or nullptr when build() has not seen `var` or the optimizer
  // keeps no such slot.
  Variable* slot(const Variable& var, std::string_view slot_name);
  // "iteration" first, then every slot variable in creation order, like Keras's
  // optimizer.variables().
  std::vector<Variable*> variables();

  // The Keras config of this optimizer; optimizer_from_config() rebuilds an equal one (without
  // its state: iterations and slots).
  virtual OptimizerConfig get_config() const = 0;

 protected:
  // Per-update values a subclass's update_step reads.
  struct StepContext {
    int64_t step;               // iterations() before this update (Keras's local_step is step + 1)
    float lr;                   // learning rate at `step`
    double weight_decay = 0.0;  // for this variable: 0 when excluded (fusing kernels read this)
  };

  // `slot_names` are the slots each variable gets, at most kMaxSlots. A subclass whose kernel
  // applies weight decay itself passes fuses_weight_decay = true; otherwise apply_gradients
  // applies var ← var − var·weight_decay·lr before update_step.
  Optimizer(std::string name, double learning_rate, double weight_decay,
            std::vector<std::string> slot_names, GradientClipping clipping = {},
            bool fuses_weight_decay = false);
  // The clipping fields of an options struct.
  template <class Options>
  static GradientClipping clipping_of(const Options& o) {
    return {.clipnorm = o.clipnorm, .clipvalue = o.clipvalue, .global_clipnorm = o.global_clipnorm};
  }

  // Updates one variable, var and g [n], whose slots (in slot_names() order) are `slots`.
  // Must not allocate.
  virtual void update_step(const StepContext& ctx, float* var, const float* g, int64_t n,
                           float* const* slots) = 0;

  double weight_decay() const { return weight_decay_; }
  // Fills clip_scales_ from the gradients' norms (clipnorm / global_clipnorm).
  void compute_clip_scales(std::span<const Tensor> grads);
  // Adds "learning_rate" (constant only) to `config`, or sets its schedule.
  void add_learning_rate_to_config(OptimizerConfig& config) const;
  // Adds the clipping arguments that are set, and the weight-decay exclusions, to `config`.
  void add_clipping_to_config(OptimizerConfig& config) const;

 private:
  struct SlotSet {
    std::array<Variable*, kMaxSlots> variables{};
    std::array<float*, kMaxSlots> data{};
    bool decay = true;         // weight decay applies (see exclude_from_weight_decay)
    float* clipped = nullptr;  // the clipped gradient, when clipping is on
  };

  std::string name_;
  double learning_rate_;  // used when schedule_ is null
  std::shared_ptr<LearningRateSchedule> schedule_;
  double weight_decay_;
  bool fuses_weight_decay_;
  std::vector<std::string> slot_names_;
  GradientClipping clipping_;
  std::vector<std::string> exclude_names_;
  std::vector<float> clip_scales_;    // per gradient of the pending update (clipping by norm)
  std::vector<Tensor> clip_buffers_;  // one per variable when clipping is on
  Variable iterations_;
  std::unordered_map<int64_t, SlotSet> slots_;  // by Variable::id()
  StepContext pending_{};                       // between prepare_update and finish_update
  std::vector<std::unique_ptr<Variable>> slot_variables_;  // creation order
};

// Builds the optimizer a config describes (class names as Keras spells them, any case).
// Hyperparameters absent from the config take their Keras defaults. Throws
// InvalidArgumentError for an unknown class name (listing the known ones), an unknown
// hyperparameter key, or an invalid value.
std::unique_ptr<Optimizer> optimizer_from_config(const OptimizerConfig& config);

// An optimizer with Keras's defaults from Keras's string identifiers "sgd", "adam", "adamw",
// "rmsprop" (any case). Throws InvalidArgumentError listing the known names otherwise.
std::unique_ptr<Optimizer> optimizer_from_name(const std::string& name);

}  // namespace dtrain::optim
