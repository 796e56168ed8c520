// Sequence lengths that differ from the build's (Keras's None axes), TransformerBlock and GPT:
// shapes, errors, gradients, config round trips.
#include "dtrain/nn/transformer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "dtrain/autograd/array_ops.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/model.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"
#include "testutil/weights_gradcheck.h"

namespace dtrain::nn {
namespace {

using testutil::expect_throws;
using testutil::random_tensor;

// max |a − b| over every element (same shapes), or infinity when the shapes differ.
double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return 1e30;
  const Tensor &ca = a, &cb = b;
  double worst = 0;
  for (int64_t i = 0; i < ca.num_elements(); ++i) {
    worst =
        std::max(worst, static_cast<double>(std::fabs(ca.data<float>()[i] - cb.data<float>()[i])));
  }
  return worst;
}

Tensor tokens(std::initializer_list<int32_t> ids, int64_t batch) {
  const int64_t t = static_cast<int64_t>(ids.size()) / batch;
  return Tensor::from_vector<int32_t>(std::vector<int32_t>(ids), Shape{batch, t});
}

TEST(VariableLength, LayersBuiltOnOneLengthRunOnAnother) {
  Dense dense(3, {.seed = 1});
  LayerNormalization ln;
  MultiHeadAttention mha(2, 2, {.seed = 2});
  Dropout drop(0.5f, {.seed = 3});
  Activation act("gelu");
  Embedding emb(10, 4, {.input_shape = Shape{8}});
  const Tensor long_x = random_tensor(Shape{2, 8, 4}, 1);
  const Tensor short_x = slice_axis(long_x, 1, 0, 5);
  for (Layer* l : std::initializer_list<Layer*>{&dense, &ln, &mha, &drop, &act}) {
    const Tensor a = (*l)(long_x);
    const Tensor b = (*l)(short_x);  // threw "expected inputs of shape [batch, 8, 4]" before
    EXPECT_EQ(b.dim(1), 5) << l->name();
    // Position-wise layers agree on the shared positions (non-causal attention does not).
    if (l != &mha) {
      EXPECT_LT(max_abs_diff(slice_axis(a, 1, 0, 5), b), 1e-6) << l->name();
    }
  }
  EXPECT_EQ(emb(Tensor::zeros(Shape{3, 5}, DType::kInt32)).shape(), (Shape{3, 5, 4}));
}

TEST(VariableLength, SequentialOfTokenLayersTakesShorterSequences) {
  Sequential model(
      {Embedding(12, 6, {.input_shape = Shape{16}}), LayerNormalization(), Dense(12, {.seed = 4})});
  EXPECT_EQ(model(Tensor::zeros(Shape{2, 16}, DType::kInt32)).shape(), (Shape{2, 16, 12}));
  EXPECT_EQ(model(Tensor::zeros(Shape{2, 37 - 30}, DType::kInt32)).shape(), (Shape{2, 7, 12}));
}

TEST(VariableLength, RealMismatchesStillThrowNamingTheLayer) {
  Dense dense(3, {.seed = 1, .name = "proj"});
  (void)dense(Tensor::zeros(Shape{2, 8, 4}));
  std::string m = expect_throws<InvalidArgumentError>([&] {
    dense(Tensor::zeros(Shape{2, 8, 5}));
  });
  EXPECT_NE(m.find("Dense 'proj'"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 8, 5]"), std::string::npos) << m;
  m = expect_throws<InvalidArgumentError>([&] { dense(Tensor::zeros(Shape{2, 4})); });
  EXPECT_NE(m.find("Dense 'proj'"), std::string::npos) << m;

  LayerNormalization ln({.name = "norm"});
  (void)ln(Tensor::zeros(Shape{2, 8, 4}));
  m = expect_throws<InvalidArgumentError>([&] { ln(Tensor::zeros(Shape{2, 8, 3})); });
  EXPECT_NE(m.find("LayerNormalization 'norm'"), std::string::npos) << m;

  Sequential seq({Dense(3, {.input_shape = Shape{8, 4}, .name = "first"})});
  m = expect_throws<InvalidArgumentError>([&] { seq(Tensor::zeros(Shape{2, 8, 5})); });
  EXPECT_NE(m.find("'first'"), std::string::npos) << m;
  m = expect_throws<InvalidArgumentError>([&] { seq(Tensor::zeros(Shape{2, 4})); });
  EXPECT_NE(m.find("expected inputs of shape"), std::string::npos) << m;
}

GPTConfig tiny(std::optional<uint64_t> seed = 7) {
  return {
      .vocab_size = 11, .context = 8, .num_layers = 2, .d_model = 8, .num_heads = 2, .seed = seed};
}

TEST(GPT, LogitsForEveryPositionAndAnyLengthUpToTheContext) {
  GPT lm(tiny());
  const Tensor x = tokens({1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 6, 7}, 2);
  const Tensor full = lm(x);
  EXPECT_EQ(full.shape(), (Shape{2, 8, 11}));
  // Causal: the logits of a prefix do not depend on what follows it.
  const Tensor prefix = lm(tokens({1, 2, 3, 0, 1, 2}, 2));
  EXPECT_EQ(prefix.shape(), (Shape{2, 3, 11}));
  EXPECT_LT(max_abs_diff(slice_axis(full, 1, 0, 3), prefix), 1e-5);
  // Parameters: 2 embeddings, 2 blocks of (2 LN, MHA, 2 Dense), final LN, head.
  const int64_t d = 8, v = 11, c = 8;
  const int64_t block = 2 * 2 * d + (4 * d * d + 4 * d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
  EXPECT_EQ(lm.count_params(), v * d + c * d + 2 * block + 2 * d + d * v + v);
  EXPECT_EQ(lm.num_blocks(), 2);
  EXPECT_EQ(lm.block(1).attention().num_heads(), 2);
  EXPECT_EQ(lm.block(0).ffn_up().units(), 32);
}

TEST(GPT, BadInputsGiveClearErrors) {
  GPT lm(tiny());
  std::string m = expect_throws<InvalidArgumentError>([&] {
    lm(Tensor::zeros(Shape{1, 9}, DType::kInt32));
  });
  EXPECT_NE(m.find("GPT 'gpt"), std::string::npos) << m;
  EXPECT_NE(m.find("context of 8"), std::string::npos) << m;
  m = expect_throws<InvalidArgumentError>([&] { lm(tokens({1, 2, 11, 3}, 1)); });
  EXPECT_NE(m.find("token_embedding"), std::string::npos) << m;
  EXPECT_NE(m.find("11"), std::string::npos) << m;
  m = expect_throws<InvalidArgumentError>([&] { lm(Tensor::zeros(Shape{1, 4, 8})); });
  EXPECT_NE(m.find("GPT"), std::string::npos) << m;
  m = expect_throws<InvalidArgumentError>(
      [&] { GPT({.vocab_size = 5, .d_model = 6, .num_heads = 4}); });
  EXPECT_NE(m.find("multiple of num_heads"), std::string::npos) << m;
}

TEST(GPT, SeededModelsAreIdenticalAndConfigRoundTrips) {
  GPT a(tiny(3));
  std::unique_ptr<Model> b = model_from_json(a.to_json());
  ASSERT_EQ(b->class_name(), "GPT");
  const auto wa = a.weights(), wb = b->weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i]->name(), wb[i]->name());
    EXPECT_TRUE(wa[i]->tensor().equals(wb[i]->tensor())) << wa[i]->name();
  }
  const nlohmann::json c = nlohmann::json::parse(a.config_json());
  EXPECT_EQ(c["vocab_size"], 11);
  EXPECT_EQ(c["context"], 8);
  EXPECT_EQ(c["num_layers"], 2);
  // Keras 3's spelling of a registered custom class.
  nlohmann::json k3 = {{"module", "dtrain"},
                       {"class_name", "GPT"},
                       {"config", c},
                       {"registered_name", "dtrain>GPT"}};
  EXPECT_EQ(model_from_json(k3.dump())->count_params(), a.count_params());
  // Weight names are the sub-layers' attribute paths.
  EXPECT_EQ(a.weights()[0]->name(), "token_embedding/embeddings");
  EXPECT_EQ(a.block(1).attention().weights()[0]->name(), "block_1/attention/query/kernel");
}

TEST(TransformerBlockGradCheck, EveryWeightOfABlock) {
  TransformerBlock block({.d_model = 4, .num_heads = 2, .seed = 5});
  // Non-trivial LayerNorm parameters so their gradients are exercised away from 1 and 0.
  for (Variable* v : block.weights()) {
    if (v->name().find("gamma") != std::string::npos ||
        v->name().find("beta") != std::string::npos) {
      v->assign(random_tensor(v->shape(), 11, 0.5f, 1.5f));
    }
  }
  const Tensor x = random_tensor(Shape{2, 3, 4}, 12);
  EXPECT_LT(testutil::weights_gradcheck([&] { return block(x, false); }, block.trainable_weights(),
                                        1e-2f),
            2e-2);
}

}  // namespace
}  // namespace dtrain::nn
