// Counts global operator new calls in steady-state apply_gradients: once the slots exist, an
// update must not touch the heap. This file replaces operator new/delete for the whole test
// executable, which is why it is a test of its own.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "dtrain/optim/adam.h"
#include "dtrain/optim/optimizer.h"
#include "dtrain/optim/rmsprop.h"
#include "dtrain/optim/sgd.h"
#include "testutil/count_new.h"

namespace {
long new_count() { return dtrain::testutil::new_calls(); }
}  // namespace

namespace dtrain::optim {
namespace {

constexpr int kSteps = 20;

// The variables of a 784-128-10 MLP (101,770 parameters) and constant gradients for them.
struct Mlp {
  std::vector<std::unique_ptr<Variable>> owned;
  std::vector<Variable*> vars;
  std::vector<Tensor> grads;
  Mlp() {
    const std::vector<std::pair<std::string, Shape>> specs = {{"dense/kernel", Shape{784, 128}},
                                                              {"dense/bias", Shape{128}},
                                                              {"dense_1/kernel", Shape{128, 10}},
                                                              {"dense_1/bias", Shape{10}}};
    for (const auto& [name, shape] : specs) {
      owned.push_back(std::make_unique<Variable>(name, Tensor::full(shape, 0.01)));
      vars.push_back(owned.back().get());
      grads.push_back(Tensor::full(shape, 0.001));
    }
  }
};

struct Case {
  const char* label;
  std::unique_ptr<Optimizer> (*make)();
};

const Case kCases[] = {
    {"Adam", [] { return std::unique_ptr<Optimizer>(new Adam()); }},
    {"AdamAmsgradWithSchedule",
     [] {
       auto opt = std::unique_ptr<Optimizer>(new Adam(AdamOptions{.amsgrad = true}));
       opt->set_learning_rate_schedule(std::make_shared<ExponentialDecay>(0.01, 5, 0.9));
       return opt;
     }},
    {"AdamW", [] { return std::unique_ptr<Optimizer>(new AdamW()); }},
    {"SGD", [] { return std::unique_ptr<Optimizer>(new SGD()); }},
    {"SGDNesterovWeightDecay",
     [] {
       return std::unique_ptr<Optimizer>(
           new SGD(SGDOptions{.momentum = 0.9, .nesterov = true, .weight_decay = 0.01}));
     }},
    {"RMSpropCenteredMomentum",
     [] {
       auto opt = std::unique_ptr<Optimizer>(
           new RMSprop(RMSpropOptions{.momentum = 0.9, .centered = true}));
       opt->set_learning_rate_schedule(std::make_shared<PiecewiseConstantDecay>(
           std::vector<int64_t>{5, 10}, std::vector<double>{0.1, 0.01, 0.001}));
       return opt;
     }},
};

class AllocTest : public ::testing::TestWithParam<int> {};

TEST_P(AllocTest, SteadyStateApplyGradientsAllocatesNothing) {
  const Case& c = kCases[GetParam()];
  Mlp mlp;
  std::unique_ptr<Optimizer> opt = c.make();
  const long news_first0 = new_count();
  opt->apply_gradients(mlp.grads, mlp.vars);  // builds the slots
  const long news_first = new_count() - news_first0;

  const uint64_t buffers0 = allocator_stats().allocations;
  const long news0 = new_count();
  for (int i = 0; i < kSteps; ++i) opt->apply_gradients(mlp.grads, mlp.vars);
  const long news = new_count() - news0;
  const uint64_t buffers = allocator_stats().allocations - buffers0;
  std::printf("%-24s operator new: first step %ld, next %d steps %ld; tensor buffers %llu\n",
              c.label, news_first, kSteps, news, static_cast<unsigned long long>(buffers));
  EXPECT_EQ(news, 0) << c.label << ": operator new calls over " << kSteps << " steady steps";
  EXPECT_EQ(buffers, 0u) << c.label << ": tensor buffers allocated in steady state";
  EXPECT_EQ(opt->iterations(), kSteps + 1);
  EXPECT_GT(news_first, 0) << "the counter must see the slot creation of the first step";
}

INSTANTIATE_TEST_SUITE_P(Optimizers, AllocTest,
                         ::testing::Range(0, static_cast<int>(std::size(kCases))),
                         [](const auto& info) { return std::string(kCases[info.param].label); });

}  // namespace
}  // namespace dtrain::optim
