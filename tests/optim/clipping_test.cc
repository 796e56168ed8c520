// Gradient clipping (clipnorm, clipvalue, global_clipnorm) and exclude_from_weight_decay on the
// optimizer base; the step-by-step values are in optimizers_golden_test.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "dtrain/optim/adam.h"
#include "dtrain/optim/optimizer.h"
#include "dtrain/optim/sgd.h"
#include "testutil/expect_throws.h"

namespace dtrain::optim {
namespace {

struct Vars {
  Variable kernel{"dense/kernel", Tensor::zeros(Shape{2, 2})};
  Variable bias{"dense/bias", Tensor::zeros(Shape{2})};
  std::vector<Variable*> vars{&kernel, &bias};
};

// Plain SGD with lr 1: the update is minus the clipped gradient.
std::vector<float> step_of(const SGDOptions& options, const std::vector<Tensor>& grads) {
  Vars v;
  SGD sgd(options);
  sgd.apply_gradients(grads, v.vars);
  std::vector<float> out = v.kernel.tensor().to_vector<float>();
  for (float b : v.bias.tensor().to_vector<float>()) out.push_back(b);
  for (float& x : out) x = -x;
  return out;
}

TEST(Clipping, NormValueAndGlobalNormFollowKeras) {
  // ‖kernel‖ = 5 (3, 4, 0, 0), ‖bias‖ = 12 (0, 12): global norm 13.
  const std::vector<Tensor> grads{Tensor::from_vector<float>({3, 4, 0, 0}, Shape{2, 2}),
                                  Tensor::from_vector<float>({0, 12}, Shape{2})};
  EXPECT_EQ(step_of({.learning_rate = 1.0}, grads), (std::vector<float>{3, 4, 0, 0, 0, 12}));
  // clipnorm 6: the kernel (norm 5) is untouched, the bias scaled by 6/12.
  EXPECT_EQ(step_of({.learning_rate = 1.0, .clipnorm = 6.0}, grads),
            (std::vector<float>{3, 4, 0, 0, 0, 6}));
  // global_clipnorm 6.5: everything scaled by 6.5/13.
  const std::vector<float> g = step_of({.learning_rate = 1.0, .global_clipnorm = 6.5}, grads);
  const std::vector<float> want{1.5f, 2.0f, 0, 0, 0, 6.0f};
  for (size_t i = 0; i < g.size(); ++i) EXPECT_FLOAT_EQ(g[i], want[i]) << i;
  // global_clipnorm above the norm changes nothing.
  EXPECT_EQ(step_of({.learning_rate = 1.0, .global_clipnorm = 20.0}, grads),
            (std::vector<float>{3, 4, 0, 0, 0, 12}));
  EXPECT_EQ(step_of({.learning_rate = 1.0, .clipvalue = 3.5}, grads),
            (std::vector<float>{3, 3.5f, 0, 0, 0, 3.5f}));
  // The caller's gradients are not modified.
  EXPECT_EQ(grads[1].to_vector<float>(), (std::vector<float>{0, 12}));
}

TEST(Clipping, InfiniteGlobalNormGivesNaN) {
  const std::vector<Tensor> grads{Tensor::from_vector<float>({INFINITY, 0, 0, 0}, Shape{2, 2}),
                                  Tensor::from_vector<float>({1, 1}, Shape{2})};
  for (float x : step_of({.learning_rate = 1.0, .global_clipnorm = 1.0}, grads)) {
    EXPECT_TRUE(std::isnan(x));
  }
}

TEST(Clipping, OnlyOneArgumentAndValidValues) {
  const std::string msg = testutil::expect_throws<InvalidArgumentError>(
      [] { SGD({.clipnorm = 1.0, .global_clipnorm = 1.0}); });
  EXPECT_NE(msg.find("only one of `clipnorm`, `clipvalue` and `global_clipnorm`"),
            std::string::npos)
      << msg;
  EXPECT_THROW(Adam({.clipvalue = -1.0}), InvalidArgumentError);
  EXPECT_THROW(AdamW({.clipnorm = NAN}), InvalidArgumentError);
}

TEST(Clipping, ConfigRoundTrip) {
  AdamW adamw({.learning_rate = 0.01, .global_clipnorm = 1.0});
  adamw.exclude_from_weight_decay({"bias", "layer_normalization"});
  const OptimizerConfig c = adamw.get_config();
  ASSERT_NE(c.find("global_clipnorm"), nullptr);
  EXPECT_EQ(*c.find("global_clipnorm"), 1.0);
  EXPECT_EQ(c.find("clipnorm"), nullptr);
  EXPECT_EQ(c.exclude_from_weight_decay, (std::vector<std::string>{"bias", "layer_normalization"}));
  const std::unique_ptr<Optimizer> back = optimizer_from_config(c);
  EXPECT_EQ(back->clipping().global_clipnorm, 1.0);
  EXPECT_EQ(back->excluded_from_weight_decay(), c.exclude_from_weight_decay);
  for (const char* cls : {"SGD", "Adam", "RMSprop"}) {
    const auto o = optimizer_from_config({cls, "", {{"clipvalue", 0.25}}});
    EXPECT_EQ(o->clipping().clipvalue, 0.25) << cls;
    EXPECT_EQ(*o->get_config().find("clipvalue"), 0.25) << cls;
  }
}

TEST(ExcludeFromWeightDecay, SubstringOfTheNameAndOnlyBeforeBuild) {
  Vars v;
  v.kernel.tensor().fill(1.0);
  v.bias.tensor().fill(1.0);
  AdamW adamw({.learning_rate = 0.1, .weight_decay = 0.5});
  adamw.exclude_from_weight_decay({"bias"});
  EXPECT_TRUE(adamw.uses_weight_decay(v.kernel));
  EXPECT_FALSE(adamw.uses_weight_decay(v.bias));
  // Zero gradients: Adam's step is 0, so only the decay moves the variables.
  adamw.apply_gradients(std::vector<Tensor>{Tensor::zeros(Shape{2, 2}), Tensor::zeros(Shape{2})},
                        v.vars);
  EXPECT_FLOAT_EQ(v.kernel.tensor().data<float>()[0], 1.0f - 0.5f * 0.1f);
  EXPECT_EQ(v.bias.tensor().data<float>()[0], 1.0f);
  EXPECT_THROW(adamw.exclude_from_weight_decay({"kernel"}), FailedPreconditionError);
  // Every optimizer's decoupled decay honours it (SGD applies decay outside its kernel).
  Vars w;
  w.kernel.tensor().fill(1.0);
  w.bias.tensor().fill(1.0);
  SGD sgd({.learning_rate = 0.1, .weight_decay = 0.5});
  sgd.exclude_from_weight_decay({"kernel"});
  sgd.apply_gradients(std::vector<Tensor>{Tensor::zeros(Shape{2, 2}), Tensor::zeros(Shape{2})},
                      w.vars);
  EXPECT_EQ(w.kernel.tensor().data<float>()[0], 1.0f);
  EXPECT_FLOAT_EQ(w.bias.tensor().data<float>()[0], 0.95f);
}

}  // namespace
}  // namespace dtrain::optim
