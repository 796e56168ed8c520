// Optimizer base behaviour: slot names and variables() order, eager build(), iterations and
// learning rate, config round trips, the factories and the errors of apply_gradients.
#include "dtrain/optim/optimizer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/core/random.h"
#include "dtrain/optim/adam.h"
#include "dtrain/optim/rmsprop.h"
#include "dtrain/optim/sgd.h"
#include "testutil/expect_throws.h"

namespace dtrain::optim {
namespace {

struct TwoVars {
  Variable kernel{"dense/kernel", Tensor::full(Shape{3, 2}, 0.5)};
  Variable bias{"dense/bias", Tensor::zeros(Shape{2})};
  std::vector<Variable*> vars{&kernel, &bias};
  std::vector<Tensor> grads{Tensor::full(Shape{3, 2}, 0.1), Tensor::full(Shape{2}, -0.2)};
};

std::vector<std::string> names_of(const std::vector<Variable*>& vars) {
  std::vector<std::string> names;
  for (const Variable* v : vars) names.push_back(v->name());
  return names;
}

TEST(Optimizer, AdamSlotNamesAndVariableOrderFollowKeras) {
  TwoVars t;
  Adam adam(AdamOptions{.amsgrad = true});
  EXPECT_EQ(adam.name(), "Adam");
  EXPECT_EQ(adam.slot_names(), (std::vector<std::string>{"m", "v", "vhat"}));
  adam.build(t.vars);
  EXPECT_EQ(names_of(adam.variables()),
            (std::vector<std::string>{"iteration", "Adam/m/dense/kernel", "Adam/m/dense/bias",
                                      "Adam/v/dense/kernel", "Adam/v/dense/bias",
                                      "Adam/vhat/dense/kernel", "Adam/vhat/dense/bias"}));
  Variable* m = adam.slot(t.kernel, "m");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->name(), "Adam/m/dense/kernel");
  EXPECT_EQ(m->shape(), (Shape{3, 2}));
  EXPECT_FALSE(m->trainable());
  EXPECT_EQ(adam.slot(t.kernel, "momentum"), nullptr);
  Variable other("other", Tensor::zeros(Shape{1}));
  EXPECT_EQ(adam.slot(other, "m"), nullptr);
  Variable& it = adam.iterations_variable();
  EXPECT_EQ(it.name(), "iteration");
  EXPECT_EQ(it.dtype(), DType::kInt64);
  EXPECT_EQ(it.shape(), Shape{});
  EXPECT_FALSE(it.trainable());
}

TEST(Optimizer, SlotsPerOptimizer) {
  EXPECT_TRUE(SGD().slot_names().empty());
  EXPECT_EQ(SGD(SGDOptions{.momentum = 0.9}).slot_names(), std::vector<std::string>{"m"});
  EXPECT_EQ(RMSprop().slot_names(), std::vector<std::string>{"velocity"});
  EXPECT_EQ(RMSprop(RMSpropOptions{.momentum = 0.9, .centered = true}).slot_names(),
            (std::vector<std::string>{"velocity", "momentum", "average_gradient"}));
  EXPECT_EQ(RMSprop(RMSpropOptions{.centered = true}).slot_names(),
            (std::vector<std::string>{"velocity", "average_gradient"}));
  AdamW adamw;
  EXPECT_EQ(adamw.name(), "AdamW");
  TwoVars t;
  adamw.build(t.vars);
  EXPECT_EQ(adamw.variables()[1]->name(), "AdamW/m/dense/kernel");
  SGD named(SGDOptions{.momentum = 0.5, .name = "opt"});
  named.build(t.vars);
  EXPECT_EQ(named.slot(t.bias, "m")->name(), "opt/m/dense/bias");
}

TEST(Optimizer, BuildCreatesZeroSlotsEagerlyAndOnlyOnce) {
  TwoVars t;
  Adam adam;
  EXPECT_EQ(adam.variables().size(), 1u);
  adam.build(t.vars);
  ASSERT_EQ(adam.variables().size(), 5u);
  EXPECT_EQ(adam.iterations(), 0);
  EXPECT_EQ(adam.variables()[0]->tensor().item(), 0.0);
  for (size_t k = 1; k < adam.variables().size(); ++k) {
    for (float x : adam.variables()[k]->tensor().to_vector<float>()) EXPECT_EQ(x, 0.0f);
  }
  // A restored slot value survives the first step's implicit build and is used by it.
  adam.slot(t.kernel, "v")->tensor().fill(1.0);
  Variable* m_before = adam.slot(t.kernel, "m");
  adam.apply_gradients(t.grads, t.vars);
  EXPECT_EQ(adam.variables().size(), 5u);
  EXPECT_EQ(adam.slot(t.kernel, "m"), m_before);
  EXPECT_NEAR(adam.slot(t.kernel, "v")->tensor().data<float>()[0], 1.0 + (0.01 - 1.0) * 0.001,
              1e-6);
  // A new variable later gets its slots appended.
  Variable extra("extra", Tensor::zeros(Shape{4}));
  std::vector<Variable*> more{&extra};
  adam.build(more);
  EXPECT_EQ(names_of(adam.variables()).back(), "Adam/v/extra");
}

TEST(Optimizer, IterationsAndLearningRate) {
  TwoVars t;
  SGD sgd(SGDOptions{.learning_rate = 0.5});
  EXPECT_FLOAT_EQ(sgd.learning_rate(), 0.5f);
  sgd.apply_gradients(t.grads, t.vars);
  sgd.apply_gradients(t.grads, t.vars);
  EXPECT_EQ(sgd.iterations(), 2);
  EXPECT_EQ(sgd.iterations_variable().tensor().data<int64_t>()[0], 2);
  EXPECT_FLOAT_EQ(t.kernel.tensor().data<float>()[0], 0.5f - 2 * 0.5f * 0.1f);
  sgd.set_learning_rate_schedule(
      std::make_shared<PiecewiseConstantDecay>(std::vector<int64_t>{2}, std::vector<double>{1, 2}));
  EXPECT_FLOAT_EQ(sgd.learning_rate(), 1.0f);  // evaluated at iterations() = 2 <= 2
  sgd.apply_gradients(t.grads, t.vars);
  EXPECT_FLOAT_EQ(sgd.learning_rate(), 2.0f);
  sgd.set_learning_rate(0.25f);
  EXPECT_EQ(sgd.learning_rate_schedule(), nullptr);
  EXPECT_FLOAT_EQ(sgd.learning_rate(), 0.25f);
  // The iteration variable is the state: restoring it moves the schedule.
  sgd.iterations_variable().tensor().data<int64_t>()[0] = 100;
  EXPECT_EQ(sgd.iterations(), 100);
}

TEST(Optimizer, UndefinedGradientSkipsItsVariable) {
  TwoVars t;
  Adam adam;
  std::vector<Tensor> grads{t.grads[0], Tensor()};
  adam.apply_gradients(grads, t.vars);
  EXPECT_NE(t.kernel.tensor().data<float>()[0], 0.5f);
  EXPECT_EQ(t.bias.tensor().data<float>()[0], 0.0f);
  EXPECT_EQ(adam.slot(t.bias, "m")->tensor().data<float>()[0], 0.0f);
  EXPECT_EQ(adam.iterations(), 1);
}

TEST(Optimizer, ApplyGradientsErrors) {
  TwoVars t;
  Adam adam;
  std::vector<Tensor> one{t.grads[0]};
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] { adam.apply_gradients(one, t.vars); },
      {"Adam.apply_gradients", "1 gradients for 2 variables"});
  std::vector<Tensor> wrong{Tensor::zeros(Shape{2, 3}), t.grads[1]};
  testutil::expect_throws_with<InvalidArgumentError>([&] { adam.apply_gradients(wrong, t.vars); },
                                                     {"dense/kernel", "[2, 3]", "[3, 2]"});
  std::vector<Tensor> wrong_dtype{t.grads[0], Tensor::zeros(Shape{2}, DType::kFloat64)};
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] { adam.apply_gradients(wrong_dtype, t.vars); }, {"dense/bias", "float64"});
  std::vector<Tensor> none{Tensor(), Tensor()};
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] { adam.apply_gradients(none, t.vars); },
      {"no gradients provided for any variable", "dense/kernel", "dense/bias"});
  std::vector<Variable*> null_var{&t.kernel, nullptr};
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] { adam.apply_gradients(t.grads, null_var); }, {"variable 1 is null"});
  Variable ints("step", Tensor::zeros(Shape{2}, DType::kInt32));
  std::vector<Variable*> int_vars{&t.kernel, &ints};
  std::vector<Tensor> int_grads{t.grads[0], Tensor::zeros(Shape{2}, DType::kInt32)};
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] { adam.apply_gradients(int_grads, int_vars); }, {"'step'", "int32"});
  // Nothing was changed by the failed calls.
  EXPECT_EQ(adam.iterations(), 0);
  EXPECT_EQ(t.kernel.tensor().data<float>()[0], 0.5f);
  EXPECT_EQ(adam.variables().size(), 1u);
}

