// SGD with optional (Nesterov) momentum, as keras.optimizers.SGD (Keras >= 2.11). Not
// thread-safe (see optimizer.h).
#pragma once

#include <string>

#include "dtrain/optim/optimizer.h"

namespace dtrain::optim {

struct SGDOptions {
  double learning_rate = 0.01;  // step size (a schedule can replace it later)
  double momentum = 0.0;        // in [0, 1]; 0 is plain SGD and keeps no slot
  bool nesterov = false;        // Nesterov momentum (needs momentum > 0 to matter)
  double weight_decay = 0.0;    // decoupled decay var −= var·wd·lr before the step; 0 = None
  // Gradient clipping, as Keras's optimizer arguments (0 = None; at most one may be set):
  double clipnorm = 0.0;         // clip each gradient to this L2 norm
  double clipvalue = 0.0;        // clip each gradient element to [-clipvalue, clipvalue]
  double global_clipnorm = 0.0;  // scale all gradients so their global L2 norm is <= this
  std::string name = "SGD";      // prefix of slot variable names
};

// Keras's update: m ← momentum·m − lr·g; var ← var + m, or with nesterov
// var ← var + momentum·m − lr·g; without momentum var ← var − lr·g. Slot "m" only when
// momentum > 0.
class SGD final : public Optimizer {
 public:
  // Throws InvalidArgumentError when momentum is outside [0, 1] or a value is not finite.
  explicit SGD(SGDOptions options = {});
  const SGDOptions& options() const { return options_; }
  OptimizerConfig get_config() const override;

 private:
  void update_step(const StepContext& ctx, float* var, const float* g, int64_t n,
                   float* const* slots) override;

  SGDOptions options_;
};

}  // namespace dtrain::optim
