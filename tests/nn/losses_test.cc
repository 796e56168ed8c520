// Tests of dtrain/nn/losses.h: hand-computed values (Keras's documented examples), stability
// with huge logits, finite-difference gradients, errors, names and configs.
#include "dtrain/nn/losses.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/ops/tensor_ops.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"

namespace dtrain::nn {
namespace {

using testutil::gradcheck;
using Inputs = std::vector<Tensor>;

constexpr double kGradTol = 2e-2;

Tensor f32(std::initializer_list<float> v, const Shape& s) { return Tensor::from_vector(v, s); }

double value(const Loss& loss, const Tensor& y_true, const Tensor& y_pred) {
  return loss(y_true, y_pred).item();
}

// The loss and d loss / d y_pred.
std::pair<Tensor, Tensor> loss_and_grad(const Loss& loss, const Tensor& y_true, Tensor y_pred) {
  GradientTape tape;
  tape.watch(y_pred);
  Tensor l = loss(y_true, y_pred);
  return {l, tape.gradient(l, y_pred)};
}

// ---------------------------------------------------------------------------------------------
// Values.

TEST(LossesTest, MeanSquaredErrorByHand) {
  MeanSquaredError mse;
  // Keras docs: y_true [[0, 1], [0, 0]], y_pred [[1, 1], [1, 0]] → 0.5.
  EXPECT_FLOAT_EQ(value(mse, f32({0, 1, 0, 0}, {2, 2}), f32({1, 1, 1, 0}, {2, 2})), 0.5f);
  EXPECT_FLOAT_EQ(value(mse, f32({1, 2, 3}, {3}), f32({1, 2, 5}, {3})), 4.0f / 3.0f);
  // [B] labels against [B, 1] predictions, and integer labels.
  EXPECT_FLOAT_EQ(value(mse, f32({1, 2}, {2}), f32({2, 4}, {2, 1})), 2.5f);
  EXPECT_FLOAT_EQ(value(mse, Tensor::from_vector<int32_t>({1, 2}, {2, 1}), f32({2, 4}, {2, 1})),
                  2.5f);
  // d/dp mean((p − y)²) = 2 (p − y) / n.
  auto [l, g] = loss_and_grad(mse, f32({1, 2}, {2}), f32({2, 4}, {2, 1}));
  EXPECT_EQ(g.shape(), Shape({2, 1}));
  EXPECT_FLOAT_EQ(g.data<float>()[0], 1.0f);
  EXPECT_FLOAT_EQ(g.data<float>()[1], 2.0f);
}

TEST(LossesTest, SparseCategoricalCrossentropyByHand) {
  // Keras docs: y_true [1, 2], y_pred [[0.05, 0.95, 0], [0.1, 0.8, 0.1]] → 1.177.
  const Tensor probs = f32({0.05f, 0.95f, 0.0f, 0.1f, 0.8f, 0.1f}, {2, 3});
  const double expected = (-std::log(0.95) - std::log(0.1)) / 2;
  SparseCategoricalCrossentropy scce;
  EXPECT_NEAR(value(scce, Tensor::from_vector<int64_t>({1, 2}, {2}), probs), expected, 1e-6);
  // Every label dtype and [B, 1] labels give the same value.
  EXPECT_NEAR(value(scce, Tensor::from_vector<uint8_t>({1, 2}, {2, 1}), probs), expected, 1e-6);
  EXPECT_NEAR(value(scce, Tensor::from_vector<int32_t>({1, 2}, {2}), probs), expected, 1e-6);
  EXPECT_NEAR(value(scce, f32({1, 2}, {2, 1}), probs), expected, 1e-6);

  // From logits: [0, 0] → log 2; [1, 2, 3] label 2 → log(e + e² + e³) − 3.
  SparseCategoricalCrossentropy from_logits({.from_logits = true});
  const double row2 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  EXPECT_NEAR(value(from_logits, Tensor::from_vector<int32_t>({0}, {1}), f32({0, 0}, {1, 2})),
              std::log(2.0), 1e-6);
  EXPECT_NEAR(value(from_logits, Tensor::from_vector<int32_t>({2}, {1}), f32({1, 2, 3}, {1, 3})),
              row2, 1e-6);
  // The mean over examples.
  EXPECT_NEAR(value(from_logits, Tensor::from_vector<int32_t>({0, 2}, {2}),
                    f32({0, 0, -1e9f, 1, 2, 3}, {2, 3})),
              (std::log(2.0) + row2) / 2, 1e-6);
}

TEST(LossesTest, SparseFromProbabilitiesRenormalizesLikeKeras) {
  // Keras feeds log(clip(p)) to sparse_softmax_cross_entropy_with_logits, so rows that do not
  // sum to 1 are renormalized: −log(p[y] / Σ p).
  SparseCategoricalCrossentropy scce;
  EXPECT_NEAR(value(scce, Tensor::from_vector<int32_t>({0}, {1}), f32({0.2f, 0.2f}, {1, 2})),
              std::log(2.0), 1e-6);
}

TEST(LossesTest, CategoricalCrossentropyByHand) {
  const Tensor y = f32({0, 1, 0, 0, 0, 1}, {2, 3});
  const Tensor probs = f32({0.05f, 0.95f, 0.0f, 0.1f, 0.8f, 0.1f}, {2, 3});
  const double expected = (-std::log(0.95) - std::log(0.1)) / 2;  // Keras docs: 1.177
  EXPECT_NEAR(value(CategoricalCrossentropy(), y, probs), expected, 1e-6);
  // Rows are normalized first: [2, 2] is [0.5, 0.5].
  EXPECT_NEAR(value(CategoricalCrossentropy(), f32({1, 0}, {1, 2}), f32({2, 2}, {1, 2})),
              std::log(2.0), 1e-6);
  // From logits, with label smoothing s: y ← y(1 − s) + s / C.
  const Tensor logits = f32({1, 2, 3}, {1, 3});
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(value(CategoricalCrossentropy({.from_logits = true}), f32({0, 0, 1}, {1, 3}), logits),
              lse - 3, 1e-6);
  const double s = 0.3;
  const double smoothed = (s / 3) * (lse - 1) + (s / 3) * (lse - 2) + (1 - s + s / 3) * (lse - 3);
  EXPECT_NEAR(value(CategoricalCrossentropy({.from_logits = true, .label_smoothing = 0.3f}),
                    f32({0, 0, 1}, {1, 3}), logits),
              smoothed, 1e-5);
}

TEST(LossesTest, BinaryCrossentropyByHand) {
  // Keras docs: y_true [[0, 1], [0, 0]], y_pred [[0.6, 0.4], [0.4, 0.6]] → 0.815.
  const Tensor y = f32({0, 1, 0, 0}, {2, 2});
  const Tensor p = f32({0.6f, 0.4f, 0.4f, 0.6f}, {2, 2});
  const double expected =
      -(std::log(0.4 + 1e-7) + std::log(0.4 + 1e-7) + std::log(0.6 + 1e-7) + std::log(0.4 + 1e-7)) /
      4;
  EXPECT_NEAR(value(BinaryCrossentropy(), y, p), expected, 1e-6);
  EXPECT_NEAR(value(BinaryCrossentropy(), y, p), 0.815, 1e-3);
  // Keras docs, from logits: y_true [0, 1, 0, 0], logits [-18.6, 0.51, 2.94, -12.8] → 0.865.
  EXPECT_NEAR(value(BinaryCrossentropy({.from_logits = true}), f32({0, 1, 0, 0}, {4}),
                    f32({-18.6f, 0.51f, 2.94f, -12.8f}, {4})),
              0.865, 1e-3);
  // Label smoothing s: y ← y(1 − s) + s / 2; at p = 0.5 every element costs log 2 regardless.
  EXPECT_NEAR(value(BinaryCrossentropy({.label_smoothing = 0.2f}), f32({1, 0}, {2}),
                    f32({0.5f, 0.5f}, {2, 1})),
              std::log(2.0), 1e-6);
  EXPECT_NEAR(value(BinaryCrossentropy({.from_logits = true, .label_smoothing = 0.2f}),
                    f32({1}, {1}), f32({2}, {1})),
              0.9 * std::log1p(std::exp(-2.0)) + 0.1 * std::log1p(std::exp(2.0)), 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Stability: huge logits and saturated probabilities give finite losses and gradients.

void expect_finite(const Loss& loss, const Tensor& y_true, const Tensor& y_pred) {
  auto [l, g] = loss_and_grad(loss, y_true, y_pred);
  EXPECT_TRUE(std::isfinite(l.item())) << loss.config_json() << " loss " << l.item();
  ASSERT_TRUE(g.defined());
  EXPECT_TRUE(ops::all_finite(g)) << loss.config_json() << " grad " << g.to_string();
}

TEST(LossesTest, HugeLogitsAreStable) {
  const Tensor logits = f32({1e4f, -1e4f, 0.0f, -1e4f, 1e4f, 1e4f}, {2, 3});
  const Tensor labels = Tensor::from_vector<int32_t>({1, 0}, {2});
  SparseCategoricalCrossentropy scce({.from_logits = true});
  expect_finite(scce, labels, logits);
  // Label 1 of row 0 is 2e4 below the max (loss 2e4); label 0 of row 1 is 2e4 below two
  // tied maxima (loss 2e4 + log 2).
  EXPECT_NEAR(value(scce, labels, logits), (2e4 + 2e4 + std::log(2.0)) / 2, 0.01);
  expect_finite(CategoricalCrossentropy({.from_logits = true}), f32({0, 1, 0, 1, 0, 0}, {2, 3}),
                logits);
  BinaryCrossentropy bce({.from_logits = true});
  expect_finite(bce, f32({0, 1, 1, 0}, {4}), f32({1e4f, -1e4f, 1e4f, -1e4f}, {4}));
  EXPECT_NEAR(value(bce, f32({0, 1, 1, 0}, {4}), f32({1e4f, -1e4f, 1e4f, -1e4f}, {4})), 5e3, 1.0);
}

TEST(LossesTest, SaturatedProbabilitiesAreClipped) {
  // Probabilities of exactly 0 and 1: Keras clips to [1e-7, 1 − 1e-7], so −log(1e-7) ≈ 16.1.
  const Tensor p = f32({0, 1, 1, 0}, {2, 2});
  expect_finite(SparseCategoricalCrossentropy(), Tensor::from_vector<int32_t>({0, 0}, {2}), p);
  expect_finite(CategoricalCrossentropy(), f32({1, 0, 1, 0}, {2, 2}), p);
  expect_finite(BinaryCrossentropy(), f32({1, 0, 1, 0}, {2, 2}), p);
  EXPECT_NEAR(value(CategoricalCrossentropy(), f32({1, 0, 1, 0}, {2, 2}), p), -std::log(1e-7) / 2,
              1e-3);
  EXPECT_NEAR(value(SparseCategoricalCrossentropy(), Tensor::from_vector<int32_t>({0}, {1}),
                    f32({0, 1}, {1, 2})),
              -std::log(1e-7), 1e-3);
}

// ---------------------------------------------------------------------------------------------
// Finite-difference gradients with respect to y_pred.

TEST(LossesTest, GradientsMatchFiniteDifferences) {
  const Tensor logits = testutil::random_tensor({4, 5}, 7, -2.0f, 2.0f);
  const Tensor probs = testutil::random_tensor({4, 5}, 8, 0.1f, 0.9f);
  const Tensor labels = Tensor::from_vector<int64_t>({0, 3, 4, 1}, {4});
  const Tensor onehot = f32({1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0}, {4, 5});
  const Tensor targets = testutil::random_tensor({4, 5}, 9, -1.0f, 1.0f);
  const Tensor bits = f32({1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1, 1, 0, 1, 0, 1, 1, 0, 0, 1}, {4, 5});

  struct Case {
    std::shared_ptr<Loss> loss;
    Tensor y_true, y_pred;
    float eps;
  };
  const std::vector<Case> cases = {
      {std::make_shared<MeanSquaredError>(), targets, logits, 1e-2f},
      {std::make_shared<SparseCategoricalCrossentropy>(
           SparseCategoricalCrossentropyOptions{.from_logits = true}),
       labels, logits, 1e-2f},
      {std::make_shared<SparseCategoricalCrossentropy>(), labels, probs, 1e-3f},
      {std::make_shared<CategoricalCrossentropy>(
           CategoricalCrossentropyOptions{.from_logits = true, .label_smoothing = 0.1f}),
       onehot, logits, 1e-2f},
      {std::make_shared<CategoricalCrossentropy>(), onehot, probs, 1e-3f},
      {std::make_shared<BinaryCrossentropy>(
           BinaryCrossentropyOptions{.from_logits = true, .label_smoothing = 0.1f}),
       bits, logits, 1e-2f},
      {std::make_shared<BinaryCrossentropy>(), bits, probs, 1e-3f},
  };
  for (const Case& c : cases) {
    const double err = gradcheck([&](const Inputs& x) { return (*c.loss)(c.y_true, x[0]); },
                                 {c.y_pred.clone()}, c.eps);
    EXPECT_LT(err, kGradTol) << c.loss->config_json();
  }
}

// ---------------------------------------------------------------------------------------------
// Errors.

TEST(LossesTest, OutOfRangeLabelNamesLabelAndExample) {
  const Tensor logits = testutil::random_tensor({3, 4}, 1);
  for (bool from_logits : {true, false}) {
    SparseCategoricalCrossentropy scce({.from_logits = from_logits});
    testutil::expect_throws_with<InvalidArgumentError>(
        [&] {
          scce(Tensor::from_vector<int32_t>({0, 7, 1}, {3}), logits);
        },
        {"sparse_categorical_crossentropy", "label 7", "example 1", "[0, 4)"});
    testutil::expect_throws_with<InvalidArgumentError>(
        [&] {
          scce(Tensor::from_vector<int64_t>({0, 1, -1}, {3}), logits);
        },
        {"label -1", "example 2"});
    // A non-integral float label is out of range too.
    testutil::expect_throws_with<InvalidArgumentError>(
        [&] {
          scce(f32({0, 1.5f, 1}, {3}), logits);
        },
        {"example 1"});
  }
}

TEST(LossesTest, ShapeMismatchNamesBothShapes) {
  const Tensor p = testutil::random_tensor({2, 3}, 2, 0.1f, 0.9f);
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        MeanSquaredError()(f32({1, 2, 3, 4}, {2, 2}), p);
      },
      {"mean_squared_error", "[2, 2]", "[2, 3]"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        CategoricalCrossentropy()(f32({1, 0, 0, 1}, {2, 2}), p);
      },
      {"categorical_crossentropy", "[2, 2]", "[2, 3]"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        BinaryCrossentropy()(f32({1, 0, 1}, {3}), p);
      },
      {"binary_crossentropy", "[3]", "[2, 3]"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        SparseCategoricalCrossentropy()(Tensor::from_vector<int32_t>({0, 1, 2}, {3}), p);
      },
      {"sparse_categorical_crossentropy", "[3]", "[2, 3]"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        SparseCategoricalCrossentropy()(Tensor::from_vector<int32_t>({0, 1, 1, 0}, {2, 2}), p);
      },
      {"[2, 2]", "[2, 3]"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        SparseCategoricalCrossentropy()(f32({0, 1}, {2}), f32({1, 2}, {2}));
      },
      {"[2]"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] { CategoricalCrossentropy({.label_smoothing = 1.5f}); }, {"label_smoothing"});
}

TEST(LossesTest, UnknownNameListsKnownNames) {
  testutil::expect_throws_with<InvalidArgumentError>(
      [] { loss_from_name("hinge"); },
      {"\"hinge\"", "\"mse\"", "\"sparse_categorical_crossentropy\"",
       "\"categorical_crossentropy\"", "\"binary_crossentropy\""});
  testutil::expect_throws_with<InvalidArgumentError>(
      [] { loss_from_json("{\"class_name\": \"Huber\", \"config\": {}}"); }, {"Huber"});
  testutil::expect_throws_with<InvalidArgumentError>([] { loss_from_json("{not json"); },
                                                     {"malformed"});
}

// ---------------------------------------------------------------------------------------------
// Names and configs.

TEST(LossesTest, NamesAndLookup) {
  EXPECT_EQ(loss_from_name("mse")->name(), "mean_squared_error");
  EXPECT_EQ(loss_from_name("mean_squared_error")->name(), "mean_squared_error");
  EXPECT_EQ(loss_from_name("sparse_categorical_crossentropy")->name(),
            "sparse_categorical_crossentropy");
  EXPECT_EQ(loss_from_name("categorical_crossentropy")->name(), "categorical_crossentropy");
  EXPECT_EQ(loss_from_name("binary_crossentropy")->name(), "binary_crossentropy");
  EXPECT_EQ(loss_from_name("SparseCategoricalCrossentropy")->get_config().class_name,
            "SparseCategoricalCrossentropy");
  // Defaults are Keras's.
  const auto* scce = dynamic_cast<const SparseCategoricalCrossentropy*>(
      loss_from_name("sparse_categorical_crossentropy").get());
  ASSERT_NE(scce, nullptr);
  EXPECT_FALSE(scce->options().from_logits);
}

TEST(LossesTest, ConfigsAreKeras) {
  EXPECT_EQ(MeanSquaredError().config_json(),
            R"({"reduction":"auto","name":"mean_squared_error"})");
  EXPECT_EQ(SparseCategoricalCrossentropy({.from_logits = true}).config_json(),
            R"({"reduction":"auto","name":"sparse_categorical_crossentropy","from_logits":true,)"
            R"("ignore_class":null})");
  EXPECT_EQ(CategoricalCrossentropy().config_json(),
            R"({"reduction":"auto","name":"categorical_crossentropy","from_logits":false,)"
            R"("label_smoothing":0.0,"axis":-1})");
  const LossConfig c =
      BinaryCrossentropy({.from_logits = true, .label_smoothing = 0.25f}).get_config();
  EXPECT_EQ(c.class_name, "BinaryCrossentropy");
  EXPECT_EQ(c.from_logits, true);
  EXPECT_EQ(c.label_smoothing, 0.25f);
  // Round trip through config and JSON.
  const auto back = loss_from_config(c);
  EXPECT_EQ(back->config_json(),
            BinaryCrossentropy({.from_logits = true, .label_smoothing = 0.25f}).config_json());
  const auto from_json = loss_from_json(
      R"({"class_name": "SparseCategoricalCrossentropy", "config": {"reduction": "auto",)"
      R"( "name": "sparse_categorical_crossentropy", "from_logits": true, "ignore_class": null}})");
  EXPECT_EQ(from_json->config_json(),
            SparseCategoricalCrossentropy({.from_logits = true}).config_json());
  EXPECT_EQ(loss_from_json("\"mse\"")->name(), "mean_squared_error");
}

TEST(LossesTest, LabelsAreNotDifferentiated) {
  // A watched y_true gets no gradient (TF returns None), y_pred does.
  Tensor y = f32({0, 1, 1, 0}, {2, 2});
  Tensor p = f32({0.3f, 0.7f, 0.6f, 0.4f}, {2, 2});
  GradientTape tape;
  tape.watch(y);
  tape.watch(p);
  const Tensor l = MeanSquaredError()(y, p);
  const std::vector<Tensor> g = tape.gradient(l, std::vector<Tensor>{y, p});
  EXPECT_FALSE(g[0].defined());
  EXPECT_TRUE(g[1].defined());
}

}  // namespace
}  // namespace dtrain::nn