TEST(Optimizer, OptionValidation) {
  testutil::expect_throws_with<InvalidArgumentError>([] { SGD(SGDOptions{.momentum = 1.5}); },
                                                     {"SGD", "momentum", "1.5"});
  testutil::expect_throws_with<InvalidArgumentError>([] { Adam(AdamOptions{.beta_1 = 1.0}); },
                                                     {"Adam", "beta_1"});
  testutil::expect_throws_with<InvalidArgumentError>([] { AdamW(AdamWOptions{.beta_2 = -0.1}); },
                                                     {"AdamW", "beta_2"});
  testutil::expect_throws_with<InvalidArgumentError>([] { RMSprop(RMSpropOptions{.rho = 2}); },
                                                     {"RMSprop", "rho"});
  testutil::expect_throws_with<InvalidArgumentError>([] { Adam(AdamOptions{.weight_decay = -1}); },
                                                     {"weight_decay"});
}

void expect_round_trip(const Optimizer& opt) {
  const OptimizerConfig c = opt.get_config();
  std::unique_ptr<Optimizer> copy = optimizer_from_config(c);
  const OptimizerConfig c2 = copy->get_config();
  EXPECT_EQ(c2.class_name, c.class_name);
  EXPECT_EQ(c2.name, c.name);
  EXPECT_EQ(c2.hyperparameters, c.hyperparameters);
  EXPECT_EQ(copy->slot_names(), opt.slot_names());
  ASSERT_EQ(c2.learning_rate_schedule == nullptr, c.learning_rate_schedule == nullptr);
  if (c.learning_rate_schedule) {
    EXPECT_EQ(c2.learning_rate_schedule->class_name, c.learning_rate_schedule->class_name);
    EXPECT_EQ(c2.learning_rate_schedule->scalars, c.learning_rate_schedule->scalars);
    EXPECT_EQ(c2.learning_rate_schedule->lists, c.learning_rate_schedule->lists);
  }
}

