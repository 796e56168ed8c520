// Finite-difference checks through the Layer API: the gradients GradientTape returns for a
// layer's variables (and its input) match central differences of the loss.
#include <gtest/gtest.h>

#include <cmath>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/losses.h"
#include "dtrain/nn/model.h"
#include "testutil/gradcheck.h"

namespace dtrain::nn {
namespace {

using testutil::random_tensor;

// Largest |analytic − numeric| / max(1, |numeric|) over every element of every trainable
// variable of `model`, for loss(model(x)).
double variable_gradcheck(Model& model, const Tensor& x, const Tensor& y, const Loss& loss_fn,
                          float eps = 1e-2f) {
  std::vector<Variable*> vars = model.trainable_variables();
  std::vector<Tensor> grads;
  {
    GradientTape tape;
    const Tensor loss = loss_fn(y, model(x, /*training=*/false));
    grads = tape.gradient(loss, vars);
  }
  auto loss_value = [&] {
    NoGradGuard no_grad;
    return loss_fn(y, model(x, false)).item();
  };
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
      worst = std::max(worst, err);
    }
  }
  return worst;
}

TEST(LayerGradCheck, DenseStackWithEveryActivation) {
  for (const char* act : {"linear", "sigmoid", "tanh", "softmax"}) {
    Sequential model(
        {Dense(5, {.activation = act, .seed = 1, .input_shape = Shape{4}}), Dense(3, {.seed = 2})});
    const Tensor x = random_tensor(Shape{6, 4}, 3);
    const Tensor y = Tensor::from_vector<int64_t>({0, 1, 2, 2, 1, 0}, Shape{6});
    EXPECT_LT(variable_gradcheck(model, x, y, SparseCategoricalCrossentropy({.from_logits = true})),
              2e-2)
        << act;
  }
}

TEST(LayerGradCheck, ReluAwayFromTheKink) {
  Sequential model({Dense(6, {.activation = "relu", .seed = 4, .input_shape = Shape{3}}),
                    Dense(2, {.seed = 5})});
  const Tensor x = random_tensor(Shape{5, 3}, 6);
  const Tensor y = random_tensor(Shape{5, 2}, 7);
  // A small step so that no pre-activation crosses 0 between the two evaluations.
  EXPECT_LT(variable_gradcheck(model, x, y, MeanSquaredError(), 1e-3f), 2e-2);
}

TEST(LayerGradCheck, FlattenAndRank3Dense) {
  Sequential flat({Flatten({.input_shape = Shape{2, 3}}), Dense(2, {.seed = 8})});
  const Tensor x = random_tensor(Shape{4, 2, 3}, 9);
  const Tensor y = random_tensor(Shape{4, 2}, 10);
  EXPECT_LT(variable_gradcheck(flat, x, y, MeanSquaredError()), 2e-2);
  // Dense on rank-3 inputs acts on the last axis.
  Sequential seq({Dense(2, {.activation = "tanh", .seed = 11, .input_shape = Shape{2, 3}})});
  const Tensor y3 = random_tensor(Shape{4, 2, 2}, 12);
  EXPECT_LT(variable_gradcheck(seq, x, y3, MeanSquaredError()), 2e-2);
}

TEST(LayerGradCheck, InputGradientThroughTheModel) {
  Sequential model({Dense(4, {.activation = "tanh", .seed = 13, .input_shape = Shape{3}}),
                    Dropout(0.5f, {.seed = 1}), Dense(1, {.seed = 14})});
  // Dropout is the identity at inference, so the model is a smooth function of its input.
  EXPECT_LT(testutil::gradcheck([&](const std::vector<Tensor>& v) { return model(v[0], false); },
                                {random_tensor(Shape{3, 3}, 15)}),
            2e-2);
}

TEST(LayerGradCheck, DropoutInTrainingScalesTheGradientByItsMask) {
  Dropout drop(0.5f, {.seed = 3});
  Tensor x = random_tensor(Shape{4, 8}, 16);
  GradientTape tape;
  tape.watch(x);
  const Tensor y = drop(x, /*training=*/true);
  const Tensor g = tape.gradient(reduce_sum(y), x);
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    const float kept = y.data<float>()[i] != 0.0f ? 2.0f : 0.0f;
    EXPECT_EQ(g.data<float>()[i], kept) << i;
  }
}

}  // namespace
}  // namespace dtrain::nn
