// The state the sharded-checkpoint tests save and restore (shared by the worker program and the
// tests): a Dense-BatchNorm-Dense model with Adam slots after `steps` deterministic updates, an
// epoch counter and an RNG. Every process computes the same bits for the same `steps`.
#pragma once

#include <cmath>
#include <utility>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/core/random.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/model.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/optim/adam.h"

namespace dtrain::testing {

struct ShardedState {
  nn::Sequential model{nn::Dense(16, {.seed = 1, .input_shape = Shape{12}}),
                       nn::BatchNormalization(), nn::Dense(5, {.seed = 2})};
  optim::Adam opt;
  int64_t epoch = 0;
  Philox rng{7, 0};

  // Applies Adam updates with element-varying gradients until `steps` were applied, and sets
  // the non-trainable state from the step count.
  void advance_to(int steps) {
    for (; epoch < steps; ++epoch) {
      std::vector<Variable*> vars = model.trainable_variables();
      std::vector<Tensor> grads;
      for (Variable* v : vars) {
        Tensor g(DType::kFloat32, v->shape());
        for (int64_t i = 0; i < g.num_elements(); ++i)
          g.data<float>()[i] =
              0.1f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(epoch));
        grads.push_back(std::move(g));
      }
      opt.apply_gradients(grads, vars);
      for (Variable* v : model.non_trainable_variables()) {
        Tensor t = v->tensor().clone();
        for (int64_t i = 0; i < t.num_elements(); ++i)
          t.data<float>()[i] += 0.25f * static_cast<float>(i + epoch);
        v->assign(t);
      }
      rng.set_state(
          RngState{static_cast<uint64_t>(1000 + epoch), static_cast<uint64_t>(epoch * 3)});
    }
  }

  std::vector<std::pair<std::string, checkpoint::Trackable>> trackables() {
    return {{"model", checkpoint::Trackable(model)},
            {"optimizer", checkpoint::Trackable(opt)},
            {"epoch", checkpoint::Trackable(epoch)},
            {"rng", checkpoint::Trackable(rng)}};
  }
};

}  // namespace dtrain::testing