TEST(Optimizer, ConfigRoundTrip) {
  expect_round_trip(SGD(SGDOptions{.learning_rate = 0.1, .momentum = 0.9, .nesterov = true}));
  expect_round_trip(Adam(AdamOptions{.beta_2 = 0.99, .amsgrad = true, .name = "my_adam"}));
  expect_round_trip(AdamW(AdamWOptions{.weight_decay = 0.01}));
  expect_round_trip(RMSprop(RMSpropOptions{.momentum = 0.5, .centered = true}));
  Adam scheduled;
  scheduled.set_learning_rate_schedule(std::make_shared<ExponentialDecay>(0.1, 100, 0.5, true));
  expect_round_trip(scheduled);
  SGD piecewise;
  piecewise.set_learning_rate_schedule(std::make_shared<PiecewiseConstantDecay>(
      std::vector<int64_t>{10, 20}, std::vector<double>{1.0, 0.5, 0.1}));
  expect_round_trip(piecewise);
  EXPECT_EQ(piecewise.get_config().find("learning_rate"), nullptr);
}

TEST(Optimizer, ConfigKeysFollowKeras) {
  const OptimizerConfig c = Adam().get_config();
  EXPECT_EQ(c.class_name, "Adam");
  EXPECT_EQ(c.name, "Adam");
  std::vector<std::string> keys;
  for (const auto& [k, v] : c.hyperparameters) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"learning_rate", "beta_1", "beta_2", "epsilon",
                                            "amsgrad", "weight_decay"}));
  EXPECT_DOUBLE_EQ(*c.find("learning_rate"), 0.001);
  EXPECT_DOUBLE_EQ(*c.find("epsilon"), 1e-7);
  EXPECT_DOUBLE_EQ(*AdamW().get_config().find("weight_decay"), 0.004);
  EXPECT_DOUBLE_EQ(*RMSprop().get_config().find("rho"), 0.9);
  EXPECT_DOUBLE_EQ(*SGD().get_config().find("learning_rate"), 0.01);
}

