// Tests of dtrain/nn/metrics.h: accumulation across batches, reset, Keras's matching rules,
// "accuracy" resolution by loss and by shape, and errors.
#include "dtrain/nn/metrics.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/nn/losses.h"
#include "dtrain/ops/tensor_ops.h"
#include "testutil/count_new.h"
#include "testutil/expect_throws.h"

namespace dtrain::nn {
namespace {

Tensor f32(std::initializer_list<float> v, const Shape& s) { return Tensor::from_vector(v, s); }
Tensor i32(std::initializer_list<int32_t> v, const Shape& s) { return Tensor::from_vector(v, s); }

TEST(MetricsTest, MeanIsWeighted) {
  Mean m("loss");
  EXPECT_EQ(m.name(), "loss");
  EXPECT_EQ(m.result(), 0.0);  // nothing added: 0, not NaN
  m.update_state(2.0);
  m.update_state(4.0, 3.0);
  EXPECT_DOUBLE_EQ(m.result(), 14.0 / 4.0);
  m.update_state(f32({1, 2, 3}, {3}));
  EXPECT_DOUBLE_EQ(m.result(), 20.0 / 7.0);
  EXPECT_DOUBLE_EQ(m.total(), 20.0);
  EXPECT_DOUBLE_EQ(m.count(), 7.0);
  m.reset_state();
  EXPECT_EQ(m.result(), 0.0);
}

TEST(MetricsTest, SparseCategoricalAccuracyAccumulatesAndResets) {
  SparseCategoricalAccuracy acc;
  EXPECT_EQ(acc.name(), "sparse_categorical_accuracy");
  // Batch 1: argmax [1, 0, 2] against [1, 0, 0] → 2 of 3.
  acc.update_state(i32({1, 0, 0}, {3}), f32({0.1f, 0.8f, 0.1f, 0.6f, 0.3f, 0.1f, 0, 0, 1}, {3, 3}));
  EXPECT_DOUBLE_EQ(acc.result(), 2.0 / 3.0);
  // Batch 2: labels [B, 1] as uint8, argmax [2, 2] against [2, 1] → 1 of 2. Total 3 of 5.
  acc.update_state(Tensor::from_vector<uint8_t>({2, 1}, {2, 1}), f32({0, 0, 5, 1, 2, 3}, {2, 3}));
  EXPECT_DOUBLE_EQ(acc.result(), 3.0 / 5.0);
  EXPECT_DOUBLE_EQ(acc.total(), 3.0);
  EXPECT_DOUBLE_EQ(acc.count(), 5.0);
  acc.reset_state();
  EXPECT_EQ(acc.result(), 0.0);
  // Float labels; ties go to the first index (tf.argmax); a non-integral label never matches.
  acc.update_state(f32({0, 1.5f}, {2}), f32({1, 1, 0, 0, 1, 0}, {2, 3}));
  EXPECT_DOUBLE_EQ(acc.result(), 0.5);
}

TEST(MetricsTest, CategoricalAccuracy) {
  CategoricalAccuracy acc;
  acc.update_state(f32({0, 1, 0, 0, 0, 1}, {2, 3}),
                   f32({0.1f, 0.7f, 0.2f, 0.5f, 0.4f, 0.1f}, {2, 3}));
  EXPECT_DOUBLE_EQ(acc.result(), 0.5);
  acc.update_state(f32({1, 0, 0}, {1, 3}), f32({0.9f, 0.05f, 0.05f}, {1, 3}));
  EXPECT_DOUBLE_EQ(acc.result(), 2.0 / 3.0);
}

TEST(MetricsTest, BinaryAccuracyThresholdIsStrict) {
  BinaryAccuracy acc;
  EXPECT_EQ(acc.name(), "binary_accuracy");
  // y_pred > 0.5 is 1: 0.5 itself predicts 0.
  acc.update_state(f32({1, 0, 0, 1}, {4}), f32({0.9f, 0.5f, 0.7f, 0.2f}, {4, 1}));
  EXPECT_DOUBLE_EQ(acc.result(), 0.5);
  // Multi-label rows count as the fraction of matching elements: (2/3 + 1) / 2 examples more.
  BinaryAccuracy multi;
  multi.update_state(f32({1, 0, 1, 0, 0, 0}, {2, 3}),
                     f32({0.8f, 0.1f, 0.3f, 0.2f, 0.4f, 0.1f}, {2, 3}));
  EXPECT_DOUBLE_EQ(multi.result(), (2.0 / 3.0 + 1.0) / 2.0);
  EXPECT_DOUBLE_EQ(multi.count(), 2.0);
  BinaryAccuracy custom("bin", {.threshold = 0.1f});
  custom.update_state(f32({1}, {1}), f32({0.2f}, {1}));
  EXPECT_DOUBLE_EQ(custom.result(), 1.0);
}

TEST(MetricsTest, AccuracyIsExactMatch) {
  Accuracy acc;
  acc.update_state(i32({1, 2, 3, 4}, {4}), f32({1, 2, 3, 4.5f}, {4}));
  EXPECT_DOUBLE_EQ(acc.result(), 0.75);
  acc.update_state(i32({1, 2}, {2}), f32({0, 2}, {2, 1}));
  EXPECT_DOUBLE_EQ(acc.result(), 4.0 / 6.0);
}

TEST(MetricsTest, EpochResultIsExactOverManyBatches) {
  // 1000 batches of 3 with one hit each: exactly 1/3, no float32 drift.
  SparseCategoricalAccuracy acc;
  const Tensor pred = f32({1, 0, 1, 0, 1, 0}, {3, 2});
  const Tensor labels = i32({0, 1, 1}, {3});
  for (int i = 0; i < 1000; ++i) acc.update_state(labels, pred);
  EXPECT_DOUBLE_EQ(acc.count(), 3000.0);
  EXPECT_DOUBLE_EQ(acc.total(), 1000.0);
}

TEST(MetricsTest, AccuracyResolvesByLoss) {
  const Tensor probs = f32({0.2f, 0.8f, 0.7f, 0.3f}, {2, 2});
  const SparseCategoricalCrossentropy scce;
  const CategoricalCrossentropy cce;
  const BinaryCrossentropy bce;
  auto sparse = metric_from_name("accuracy", &scce);
  EXPECT_EQ(sparse->name(), "accuracy");
  EXPECT_NE(dynamic_cast<SparseCategoricalAccuracy*>(sparse.get()), nullptr);
  sparse->update_state(i32({1, 1}, {2}), probs);
  EXPECT_DOUBLE_EQ(sparse->result(), 0.5);

  auto categorical = metric_from_name("accuracy", &cce);
  EXPECT_EQ(categorical->name(), "accuracy");
  EXPECT_NE(dynamic_cast<CategoricalAccuracy*>(categorical.get()), nullptr);

  auto binary = metric_from_name("acc", &bce);
  EXPECT_EQ(binary->name(), "acc");  // Keras reports the string it was given
  EXPECT_NE(dynamic_cast<BinaryAccuracy*>(binary.get()), nullptr);
  binary->update_state(f32({0, 1, 1, 1}, {2, 2}), probs);
  EXPECT_DOUBLE_EQ(binary->result(), (1.0 + 0.5) / 2.0);

  EXPECT_EQ(metric_from_name("sparse_categorical_accuracy", &cce)->name(),
            "sparse_categorical_accuracy");
  EXPECT_EQ(metric_from_name("categorical_accuracy", nullptr)->name(), "categorical_accuracy");
  EXPECT_EQ(metric_from_name("binary_accuracy", nullptr)->name(), "binary_accuracy");
}

TEST(MetricsTest, AccuracyWithoutCrossentropyResolvesByShapeLikeKeras) {
  const MeanSquaredError mse;
  // Sparse labels ([B] against [B, C]) → sparse categorical accuracy.
  auto a = metric_from_name("accuracy", &mse);
  a->update_state(i32({1, 0}, {2}), f32({0.2f, 0.8f, 0.3f, 0.7f}, {2, 2}));
  EXPECT_DOUBLE_EQ(a->result(), 0.5);
  EXPECT_EQ(a->name(), "accuracy");
  // One output column → binary accuracy.
  auto b = metric_from_name("accuracy", nullptr);
  b->update_state(f32({1, 0, 1}, {3, 1}), f32({0.9f, 0.6f, 0.4f}, {3, 1}));
  EXPECT_DOUBLE_EQ(b->result(), 1.0 / 3.0);
  // One-hot labels → categorical accuracy.
  auto c = metric_from_name("accuracy", nullptr);
  c->update_state(f32({0, 1, 1, 0}, {2, 2}), f32({0.2f, 0.8f, 0.3f, 0.7f}, {2, 2}));
  EXPECT_DOUBLE_EQ(c->result(), 0.5);
  c->reset_state();
  EXPECT_EQ(c->result(), 0.0);
}

TEST(MetricsTest, Errors) {
  testutil::expect_throws_with<InvalidArgumentError>(
      [] { metric_from_name("f1_score", nullptr); },
      {"\"f1_score\"", "\"accuracy\"", "\"sparse_categorical_accuracy\""});
  SparseCategoricalAccuracy sparse;
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        sparse.update_state(i32({0, 1, 2}, {3}), f32({0, 1, 1, 0}, {2, 2}));
      },
      {"sparse_categorical_accuracy", "[3]", "[2, 2]"});
  CategoricalAccuracy categorical;
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        categorical.update_state(f32({0, 1}, {1, 2}), f32({0, 1, 0}, {1, 3}));
      },
      {"categorical_accuracy", "[1, 2]", "[1, 3]"});
  BinaryAccuracy binary;
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        binary.update_state(f32({0, 1, 1}, {3}), f32({0, 1}, {2}));
      },
      {"binary_accuracy", "[3]", "[2]"});
  EXPECT_EQ(sparse.result(), 0.0);  // a rejected batch adds nothing
}

