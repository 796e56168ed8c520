// Finite-difference checks of a layer's variables: the gradients GradientTape returns for
// L = Σ f() ⊙ R (R fixed, random) against central differences of L in every variable element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "testutil/gradcheck.h"

namespace dtrain::testutil {

// Returns the largest |analytic − numeric| / max(1, |numeric|).
inline double weights_gradcheck(const std::function<Tensor()>& f,
                                const std::vector<Variable*>& vars, float eps = 1e-2f) {
  Tensor probe;
  {
    NoGradGuard no_grad;
    probe = f();
  }
  const Tensor r = random_tensor(probe.shape(), 4321, 0.5f, 1.5f);
  auto loss_value = [&] {
    NoGradGuard no_grad;
    const Tensor y = f();
    double s = 0;
    for (int64_t i = 0; i < y.num_elements(); ++i) {
      s += static_cast<double>(y.data<float>()[i]) * r.data<float>()[i];
    }
    return s;
  };
  std::vector<Tensor> grads;
  {
    GradientTape tape;
    grads = tape.gradient(reduce_sum(multiply(f(), r)), vars);
  }
  double worst = 0;
  for (size_t k = 0; k < vars.size(); ++k) {
    EXPECT_TRUE(grads[k].defined()) << vars[k]->name();
    if (!grads[k].defined()) return 1e9;
    float* p = vars[k]->tensor().data<float>();
    for (int64_t i = 0; i < vars[k]->shape().num_elements(); ++i) {
      const float orig = p[i];
      p[i] = orig + eps;
      const double up = loss_value();
      p[i] = orig - eps;
      const double down = loss_value();
      p[i] = orig;
      const double numeric = (up - down) / (2.0 * eps);
      const double err =
          std::fabs(grads[k].data<float>()[i] - numeric) / std::max(1.0, std::fabs(numeric));
      EXPECT_LT(err, 2e-2) << vars[k]->name() << "[" << i << "]";
      worst = std::max(worst, err);
    }
  }
  return worst;
}

}  // namespace dtrain::testutil
