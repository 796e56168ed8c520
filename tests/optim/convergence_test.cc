// Smoke test: every optimizer, driven by GradientTape + apply_gradients, fits a small linear
// regression (y = x·w* + b*, noise-free) to a low loss and recovers w* and b*.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/core/random.h"
#include "dtrain/optim/adam.h"
#include "dtrain/optim/rmsprop.h"
#include "dtrain/optim/sgd.h"

namespace dtrain::optim {
namespace {

struct Case {
  const char* label;
  std::unique_ptr<Optimizer> (*make)();
  int steps;
};

const Case kCases[] = {
    {"SGD", [] { return std::unique_ptr<Optimizer>(new SGD(SGDOptions{.learning_rate = 0.1})); },
     300},
    {"SGDMomentum",
     [] {
       return std::unique_ptr<Optimizer>(
           new SGD(SGDOptions{.learning_rate = 0.05, .momentum = 0.9}));
     },
     300},
    {"SGDNesterov",
     [] {
       return std::unique_ptr<Optimizer>(
           new SGD(SGDOptions{.learning_rate = 0.05, .momentum = 0.9, .nesterov = true}));
     },
     300},
    {"Adam",
     [] { return std::unique_ptr<Optimizer>(new Adam(AdamOptions{.learning_rate = 0.05})); }, 600},
    {"AdamAmsgrad",
     [] {
       return std::unique_ptr<Optimizer>(
           new Adam(AdamOptions{.learning_rate = 0.05, .amsgrad = true}));
     },
     600},
    {"AdamW",
     [] {
       return std::unique_ptr<Optimizer>(
           new AdamW(AdamWOptions{.learning_rate = 0.05, .weight_decay = 1e-4}));
     },
     600},
    {"RMSprop",
     [] {
       auto opt = std::unique_ptr<Optimizer>(new RMSprop(RMSpropOptions{.learning_rate = 0.02}));
       // RMSprop's step does not shrink with the gradient; decay it to settle.
       opt->set_learning_rate_schedule(std::make_shared<ExponentialDecay>(0.02, 100, 0.5));
       return opt;
     },
     600},
    {"RMSpropCenteredMomentum",
     [] {
       auto opt = std::unique_ptr<Optimizer>(
           new RMSprop(RMSpropOptions{.learning_rate = 0.01, .momentum = 0.5, .centered = true}));
       opt->set_learning_rate_schedule(std::make_shared<PiecewiseConstantDecay>(
           std::vector<int64_t>{200, 400}, std::vector<double>{0.01, 0.002, 0.0005}));
       return opt;
     },
     600},
};

class ConvergenceTest : public ::testing::TestWithParam<int> {};

TEST_P(ConvergenceTest, FitsLinearRegression) {
  const Case& c = kCases[GetParam()];
  constexpr int64_t kN = 64, kIn = 3;
  const float w_true[kIn] = {1.5f, -2.0f, 0.5f};
  const float b_true = 0.3f;
  Philox rng(11);
  Tensor x(Shape{kN, kIn}), y(Shape{kN, 1});
  for (int64_t i = 0; i < kN; ++i) {
    float t = b_true;
    for (int64_t j = 0; j < kIn; ++j) {
      const float v = rng.uniform(-1, 1);
      x.data<float>()[i * kIn + j] = v;
      t += v * w_true[j];
    }
    y.data<float>()[i] = t;
  }
  Variable w("linear/kernel", Tensor::zeros(Shape{kIn, 1}));
  Variable b("linear/bias", Tensor::zeros(Shape{1}));
  std::vector<Variable*> vars{&w, &b};
  std::unique_ptr<Optimizer> opt = c.make();

  auto loss_fn = [&] {
    Tensor err = dense(x, w.value(), b.value(), Activation::kLinear) - y;
    return reduce_mean(err * err);
  };
  const double initial = loss_fn().item();
  double loss = initial;
  std::vector<Tensor> grads;
  for (int step = 0; step < c.steps; ++step) {
    GradientTape tape;
    Tensor l = loss_fn();
    loss = l.item();
    tape.gradient(l, vars, grads);
    opt->apply_gradients(grads, vars);
  }
  loss = loss_fn().item();
  EXPECT_LT(loss, 1e-4 * initial) << c.label << ": loss " << initial << " -> " << loss;
  for (int j = 0; j < kIn; ++j) EXPECT_NEAR(w.tensor().data<float>()[j], w_true[j], 0.02) << j;
  EXPECT_NEAR(b.tensor().data<float>()[0], b_true, 0.02);
  EXPECT_EQ(opt->iterations(), c.steps);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ConvergenceTest,
                         ::testing::Range(0, static_cast<int>(std::size(kCases))),
                         [](const auto& info) { return std::string(kCases[info.param].label); });

}  // namespace
}  // namespace dtrain::optim
