// Finite-difference gradient checks and values of concat, split and slice_axis.
#include <gtest/gtest.h>

#include "dtrain/autograd/array_ops.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"

namespace dtrain {
namespace {

using testutil::gradcheck;
using testutil::random_tensor;

TEST(ArrayOpsTest, ConcatPlacesInputsAlongTheAxis) {
  const Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, Shape{2, 2});
  const Tensor b = Tensor::from_vector<float>({5, 6}, Shape{2, 1});
  const Tensor c = concat({a, b}, -1);
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  const std::vector<float> want = {1, 2, 5, 3, 4, 6};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(c.data<float>()[i], want[i]);
  const Tensor r = concat({a, a}, 0);
  EXPECT_EQ(r.shape(), (Shape{4, 2}));
  EXPECT_EQ(r.data<float>()[5], 2.0f);
}

TEST(ArrayOpsTest, SplitUndoesConcat) {
  const Tensor x = random_tensor(Shape{3, 5, 2}, 4);
  const std::vector<int64_t> sizes = {1, 3, 1};
  const std::vector<Tensor> parts = split(x, sizes, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1].shape(), (Shape{3, 3, 2}));
  const Tensor back = concat(parts, 1);
  for (int64_t i = 0; i < x.num_elements(); ++i)
    EXPECT_EQ(back.data<float>()[i], x.data<float>()[i]);
}

TEST(ArrayOpsTest, ConcatGradientOnEveryAxis) {
  for (int axis : {0, 1, 2, -1}) {
    const double err = gradcheck(
        [axis](const std::vector<Tensor>& xs) {
          return concat({xs[0], xs[1]}, axis);
        },
        {random_tensor(Shape{2, 3, 4}, 1), random_tensor(Shape{2, 3, 4}, 2)});
    EXPECT_LT(err, 1e-2) << "axis " << axis;
  }
  // Three inputs of different sizes along the axis, and five (kept in the node's attributes).
  EXPECT_LT(gradcheck([](const std::vector<Tensor>& xs) { return concat(xs, 1); },
                      {random_tensor(Shape{2, 1, 3}, 3), random_tensor(Shape{2, 4, 3}, 4),
                       random_tensor(Shape{2, 2, 3}, 5)}),
            1e-2);
  std::vector<Tensor> five;
  for (int k = 0; k < 5; ++k) five.push_back(random_tensor(Shape{3, k + 1}, 10 + k));
  EXPECT_LT(gradcheck([](const std::vector<Tensor>& xs) { return concat(xs, -1); }, five), 1e-2);
}

TEST(ArrayOpsTest, ConcatOfATensorWithItselfAccumulates) {
  EXPECT_LT(gradcheck(
                [](const std::vector<Tensor>& xs) {
                  return concat({xs[0], xs[0]}, 1);
                },
                {random_tensor(Shape{2, 3}, 6)}),
            1e-2);
}

TEST(ArrayOpsTest, SplitAndSliceGradients) {
  const std::vector<int64_t> sizes = {2, 1, 3};
  for (int piece = 0; piece < 3; ++piece) {
    EXPECT_LT(
        gradcheck([&](const std::vector<Tensor>& xs) { return split(xs[0], sizes, -1)[piece]; },
                  {random_tensor(Shape{2, 2, 6}, 20 + piece)}),
        1e-2)
        << "piece " << piece;
  }
  EXPECT_LT(gradcheck([](const std::vector<Tensor>& xs) { return slice_axis(xs[0], 0, 1, 2); },
                      {random_tensor(Shape{4, 3}, 30)}),
            1e-2);
}

TEST(ArrayOpsTest, BadAxesAndShapesAreRejected) {
  const Tensor a = Tensor::zeros(Shape{2, 3}), b = Tensor::zeros(Shape{3, 3});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        concat({a, b}, 1);
      },
      {"concat", "[2, 3]", "[3, 3]"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        concat({a, a}, 2);
      },
      {"concat", "axis 2", "rank 2"});
  const std::vector<int64_t> sizes = {1, 1};
  testutil::expect_throws_with<InvalidArgumentError>([&] { split(a, sizes, 1); },
                                                     {"split", "sum to 2"});
}

}  // namespace
}  // namespace dtrain
