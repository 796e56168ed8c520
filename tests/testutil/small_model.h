// The checkpoint tests' model: Dense(4, relu) on 3 inputs, then Dense(2), seeded; and one
// optimizer step on it with every gradient `g`, so that the optimizer has slots and a nonzero
// iteration count. Layer names follow the session's counters (call nn::clear_session() first
// for "dense" and "dense_1").
#pragma once

#include <vector>

#include "dtrain/nn/layers.h"
#include "dtrain/nn/model.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::testutil {

inline nn::Sequential small_model() {
  return nn::Sequential({nn::Dense(4, {.activation = "relu", .seed = 1, .input_shape = Shape{3}}),
                         nn::Dense(2, {.seed = 2})});
}

inline void constant_gradient_step(nn::Model& model, optim::Optimizer& opt, float g) {
  std::vector<Variable*> vars = model.trainable_variables();
  std::vector<Tensor> grads;
  for (Variable* v : vars) grads.push_back(Tensor::full(v->shape(), g));
  opt.apply_gradients(grads, vars);
}

}  // namespace dtrain::testutil
