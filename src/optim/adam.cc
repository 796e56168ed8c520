// Adam and AdamW: per-step bias corrections in double, then one fused kernel per variable
// (weight decay included).
#include "dtrain/optim/adam.h"

#include <cmath>

#include "dtrain/core/error.h"
#include "dtrain/ops/optimizer_kernels.h"

namespace dtrain::optim {
namespace {

std::vector<std::string> adam_slots(const AdamOptions& o) {
  if (o.amsgrad) return {"m", "v", "vhat"};
  return {"m", "v"};
}

AdamOptions to_adam(AdamWOptions o) {
  return AdamOptions{.learning_rate = o.learning_rate,
                     .beta_1 = o.beta_1,
                     .beta_2 = o.beta_2,
                     .epsilon = o.epsilon,
                     .amsgrad = o.amsgrad,
                     .weight_decay = o.weight_decay,
                     .clipnorm = o.clipnorm,
                     .clipvalue = o.clipvalue,
                     .global_clipnorm = o.global_clipnorm,
                     .name = std::move(o.name)};
}

}  // namespace

Adam::Adam(AdamOptions options) : Adam(std::move(options), "Adam") {}

Adam::Adam(AdamOptions options, const char* class_name)
    : Optimizer(options.name, options.learning_rate, options.weight_decay, adam_slots(options),
                clipping_of(options), /*fuses_weight_decay=*/true),
      options_(std::move(options)),
      class_name_(class_name) {
  DTRAIN_CHECK(options_.beta_1 >= 0.0 && options_.beta_1 < 1.0, class_name_,
               ": beta_1 must be in [0, 1), got ", options_.beta_1);
  DTRAIN_CHECK(options_.beta_2 >= 0.0 && options_.beta_2 < 1.0, class_name_,
               ": beta_2 must be in [0, 1), got ", options_.beta_2);
  DTRAIN_CHECK(std::isfinite(options_.epsilon) && options_.epsilon >= 0.0, class_name_,
               ": epsilon must be finite and >= 0, got ", options_.epsilon);
}

void Adam::update_step(const StepContext& ctx, float* var, const float* g, int64_t n,
                       float* const* slots) {
  // Keras: local_step = iterations + 1; alpha = lr·√(1 − β2^t)/(1 − β1^t).
  const double t = static_cast<double>(ctx.step + 1);
  const double lr = ctx.lr;
  const float lr_t = static_cast<float>(lr * std::sqrt(1.0 - std::pow(options_.beta_2, t)) /
                                        (1.0 - std::pow(options_.beta_1, t)));
  const float wd_lr = static_cast<float>(ctx.weight_decay * lr);
  // 1 − β in double, rounded once (Keras multiplies by the Python float 1 − β).
  const float b1 = static_cast<float>(1.0 - options_.beta_1);
  const float b2 = static_cast<float>(1.0 - options_.beta_2);
  const float eps = static_cast<float>(options_.epsilon);
  if (options_.amsgrad) {
    ops::adam_amsgrad_update(var, slots[0], slots[1], slots[2], g, n, lr_t, b1, b2, eps, wd_lr);
  } else {
    ops::adam_update(var, slots[0], slots[1], g, n, lr_t, b1, b2, eps, wd_lr);
  }
}

OptimizerConfig Adam::get_config() const {
  OptimizerConfig c{class_name_, name(), {}, nullptr};
  add_learning_rate_to_config(c);
  c.hyperparameters.emplace_back("beta_1", options_.beta_1);
  c.hyperparameters.emplace_back("beta_2", options_.beta_2);
  c.hyperparameters.emplace_back("epsilon", options_.epsilon);
  c.hyperparameters.emplace_back("amsgrad", options_.amsgrad ? 1.0 : 0.0);
  c.hyperparameters.emplace_back("weight_decay", options_.weight_decay);
  add_clipping_to_config(c);
  return c;
}

AdamW::AdamW(AdamWOptions options) : Adam(to_adam(std::move(options)), "AdamW") {}

}  // namespace dtrain::optim
