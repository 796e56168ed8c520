// Finite-difference checks of the activations (dtrain/autograd/activations.h), batch norm in
// training and inference mode, and layer norm (dtrain/autograd/normalization.h), including the
// fused Dense op with activations whose derivative needs the pre-activation.
#include "dtrain/autograd/normalization.h"

#include <gtest/gtest.h>

#include "dtrain/autograd/activations.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"

namespace dtrain {
namespace {

using ops::Activation;
using testutil::gradcheck;
using testutil::random_tensor;
using Inputs = std::vector<Tensor>;
constexpr double kTol = 2e-2;

TEST(ActivationGradCheck, EveryActivation) {
  // Away from the kinks (relu at 0, relu6 at 0 and 6, hard_sigmoid at ±3): random values in
  // [-4, 4] are at least eps from them with this seed, so central differences are exact there.
  const Tensor x = random_tensor(Shape{3, 7}, 21, -4.0f, 4.0f);
  for (Activation act :
       {Activation::kRelu, Activation::kSigmoid, Activation::kTanh, Activation::kSoftmax,
        Activation::kGelu, Activation::kGeluTanh, Activation::kSwish, Activation::kLeakyRelu,
        Activation::kElu, Activation::kSelu, Activation::kSoftplus, Activation::kSoftsign,
        Activation::kHardSigmoid, Activation::kExponential, Activation::kLogSoftmax,
        Activation::kRelu6}) {
    SCOPED_TRACE(ops::activation_name(act));
    EXPECT_LT(gradcheck([act](const Inputs& v) { return activation(v[0], act); }, {x}, 1e-3f),
              kTol);
  }
  EXPECT_LT(gradcheck([](const Inputs& v) { return leaky_relu(v[0], 0.05f); }, {x}, 1e-3f), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return elu(v[0], 0.7f); }, {x}, 1e-3f), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return relu(v[0], 0.1f, 2.5f, 0.5f); }, {x}, 1e-3f),
            kTol);
}

TEST(ActivationGradCheck, FusedDenseKeepsThePreActivation) {
  const Tensor x = random_tensor(Shape{4, 3}, 31);
  const Tensor w = random_tensor(Shape{3, 5}, 32);
  const Tensor b = random_tensor(Shape{5}, 33);
  for (Activation act : {Activation::kGelu, Activation::kGeluTanh, Activation::kSwish,
                         Activation::kElu, Activation::kSelu, Activation::kSoftplus}) {
    SCOPED_TRACE(ops::activation_name(act));
    EXPECT_LT(gradcheck([act](const Inputs& v) { return dense(v[0], v[1], v[2], act); }, {x, w, b},
                        1e-3f),
              kTol);
  }
}

TEST(ActivationNames, RoundTripAndErrors) {
  for (const char* name : {"gelu", "swish", "leaky_relu", "elu", "selu", "softplus", "softsign",
                           "hard_sigmoid", "exponential", "log_softmax", "relu6", "linear"}) {
    EXPECT_STREQ(ops::activation_name(ops::activation_from_name(name)), name);
  }
  EXPECT_EQ(ops::activation_from_name("silu"), Activation::kSwish);
  testutil::expect_throws_with<InvalidArgumentError>([] { ops::activation_from_name("mish2"); },
                                                     {"unknown activation 'mish2'"});
}

TEST(NormalizationGradCheck, BatchNormTrainingChannelsLastAndFirst) {
  const Tensor g = random_tensor(Shape{3}, 41, 0.5f, 1.5f);
  const Tensor b = random_tensor(Shape{3}, 42);
  EXPECT_LT(
      gradcheck([](const Inputs& v) { return batch_norm_training(v[0], v[1], v[2], -1, 1e-3f); },
                {random_tensor(Shape{4, 2, 3}, 43, -2.0f, 2.0f), g, b}, 1e-3f),
      kTol);
  EXPECT_LT(
      gradcheck([](const Inputs& v) { return batch_norm_training(v[0], v[1], v[2], 1, 1e-3f); },
                {random_tensor(Shape{3, 3, 2, 2}, 44, -2.0f, 2.0f), g, b}, 1e-3f),
      kTol);
  // Without gamma and beta (scale=False, center=False).
  EXPECT_LT(
      gradcheck(
          [](const Inputs& v) { return batch_norm_training(v[0], Tensor(), Tensor(), -1, 1e-3f); },
          {random_tensor(Shape{5, 3}, 45, -2.0f, 2.0f)}, 1e-3f),
      kTol);
}

TEST(NormalizationGradCheck, BatchNormInference) {
  const Tensor mean = random_tensor(Shape{3}, 51);
  const Tensor var = random_tensor(Shape{3}, 52, 0.5f, 1.5f);
  EXPECT_LT(gradcheck(
                [&](const Inputs& v) {
                  return batch_norm_inference(v[0], v[1], v[2], mean, var, 1, 1e-3f);
                },
                {random_tensor(Shape{2, 3, 4}, 53), random_tensor(Shape{3}, 54),
                 random_tensor(Shape{3}, 55)},
                1e-3f),
            kTol);
}

TEST(NormalizationGradCheck, LayerNorm) {
  EXPECT_LT(gradcheck([](const Inputs& v) { return layer_norm(v[0], v[1], v[2], -1, 1e-3f); },
                      {random_tensor(Shape{2, 3, 5}, 61, -2.0f, 2.0f),
                       random_tensor(Shape{5}, 62, 0.5f, 1.5f), random_tensor(Shape{5}, 63)},
                      1e-3f),
            kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return layer_norm(v[0], v[1], v[2], 1, 1e-3f); },
                      {random_tensor(Shape{2, 3, 4}, 64, -2.0f, 2.0f),
                       random_tensor(Shape{3, 4}, 65, 0.5f, 1.5f), random_tensor(Shape{3, 4}, 66)},
                      1e-3f),
            kTol);
  EXPECT_LT(
      gradcheck([](const Inputs& v) { return layer_norm(v[0], Tensor(), Tensor(), -1, 1e-3f); },
                {random_tensor(Shape{4, 6}, 67, -2.0f, 2.0f)}, 1e-3f),
      kTol);
}

TEST(NormalizationErrors, NameTheOpAndShapes) {
  testutil::expect_throws_with<InvalidArgumentError>(
      [] {
        batch_norm_training(Tensor(Shape{2, 3}), Tensor(Shape{4}), Tensor(), -1, 1e-3f);
      },
      {"batch_norm_training: gamma/beta [4] do not match 3 channels"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [] {
        batch_norm_training(Tensor(Shape{2, 3}), Tensor(), Tensor(), 2, 1e-3f);
      },
      {"batch_norm_training: axis 2 out of range"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [] {
        layer_norm(Tensor(Shape{2, 3}), Tensor(Shape{2}), Tensor(), -1, 1e-3f);
      },
      {"layer_norm: gamma/beta [2] do not match"});
}

}  // namespace
}  // namespace dtrain
