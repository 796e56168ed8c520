#include "dtrain/ops/tensor_ops.h"

#include <gtest/gtest.h>

#include <cmath>

namespace dtrain::ops {
namespace {

TEST(Ops, MatmulMatchesHandComputedProduct) {
  const Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  const Tensor b = Tensor::from_vector<float>({7, 8, 9, 10, 11, 12}, Shape{3, 2});
  EXPECT_EQ(matmul(a, b).to_vector<float>(), (std::vector<float>{58, 64, 139, 154}));
  EXPECT_EQ(matmul(a, a, false, true).to_vector<float>(), (std::vector<float>{14, 32, 32, 77}));
  EXPECT_THROW(matmul(a, a), InvalidArgumentError);
}

TEST(Ops, BroadcastingFollowsNumpy) {
  EXPECT_EQ(broadcast_shapes(Shape{2, 1, 3}, Shape{4, 1}), (Shape{2, 4, 3}));
  EXPECT_THROW(broadcast_shapes(Shape{2, 3}, Shape{4}), InvalidArgumentError);
  const Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  const Tensor col = Tensor::from_vector<float>({10, 20}, Shape{2, 1});
  EXPECT_EQ(binary(BinaryOp::kAdd, a, col).to_vector<float>(),
            (std::vector<float>{11, 12, 13, 24, 25, 26}));
  EXPECT_EQ(reduce_to_shape(binary(BinaryOp::kAdd, a, col), Shape{2, 1}).to_vector<float>(),
            (std::vector<float>{36, 75}));
}

TEST(Ops, SoftmaxIsStableForLargeLogits) {
  const Tensor x = Tensor::from_vector<float>({1000, 1001, 1002}, Shape{1, 3});
  const auto p = softmax(x).to_vector<float>();
  EXPECT_NEAR(p[0] + p[1] + p[2], 1.0, 1e-6);
  EXPECT_NEAR(p[2], 0.66524096, 1e-6);
  const auto l = log_softmax(x).to_vector<float>();
  EXPECT_NEAR(l[2], std::log(0.66524096), 1e-4);  // floats near 1000 are 6e-5 apart
}

TEST(Ops, SparseCrossEntropyRejectsOutOfRangeLabels) {
  const Tensor logits = Tensor::zeros(Shape{2, 3});
  const Tensor labels = Tensor::from_vector<int32_t>({0, 3}, Shape{2});
  try {
    sparse_softmax_cross_entropy(logits, labels, nullptr);
    FAIL() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("label 3 of example 1"), std::string::npos) << e.what();
  }
}

TEST(Ops, ReductionsAndArgmax) {
  const Tensor a = Tensor::from_vector<float>({1, 5, 3, 4, 2, 6}, Shape{2, 3});
  EXPECT_EQ(reduce_sum(a, 0).to_vector<float>(), (std::vector<float>{5, 7, 9}));
  EXPECT_EQ(reduce_mean(a, 1).to_vector<float>(), (std::vector<float>{3, 4}));
  EXPECT_EQ(reduce_sum(a).item(), 21);
  EXPECT_EQ(argmax(a).to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(cast(a, DType::kInt32).to_vector<int32_t>(), (std::vector<int32_t>{1, 5, 3, 4, 2, 6}));
}

}  // namespace
}  // namespace dtrain::ops
