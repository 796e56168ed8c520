// Adam and AdamW, as keras.optimizers.Adam / AdamW (Keras >= 2.11). Not thread-safe (see
// optimizer.h).
#pragma once

#include <string>

#include "dtrain/optim/optimizer.h"

namespace dtrain::optim {

struct AdamOptions {
  double learning_rate = 0.001;  // step size (a schedule can replace it later)
  double beta_1 = 0.9;           // decay of the first-moment estimate m, in [0, 1)
  double beta_2 = 0.999;         // decay of the second-moment estimate v, in [0, 1)
  double epsilon = 1e-7;         // added to √v (Keras's "epsilon hat"), >= 0
  bool amsgrad = false;          // keep vhat = max(vhat, v) and divide by √vhat
  double weight_decay = 0.0;     // decoupled decay var −= var·wd·lr before the step; 0 = None
  // Gradient clipping, as Keras's optimizer arguments (0 = None; at most one may be set):
  double clipnorm = 0.0;         // clip each gradient to this L2 norm
  double clipvalue = 0.0;        // clip each gradient element to [-clipvalue, clipvalue]
  double global_clipnorm = 0.0;  // scale all gradients so their global L2 norm is <= this
  std::string name = "Adam";     // prefix of slot variable names
};

// Keras's update at step t = iterations() + 1:
//   lr_t = lr·√(1 − β2^t)/(1 − β1^t); m += (g − m)(1 − β1); v += (g² − v)(1 − β2);
//   var −= lr_t·m/(√v + ε)
// Slots "m", "v", and "vhat" with amsgrad.
class Adam : public Optimizer {
 public:
  // Throws InvalidArgumentError when a beta is outside [0, 1), epsilon or weight_decay is
  // negative, or a value is not finite.
  explicit Adam(AdamOptions options = {});
  const AdamOptions& options() const { return options_; }
  OptimizerConfig get_config() const override;

 protected:
  Adam(AdamOptions options, const char* class_name);

 private:
  void update_step(const StepContext& ctx, float* var, const float* g, int64_t n,
                   float* const* slots) override;

  AdamOptions options_;
  const char* class_name_;
};

struct AdamWOptions {
  double learning_rate = 0.001;  // step size (a schedule can replace it later)
  double weight_decay = 0.004;   // decoupled decay var −= var·wd·lr before the Adam step
  double beta_1 = 0.9;           // decay of the first-moment estimate m, in [0, 1)
  double beta_2 = 0.999;         // decay of the second-moment estimate v, in [0, 1)
  double epsilon = 1e-7;         // added to √v (Keras's "epsilon hat"), >= 0
  bool amsgrad = false;          // keep vhat = max(vhat, v) and divide by √vhat
  // Gradient clipping, as Keras's optimizer arguments (0 = None; at most one may be set):
  double clipnorm = 0.0;         // clip each gradient to this L2 norm
  double clipvalue = 0.0;        // clip each gradient element to [-clipvalue, clipvalue]
  double global_clipnorm = 0.0;  // scale all gradients so their global L2 norm is <= this
  std::string name = "AdamW";    // prefix of slot variable names
};

// Adam with decoupled weight decay (keras.optimizers.AdamW): var −= var·wd·lr, then Adam.
class AdamW final : public Adam {
 public:
  explicit AdamW(AdamWOptions options = {});
};

}  // namespace dtrain::optim
