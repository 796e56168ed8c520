// RMSprop: Keras's plain, momentum and centered variants through one fused kernel.
#include "dtrain/optim/rmsprop.h"

#include <cmath>

#include "dtrain/core/error.h"
#include "dtrain/ops/optimizer_kernels.h"

namespace dtrain::optim {
namespace {

std::vector<std::string> rmsprop_slots(const RMSpropOptions& o) {
  std::vector<std::string> slots{"velocity"};
  if (o.momentum > 0.0) slots.push_back("momentum");
  if (o.centered) slots.push_back("average_gradient");
  return slots;
}

}  // namespace

RMSprop::RMSprop(RMSpropOptions options)
    : Optimizer(options.name, options.learning_rate, options.weight_decay, rmsprop_slots(options),
                clipping_of(options)),
      options_(std::move(options)) {
  DTRAIN_CHECK(options_.rho >= 0.0 && options_.rho <= 1.0, "RMSprop: rho must be in [0, 1], got ",
               options_.rho);
  DTRAIN_CHECK(std::isfinite(options_.momentum) && options_.momentum >= 0.0,
               "RMSprop: momentum must be finite and >= 0, got ", options_.momentum);
  DTRAIN_CHECK(std::isfinite(options_.epsilon) && options_.epsilon >= 0.0,
               "RMSprop: epsilon must be finite and >= 0, got ", options_.epsilon);
}

void RMSprop::update_step(const StepContext& ctx, float* var, const float* g, int64_t n,
                          float* const* slots) {
  const bool has_momentum = options_.momentum > 0.0;
  float* mom = has_momentum ? slots[1] : nullptr;
  float* avg_grad = options_.centered ? slots[has_momentum ? 2 : 1] : nullptr;
  ops::rmsprop_update(var, slots[0], mom, avg_grad, g, n, ctx.lr, static_cast<float>(options_.rho),
                      static_cast<float>(1.0 - options_.rho), static_cast<float>(options_.momentum),
                      static_cast<float>(options_.epsilon));
}

OptimizerConfig RMSprop::get_config() const {
  OptimizerConfig c{"RMSprop", name(), {}, nullptr};
  add_learning_rate_to_config(c);
  c.hyperparameters.emplace_back("rho", options_.rho);
  c.hyperparameters.emplace_back("momentum", options_.momentum);
  c.hyperparameters.emplace_back("epsilon", options_.epsilon);
  c.hyperparameters.emplace_back("centered", options_.centered ? 1.0 : 0.0);
  c.hyperparameters.emplace_back("weight_decay", options_.weight_decay);
  add_clipping_to_config(c);
  return c;
}

}  // namespace dtrain::optim
