// Finite-difference gradient checks (after Flashlight's jacobianTestImpl): the analytic
// gradient of L = Σ f(inputs) ⊙ R, for a fixed random R, is compared with central differences
// on every input element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/core/random.h"

namespace dtrain::testutil {

inline Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Philox rng(seed);
  Tensor t(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.num_elements(); ++i) p[i] = rng.uniform(lo, hi);
  return t;
}

// Returns the largest mismatch |analytic − numeric| / max(1, |numeric|) over all elements.
inline double gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                        std::vector<Tensor> inputs, float eps = 1e-2f) {
  Tensor probe;
  {
    NoGradGuard no_grad;
    probe = f(inputs);
  }
  const Tensor r = random_tensor(probe.shape(), 1234, 0.5f, 1.5f);
  auto loss_of = [&](const std::vector<Tensor>& xs) {
    NoGradGuard no_grad;
    const Tensor y = f(xs);
    double s = 0;
    for (int64_t i = 0; i < y.num_elements(); ++i) {
      s += static_cast<double>(y.data<float>()[i]) * r.data<float>()[i];
    }
    return s;
  };
  std::vector<Tensor> analytic;
  {
    GradientTape tape;
    for (auto& x : inputs) tape.watch(x);
    const Tensor loss = reduce_sum(multiply(f(inputs), r));
    analytic = tape.gradient(loss, inputs);
  }
  double worst = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    EXPECT_TRUE(analytic[k].defined()) << "no gradient for input " << k;
    if (!analytic[k].defined()) return 1e9;
    EXPECT_EQ(analytic[k].shape(), inputs[k].shape());
    for (int64_t i = 0; i < inputs[k].num_elements(); ++i) {
      std::vector<Tensor> xs;
      for (auto& x : inputs) xs.push_back(x.clone());
      float* p = xs[k].data<float>();
      const float orig = p[i];
      p[i] = orig + eps;
      const double up = loss_of(xs);
      p[i] = orig - eps;
      const double down = loss_of(xs);
      const double numeric = (up - down) / (2.0 * eps);
      const double a = analytic[k].data<float>()[i];
      const double err = std::fabs(a - numeric) / std::max(1.0, std::fabs(numeric));
      if (err > worst) worst = err;
    }
  }
  return worst;
}

}  // namespace dtrain::testutil