TEST(MetricsTest, NeverRecordOnTape) {
  Tensor pred = f32({0.2f, 0.8f}, {1, 2});
  GradientTape tape;
  tape.watch(pred);
  SparseCategoricalAccuracy acc;
  acc.update_state(i32({1}, {1}), softmax(pred));
  EXPECT_DOUBLE_EQ(acc.result(), 1.0);
  // The tape still differentiates what it recorded.
  EXPECT_TRUE(tape.gradient(reduce_sum(softmax(pred)), pred).defined());
}

// Updates in the training loop allocate nothing, for every metric and label dtype.
TEST(MetricsTest, UpdatesDoNotAllocate) {
  const Tensor probs = f32({0.1f, 0.7f, 0.2f, 0.6f, 0.3f, 0.1f}, Shape{2, 3});
  const Tensor one_hot = f32({0, 1, 0, 1, 0, 0}, Shape{2, 3});
  const Tensor sparse = i32({1, 0}, Shape{2});
  const Tensor binary_pred = f32({0.8f, 0.2f}, Shape{2, 1});
  const Tensor binary_true = i32({1, 0}, Shape{2});
  CategoricalAccuracy categorical;
  SparseCategoricalAccuracy sparse_accuracy;
  BinaryAccuracy binary;
  Accuracy exact;
  Mean mean("loss");
  const Tensor probs64 = ops::cast(probs, DType::kFloat64);  // a non-float32 prediction
  auto update_all = [&] {
    categorical.update_state(one_hot, probs);
    sparse_accuracy.update_state(sparse, probs64);
    binary.update_state(binary_true, binary_pred);
    exact.update_state(sparse, sparse);
    mean.update_state(binary_pred);
  };
  update_all();  // first use
  const long before = testutil::new_calls();
  for (int i = 0; i < 10; ++i) update_all();
  EXPECT_EQ(testutil::new_calls() - before, 0);
  EXPECT_DOUBLE_EQ(categorical.result(), 1.0);
  EXPECT_DOUBLE_EQ(sparse_accuracy.result(), 1.0);
  EXPECT_DOUBLE_EQ(binary.result(), 1.0);
  EXPECT_DOUBLE_EQ(exact.result(), 1.0);
}

}  // namespace
}  // namespace dtrain::nn
