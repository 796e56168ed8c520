// Finite-difference checks of every differentiable op in dtrain/autograd/functions.h.
#include <gtest/gtest.h>

#include "testutil/gradcheck.h"

namespace dtrain {
namespace {

using testutil::gradcheck;
using testutil::random_tensor;
using Inputs = std::vector<Tensor>;
constexpr double kTol = 2e-2;

TEST(GradCheck, BroadcastingBinaryOps) {
  const Tensor a = random_tensor(Shape{3, 4}, 1);
  const Tensor b = random_tensor(Shape{4}, 2, 0.5f, 1.5f);
  const Tensor col = random_tensor(Shape{3, 1}, 3, 0.5f, 1.5f);
  EXPECT_LT(gradcheck([](const Inputs& x) { return add(x[0], x[1]); }, {a, b}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& x) { return subtract(x[0], x[1]); }, {a, col}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& x) { return multiply(x[0], x[1]); }, {a, b}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& x) { return divide(x[0], x[1]); }, {a, col}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& x) { return multiply(x[0], x[1]); },
                      {random_tensor(Shape{2, 1, 3}, 4), random_tensor(Shape{4, 1}, 5)}),
            kTol);
  // max/min are not differentiable at ties; random inputs have none.
  EXPECT_LT(gradcheck([](const Inputs& x) { return maximum(x[0], x[1]); },
                      {a, random_tensor(Shape{3, 4}, 6)}),
            kTol);
  EXPECT_LT(gradcheck([](const Inputs& x) { return minimum(x[0], x[1]); },
                      {a, random_tensor(Shape{3, 4}, 7)}),
            kTol);
  EXPECT_LT(gradcheck([](const Inputs& x) { return scale(x[0], -2.5f, 1.0f); }, {a}), kTol);
}

TEST(GradCheck, UnaryOps) {
  const Tensor x = random_tensor(Shape{2, 5}, 11);
  const Tensor pos = random_tensor(Shape{2, 5}, 12, 0.5f, 2.0f);
  EXPECT_LT(gradcheck([](const Inputs& v) { return negative(v[0]); }, {x}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return exp(v[0]); }, {x}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return log(v[0]); }, {pos}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return sqrt(v[0]); }, {pos}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return square(v[0]); }, {x}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return abs(v[0]); }, {pos}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return clip_by_value(v[0], -0.5f, 0.5f); }, {x}), kTol);
}

TEST(GradCheck, Activations) {
  // Keep relu inputs away from 0, where it is not differentiable.
  Tensor x = random_tensor(Shape{4, 6}, 21);
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    float& v = x.data<float>()[i];
    if (std::fabs(v) < 0.05f) v = 0.3f;
  }
  EXPECT_LT(gradcheck([](const Inputs& v) { return relu(v[0]); }, {x}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return sigmoid(v[0]); }, {x}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return tanh(v[0]); }, {x}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return softmax(v[0]); }, {x}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return log_softmax(v[0]); }, {x}), kTol);
}

TEST(GradCheck, MatmulAllTranspositions) {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const Tensor a = random_tensor(ta ? Shape{4, 3} : Shape{3, 4}, 31);
      const Tensor b = random_tensor(tb ? Shape{5, 4} : Shape{4, 5}, 32);
      EXPECT_LT(gradcheck([&](const Inputs& v) { return matmul(v[0], v[1], ta, tb); }, {a, b}),
                kTol)
          << "transpose_a=" << ta << " transpose_b=" << tb;
    }
  }
}

TEST(GradCheck, FusedDenseEveryActivation) {
  const Tensor x = random_tensor(Shape{5, 3}, 41);
  const Tensor w = random_tensor(Shape{3, 4}, 42);
  const Tensor b = random_tensor(Shape{4}, 43);
  for (Activation act : {Activation::kLinear, Activation::kRelu, Activation::kSigmoid,
                         Activation::kTanh, Activation::kSoftmax}) {
    EXPECT_LT(gradcheck([&](const Inputs& v) { return dense(v[0], v[1], v[2], act); }, {x, w, b}),
              kTol)
        << ops::activation_name(act);
  }
  EXPECT_LT(
      gradcheck([&](const Inputs& v) { return dense(v[0], v[1], Tensor(), Activation::kTanh); },
                {x, w}),
      kTol);
}

TEST(GradCheck, Reductions) {
  const Tensor x = random_tensor(Shape{3, 4, 2}, 51);
  EXPECT_LT(gradcheck([](const Inputs& v) { return reduce_sum(v[0]); }, {x}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return reduce_mean(v[0]); }, {x}), kTol);
  for (int axis : {0, 1, -1}) {
    EXPECT_LT(gradcheck([&](const Inputs& v) { return reduce_sum(v[0], axis); }, {x}), kTol);
    EXPECT_LT(gradcheck([&](const Inputs& v) { return reduce_mean(v[0], axis, true); }, {x}), kTol);
  }
  EXPECT_LT(gradcheck([](const Inputs& v) { return reshape(v[0], Shape{4, 6}); }, {x}), kTol);
}

TEST(GradCheck, CrossEntropies) {
  const Tensor logits = random_tensor(Shape{4, 5}, 61, -2.0f, 2.0f);
  const Tensor sparse = Tensor::from_vector<int64_t>({0, 3, 4, 1}, Shape{4});
  Tensor onehot = random_tensor(Shape{4, 5}, 62, 0.0f, 1.0f);
  EXPECT_LT(
      gradcheck(
          [&](const Inputs& v) { return sparse_softmax_cross_entropy_with_logits(sparse, v[0]); },
          {logits}),
      kTol);
  EXPECT_LT(
      gradcheck([&](const Inputs& v) { return softmax_cross_entropy_with_logits(onehot, v[0]); },
                {logits}),
      kTol);
  EXPECT_LT(
      gradcheck([&](const Inputs& v) { return sigmoid_cross_entropy_with_logits(onehot, v[0]); },
                {logits}),
      kTol);
  EXPECT_LT(gradcheck([&](const Inputs& v) { return pick(v[0], sparse); }, {logits}), kTol);
}

}  // namespace
}  // namespace dtrain
