// Embedding through the Layer API, Dense on sequences, and the sparse cross-entropy on
// [batch, time, vocab] logits (what a language model trains with).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/nn/embedding.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/losses.h"
#include "dtrain/nn/model.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"
#include "testutil/weights_gradcheck.h"

namespace dtrain::nn {
namespace {

using testutil::expect_throws_with;
using testutil::gradcheck;
using testutil::random_tensor;
using testutil::weights_gradcheck;
constexpr double kTol = 2e-2;

TEST(Embedding, KerasWeightDefaultsAndLookup) {
  Embedding emb(10, 4, {.seed = 3, .name = "tok"});
  ASSERT_EQ(emb.weights().size(), 1u);
  EXPECT_EQ(emb.weights()[0]->name(), "tok/embeddings");
  EXPECT_EQ(emb.weights()[0]->shape(), (Shape{10, 4}));
  // Keras's "uniform": RandomUniform(-0.05, 0.05).
  const Tensor& table = emb.embeddings().tensor();
  float lo = 1, hi = -1;
  for (int64_t i = 0; i < table.num_elements(); ++i) {
    lo = std::min(lo, table.data<float>()[i]);
    hi = std::max(hi, table.data<float>()[i]);
  }
  EXPECT_GE(lo, -0.05f);
  EXPECT_LT(hi, 0.05f);
  EXPECT_LT(lo, -0.02f);
  EXPECT_GT(hi, 0.02f);
  // Ids as float (what datasets carry) or int; any sequence length.
  const Tensor ids = Tensor::from_vector<float>({1, 9, 0, 3, 3, 7}, Shape{2, 3});
  const Tensor out = emb(ids);
  ASSERT_EQ(out.shape(), (Shape{2, 3, 4}));
  for (int64_t j = 0; j < 4; ++j) {
    EXPECT_EQ(out.data<float>()[1 * 4 + j], table.data<float>()[9 * 4 + j]);
  }
  EXPECT_EQ(emb(Tensor::from_vector<int64_t>({2, 2, 2, 2, 2}, Shape{1, 5})).shape(),
            (Shape{1, 5, 4}));
  EXPECT_EQ(emb.compute_output_shape(Shape{7}), (Shape{7, 4}));
}

TEST(Embedding, GradientOfTheTable) {
  Embedding emb(6, 3, {.seed = 4});
  const Tensor ids = Tensor::from_vector<int32_t>({0, 5, 5, 2}, Shape{2, 2});
  EXPECT_LT(weights_gradcheck([&] { return emb(ids); }, emb.trainable_weights()), kTol);
}

TEST(Embedding, IdOutOfRangeNamesTheLayerPositionAndId) {
  Embedding emb(5, 2, {.name = "words"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        emb(Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 5}, Shape{3, 2}));
      },
      {"Embedding 'words' (input_dim 5)", "id 5", "position [2, 1]", "[0, 5)"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        emb(Tensor::from_vector<float>({-3}, Shape{1, 1}));
      },
      {"id -3", "position [0, 0]"});
}

TEST(Embedding, ConfigRoundTripsThroughModelJson) {
  Sequential model({Embedding(12, 3, {.mask_zero = true, .input_shape = Shape{5}, .name = "e"}),
                    Dense(4, {.name = "d"})});
  const nlohmann::json j = nlohmann::json::parse(model.to_json());
  const nlohmann::json& layers = j["config"]["layers"];
  const nlohmann::json& e = layers[layers.size() - 2];  // after Sequential's InputLayer
  const nlohmann::json& c = e["config"];
  EXPECT_EQ(e["class_name"], "Embedding");
  EXPECT_EQ(c["input_dim"], 12);
  EXPECT_EQ(c["output_dim"], 3);
  EXPECT_EQ(c["mask_zero"], true);
  EXPECT_EQ(c["embeddings_initializer"]["class_name"], "RandomUniform");
  std::unique_ptr<Model> back = model_from_json(model.to_json());
  ASSERT_EQ(back->weights().size(), 3u);
  EXPECT_EQ(back->weights()[0]->name(), "e/embeddings");
  EXPECT_EQ(back->weights()[0]->shape(), (Shape{12, 3}));
  EXPECT_EQ(back->weights()[1]->shape(), (Shape{3, 4}));
  EXPECT_EQ((*back)(Tensor::zeros(Shape{2, 5})).shape(), (Shape{2, 5, 4}));
}

TEST(DenseOnSequences, FoldsLeadingDimensionsIntoTheBatch) {
  Dense dense(3, {.seed = 5});
  const Tensor x = random_tensor(Shape{2, 4, 5}, 6);
  const Tensor y = dense(x);
  ASSERT_EQ(y.shape(), (Shape{2, 4, 3}));
  // Each time step equals Dense applied to that [batch, features] slice.
  for (int64_t t = 0; t < 4; ++t) {
    Tensor step(Shape{2, 5});
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t f = 0; f < 5; ++f)
        step.data<float>()[b * 5 + f] = x.data<float>()[(b * 4 + t) * 5 + f];
    const Tensor ys = dense.call(step, false);  // the same kernel on one step
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t u = 0; u < 3; ++u) {
        EXPECT_FLOAT_EQ(ys.data<float>()[b * 3 + u], y.data<float>()[(b * 4 + t) * 3 + u]);
      }
  }
  EXPECT_LT(weights_gradcheck([&] { return dense(x); }, dense.trainable_weights()), kTol);
  EXPECT_LT(gradcheck([&](const std::vector<Tensor>& v) { return dense(v[0]); }, {x}), kTol);
}

TEST(SequenceCrossEntropy, MeanOverBatchAndTimeFromLogits) {
  const int64_t B = 2, T = 3, V = 5;
  const Tensor logits = random_tensor(Shape{B, T, V}, 7, -2, 2);
  const Tensor labels = Tensor::from_vector<int32_t>({0, 4, 2, 1, 1, 3}, Shape{B, T});
  const SparseCategoricalCrossentropy loss({.from_logits = true});
  double expected = 0;
  for (int64_t p = 0; p < B * T; ++p) {
    const float* z = logits.data<float>() + p * V;
    double mx = z[0], sum = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
    expected += -(z[labels.data<int32_t>()[p]] - mx - std::log(sum));
  }
  expected /= B * T;
  EXPECT_NEAR(loss(labels, logits).item(), expected, 1e-5);
  // Labels [B, T, 1] as Keras accepts, and float labels.
  EXPECT_NEAR(loss(labels.reshape(Shape{B, T, 1}), logits).item(), expected, 1e-5);
  EXPECT_NEAR(loss(ops::cast(labels, DType::kFloat32), logits).item(), expected, 1e-5);
  EXPECT_LT(gradcheck([&](const std::vector<Tensor>& v) { return loss(labels, v[0]); }, {logits}),
            kTol);
  // From probabilities too.
  const SparseCategoricalCrossentropy from_probs;
  const Tensor probs = ops::softmax(logits);
  EXPECT_NEAR(from_probs(labels, probs).item(), expected, 1e-5);
}

TEST(SequenceCrossEntropy, BadLabelsAndShapesAreNamed) {
  const SparseCategoricalCrossentropy loss({.from_logits = true});
  const Tensor logits = random_tensor(Shape{2, 3, 4}, 8);
  expect_throws_with<InvalidArgumentError>(
      [&] {
        loss(Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 0}, Shape{2, 3}), logits);
      },
      {"sparse_categorical_crossentropy", "label 4", "[0, 4)"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        loss(Tensor::zeros(Shape{2, 4}), logits);
      },
      {"sparse_categorical_crossentropy"});
}

}  // namespace
}  // namespace dtrain::nn