TEST(Optimizer, FromConfigErrorsAndDefaults) {
  testutil::expect_throws_with<InvalidArgumentError>(
      [] {
        optimizer_from_config({"Adagrad", "", {}, nullptr});
      },
      {"Adagrad", "SGD, Adam, AdamW, RMSprop"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [] {
        optimizer_from_config({"SGD", "", {{"beta_1", 0.9}}, nullptr});
      },
      {"SGD", "'beta_1'"});
  std::unique_ptr<Optimizer> opt = optimizer_from_config({"adam", "", {{"beta_1", 0.8}}, nullptr});
  EXPECT_EQ(opt->name(), "Adam");
  EXPECT_DOUBLE_EQ(*opt->get_config().find("beta_1"), 0.8);
  EXPECT_DOUBLE_EQ(*opt->get_config().find("beta_2"), 0.999);
}

TEST(Optimizer, FromName) {
  EXPECT_EQ(optimizer_from_name("sgd")->name(), "SGD");
  EXPECT_EQ(optimizer_from_name("Adam")->name(), "Adam");
  EXPECT_EQ(optimizer_from_name("ADAMW")->name(), "AdamW");
  EXPECT_EQ(optimizer_from_name("RMSprop")->get_config().class_name, "RMSprop");
  testutil::expect_throws_with<InvalidArgumentError>(
      [] { optimizer_from_name("adagrad"); }, {"'adagrad'", "sgd", "adam", "adamw", "rmsprop"});
  testutil::expect_throws_with<InvalidArgumentError>([] { optimizer_from_name(""); },
                                                     {"unknown optimizer"});
}

TEST(Optimizer, WeightDecayIsDecoupledForEveryOptimizer) {
  // With a zero gradient, SGD with weight decay only shrinks: var ← var − var·wd·lr.
  Variable w("w", Tensor::full(Shape{3}, 2.0));
  std::vector<Variable*> vars{&w};
  std::vector<Tensor> grads{Tensor::zeros(Shape{3})};
  SGD sgd(SGDOptions{.learning_rate = 0.1, .weight_decay = 0.5});
  sgd.apply_gradients(grads, vars);
  EXPECT_FLOAT_EQ(w.tensor().data<float>()[0], 2.0f - 2.0f * 0.05f);
  AdamW adamw(AdamWOptions{.learning_rate = 0.1, .weight_decay = 0.5});
  adamw.apply_gradients(grads, vars);
  EXPECT_FLOAT_EQ(w.tensor().data<float>()[0], 1.9f - 1.9f * 0.05f);
}

TEST(Optimizer, ElementRangesCoverInOrderOnCacheLineBoundaries) {
  for (const int64_t n : {0, 1, 10, 16, 100, 1000, 100352}) {
    for (const int parts : {1, 2, 3, 7}) {
      int64_t expect_begin = 0;
      for (int p = 0; p < parts; ++p) {
        const auto [begin, end] = Optimizer::element_range(n, p, parts);
        EXPECT_EQ(begin, expect_begin) << n << " " << p << "/" << parts;
        EXPECT_LE(begin, end);
        if (p + 1 < parts) {
          EXPECT_TRUE(end % 16 == 0 || end == n) << end;
        }
        expect_begin = end;
      }
      EXPECT_EQ(expect_begin, n) << n << " " << parts;
    }
  }
  // Large variables are split evenly (within a cache line).
  const auto [b, e] = Optimizer::element_range(100352, 1, 2);
  EXPECT_EQ(b, 50176);
  EXPECT_EQ(e, 100352);
}

// update_part over every part, from several threads, is bitwise apply_gradients, for every
// optimizer and variable sizes with and without a SIMD tail.
TEST(Optimizer, UpdatePartsFromThreadsEqualApplyGradientsBitwise) {
  auto make = [](int which) -> std::unique_ptr<Optimizer> {
    switch (which) {
      case 0:
        return std::make_unique<Adam>(AdamOptions{.learning_rate = 0.01, .amsgrad = true});
      case 1:
        return std::make_unique<AdamW>(AdamWOptions{.learning_rate = 0.01, .weight_decay = 0.1});
      case 2:
        return std::make_unique<SGD>(
            SGDOptions{.learning_rate = 0.1, .momentum = 0.9, .nesterov = true});
      case 3:
        return std::make_unique<RMSprop>(RMSpropOptions{
            .learning_rate = 0.01, .momentum = 0.5, .centered = true, .weight_decay = 0.01});
      case 4: {  // clipping by the global norm: computed in prepare_update, before the parts
        auto o = std::make_unique<AdamW>(
            AdamWOptions{.learning_rate = 0.01, .weight_decay = 0.1, .global_clipnorm = 1.0});
        o->exclude_from_weight_decay({"v1"});
        return o;
      }
      case 5:
        return std::make_unique<SGD>(
            SGDOptions{.learning_rate = 0.1, .momentum = 0.9, .clipnorm = 2.0});
      default:
        return std::make_unique<RMSprop>(RMSpropOptions{.learning_rate = 0.01, .clipvalue = 0.5});
    }
  };
  const std::vector<int64_t> sizes{10, 4099, 100352, 1};
  auto uniform = [](int64_t n, uint64_t seed) {
    Philox rng(seed);
    Tensor t(Shape{n});
    for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = rng.uniform(-1.0f, 1.0f);
    return t;
  };
  for (int which = 0; which < 7; ++which) {
    for (const int parts : {2, 3}) {
      std::vector<std::unique_ptr<Variable>> a_vars, b_vars;
      std::vector<Variable*> a, b;
      for (size_t i = 0; i < sizes.size(); ++i) {
        const Tensor init = uniform(sizes[i], 100 + i);
        a_vars.push_back(std::make_unique<Variable>("v" + std::to_string(i), init.clone()));
        b_vars.push_back(std::make_unique<Variable>("v" + std::to_string(i), init.clone()));
        a.push_back(a_vars.back().get());
        b.push_back(b_vars.back().get());
      }
      auto serial = make(which), split = make(which);
      for (int step = 0; step < 3; ++step) {
        std::vector<Tensor> grads;
        for (size_t i = 0; i < sizes.size(); ++i) {
          grads.push_back(uniform(sizes[i], 1000 * step + i));
        }
        serial->apply_gradients(grads, a);
        split->prepare_update(grads, b);
        std::vector<std::thread> threads;
        for (int p = 0; p < parts; ++p) {
          threads.emplace_back([&, p] { split->update_part(grads, b, p, parts); });
        }
        for (auto& t : threads) t.join();
        split->finish_update();
      }
      EXPECT_EQ(split->iterations(), 3);
      for (size_t i = 0; i < sizes.size(); ++i) {
        EXPECT_TRUE(a[i]->tensor().equals(b[i]->tensor()))
            << serial->name() << ", " << parts << " parts, variable of " << sizes[i];
      }
      const auto sa = serial->variables(), sb = split->variables();
      ASSERT_EQ(sa.size(), sb.size());
      for (size_t i = 0; i < sa.size(); ++i) {
        EXPECT_TRUE(sa[i]->tensor().equals(sb[i]->tensor())) << sa[i]->name();
      }
    }
  }
}

}  // namespace
}  // namespace dtrain::optim
