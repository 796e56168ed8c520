// SGD: Keras's momentum and Nesterov updates through the fused kernels.
#include "dtrain/optim/sgd.h"

#include <cmath>

#include "dtrain/core/error.h"
#include "dtrain/ops/optimizer_kernels.h"

namespace dtrain::optim {
namespace {

std::vector<std::string> sgd_slots(const SGDOptions& o) {
  if (o.momentum > 0.0) return {"m"};
  return {};
}

}  // namespace

SGD::SGD(SGDOptions options)
    : Optimizer(options.name, options.learning_rate, options.weight_decay, sgd_slots(options),
                clipping_of(options)),
      options_(std::move(options)) {
  DTRAIN_CHECK(options_.momentum >= 0.0 && options_.momentum <= 1.0, "SGD: momentum must be in ",
               "[0, 1], got ", options_.momentum);
}

void SGD::update_step(const StepContext& ctx, float* var, const float* g, int64_t n,
                      float* const* slots) {
  if (options_.momentum <= 0.0) {
    ops::sgd_update(var, g, n, ctx.lr);
    return;
  }
  const float momentum = static_cast<float>(options_.momentum);
  if (options_.nesterov) {
    ops::sgd_nesterov_update(var, slots[0], g, n, ctx.lr, momentum);
  } else {
    ops::sgd_momentum_update(var, slots[0], g, n, ctx.lr, momentum);
  }
}

OptimizerConfig SGD::get_config() const {
  OptimizerConfig c{"SGD", name(), {}, nullptr};
  add_learning_rate_to_config(c);
  c.hyperparameters.emplace_back("momentum", options_.momentum);
  c.hyperparameters.emplace_back("nesterov", options_.nesterov ? 1.0 : 0.0);
  c.hyperparameters.emplace_back("weight_decay", options_.weight_decay);
  add_clipping_to_config(c);
  return c;
}

}  // namespace dtrain::optim
