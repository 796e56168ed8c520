// RMSprop, as keras.optimizers.RMSprop (Keras >= 2.11). Not thread-safe (see optimizer.h).
#pragma once

#include <string>

#include "dtrain/optim/optimizer.h"

namespace dtrain::optim {

struct RMSpropOptions {
  double learning_rate = 0.001;  // step size (a schedule can replace it later)
  double rho = 0.9;              // decay of the mean square of gradients, in [0, 1]
  double momentum = 0.0;         // >= 0; > 0 keeps a "momentum" slot
  double epsilon = 1e-7;         // added under the square root, >= 0
  bool centered = false;      // divide by the variance estimate v − a² (slot "average_gradient")
  double weight_decay = 0.0;  // decoupled decay var −= var·wd·lr before the step; 0 = None
  // Gradient clipping, as Keras's optimizer arguments (0 = None; at most one may be set):
  double clipnorm = 0.0;         // clip each gradient to this L2 norm
  double clipvalue = 0.0;        // clip each gradient element to [-clipvalue, clipvalue]
  double global_clipnorm = 0.0;  // scale all gradients so their global L2 norm is <= this
  std::string name = "RMSprop";  // prefix of slot variable names
};

// Keras's update: v = ρv + (1 − ρ)g²; centered: a = ρa + (1 − ρ)g, d = v − a² + ε, else
// d = v + ε; inc = lr·g/√d; momentum: mom = momentum·mom + inc, var −= mom; else var −= inc.
// Slots "velocity", then "momentum" (momentum > 0), then "average_gradient" (centered).
class RMSprop final : public Optimizer {
 public:
  // Throws InvalidArgumentError when rho is outside [0, 1], momentum, epsilon or weight_decay is
  // negative, or a value is not finite.
  explicit RMSprop(RMSpropOptions options = {});
  const RMSpropOptions& options() const { return options_; }
  OptimizerConfig get_config() const override;

 private:
  void update_step(const StepContext& ctx, float* var, const float* g, int64_t n,
                   float* const* slots) override;

  RMSpropOptions options_;
};

}  // namespace dtrain::optim
