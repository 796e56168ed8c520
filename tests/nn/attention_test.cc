// MultiHeadAttention through the Layer API: weight layout and names, finite-difference
// gradients (with and without masks, causal), dropout, the multi-input call and bad input.
// Values against PyTorch are in seq_golden_test.cc.
#include "dtrain/nn/attention.h"

#include <gtest/gtest.h>

#include "dtrain/nn/layers.h"
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

TEST(MultiHeadAttention, KerasWeightNamesAndShapes) {
  MultiHeadAttention mha(2, 3, {.value_dim = 4, .output_shape = 7, .name = "mha"});
  mha(random_tensor(Shape{1, 3, 5}, 1), random_tensor(Shape{1, 4, 6}, 2),
      {.key = random_tensor(Shape{1, 4, 8}, 3)});
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (Variable* v : mha.weights()) {
    names.push_back(v->name());
    shapes.push_back(v->shape());
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"mha/query/kernel", "mha/query/bias", "mha/key/kernel",
                                      "mha/key/bias", "mha/value/kernel", "mha/value/bias",
                                      "mha/attention_output/kernel", "mha/attention_output/bias"}));
  EXPECT_EQ(shapes, (std::vector<Shape>{Shape{5, 2, 3}, Shape{2, 3}, Shape{8, 2, 3}, Shape{2, 3},
                                        Shape{6, 2, 4}, Shape{2, 4}, Shape{2, 4, 7}, Shape{7}}));
  // Sequence lengths may change between calls; feature sizes may not.
  EXPECT_EQ(mha(random_tensor(Shape{2, 9, 5}, 4), random_tensor(Shape{2, 2, 6}, 5),
                {.key = random_tensor(Shape{2, 2, 8}, 6)})
                .shape(),
            (Shape{2, 9, 7}));
  expect_throws_with<InvalidArgumentError>(
      [&] {
        mha(random_tensor(Shape{1, 3, 4}, 7), random_tensor(Shape{1, 4, 6}, 8));
      },
      {"MultiHeadAttention 'mha'", "built for query, value and key features 5, 6 and 8"});
}

TEST(MultiHeadAttention, GradientsOfWeightsAndInputs) {
  const Tensor q = random_tensor(Shape{2, 3, 4}, 11);
  const Tensor v = random_tensor(Shape{2, 5, 3}, 12);
  Tensor mask(Shape{2, 3, 5});
  for (int64_t i = 0; i < mask.num_elements(); ++i) mask.data<float>()[i] = (i * 7) % 3 ? 1 : 0;
  // Every query keeps key 0, so no row is fully masked (there the float32 forward is flat:
  // every score rounds to −1e9, while the analytic gradient is that of a uniform softmax).
  for (int64_t i = 0; i < mask.num_elements(); i += 5) mask.data<float>()[i] = 1;
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant == 0 ? "no mask" : variant == 1 ? "mask" : "causal and mask");
    MultiHeadAttention mha(2, 3, {.value_dim = 2, .seed = 5});
    // Biases start at zero; randomize them so their gradients are checked in general position.
    mha(q, v);
    for (Variable* w : mha.weights()) w->assign(random_tensor(w->shape(), 13 + variant));
    AttentionCallOptions o;
    if (variant >= 1) o.attention_mask = mask;
    o.use_causal_mask = variant == 2;
    EXPECT_LT(weights_gradcheck([&] { return mha(q, v, o); }, mha.trainable_weights()), kTol);
    EXPECT_LT(gradcheck([&](const std::vector<Tensor>& x) { return mha(x[0], x[1], o); }, {q, v}),
              kTol);
  }
  // Self-attention through call(): one input feeds query, key and value.
  MultiHeadAttention self(2, 2, {.seed = 6});
  const Tensor x = random_tensor(Shape{2, 4, 4}, 14);
  self(x);
  for (Variable* w : self.weights()) w->assign(random_tensor(w->shape(), 15));
  EXPECT_LT(gradcheck(
                [&](const std::vector<Tensor>& in) {
                  return self(in[0], in[0], {.use_causal_mask = true});
                },
                {x}),
            kTol);
}

TEST(MultiHeadAttention, CausalMaskHidesTheFuture) {
  MultiHeadAttention mha(2, 4, {.seed = 7});
  const Tensor x = random_tensor(Shape{1, 5, 8}, 21);
  Tensor scores;
  const Tensor unfused = mha(x, x, {.use_causal_mask = true, .attention_scores = &scores});
  ASSERT_EQ(scores.shape(), (Shape{1, 2, 5, 5}));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t s = t + 1; s < 5; ++s)
        EXPECT_EQ(scores.data<float>()[(h * 5 + t) * 5 + s], 0.0f);
  // Changing the last position changes only the last output row, on both paths (without the
  // scores, the fused kernel).
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass == 0 ? "unfused" : "fused");
    Tensor ignored;
    const AttentionCallOptions o{.use_causal_mask = true,
                                 .attention_scores = pass == 0 ? &ignored : nullptr};
    const Tensor y = pass == 0 ? unfused : mha(x, x, o);
    Tensor x2 = x.clone();
    for (int64_t j = 0; j < 8; ++j) x2.data<float>()[4 * 8 + j] += 1.0f;
    const Tensor y2 = mha(x2, x2, o);
    for (int64_t i = 0; i < 4 * 8; ++i) EXPECT_EQ(y.data<float>()[i], y2.data<float>()[i]);
    EXPECT_NE(y.data<float>()[4 * 8], y2.data<float>()[4 * 8]);
  }
}

// The fused kernel (taken without returned scores, probability dropout or an attention_mask)
// against the unfused path (forced by asking for the scores): outputs and weight gradients,
// for the causal mask, key padding (value and key masks), both, an all-true query mask, and
// masks the fused kernel hands back to the unfused path (a masked query; causal with key 0
// padded), T = 53 (odd, past a block of 48 queries and keys), key_dim 5.
TEST(MultiHeadAttention, FusedPathEqualsTheUnfusedOne) {
  const int64_t B = 3, T = 53;
  const Tensor x = random_tensor(Shape{B, T, 6}, 41);
  Tensor pad = Tensor::ones(Shape{B, T});
  for (int64_t t = 46; t < T; ++t) pad.data<float>()[T + t] = 0;  // row 1: the last 7 padded
  pad.data<float>()[2 * T + 5] = 0;                               // row 2: one inside
  Tensor left = pad.clone();
  left.data<float>()[0] = 0;  // row 0: key 0 padded (its first query sees nothing causally)
  struct Case {
    const char* what;
    AttentionCallOptions o;
  };
  const Case cases[] = {
      {"causal", {.use_causal_mask = true}},
      {"none", {}},
      {"value mask", {.value_mask = pad}},
      {"causal and value/key masks", {.use_causal_mask = true, .value_mask = pad, .key_mask = pad}},
      {"all-true query mask", {.use_causal_mask = true, .query_mask = Tensor::ones(Shape{B, T})}},
      {"masked queries (unfused)", {.query_mask = pad, .value_mask = pad}},
      {"causal, key 0 padded (unfused)", {.use_causal_mask = true, .value_mask = left}},
  };
  MultiHeadAttention mha(2, 5, {.value_dim = 3, .seed = 4});
  mha(x);
  for (Variable* w : mha.weights()) w->assign(random_tensor(w->shape(), 42));
  auto run = [&](AttentionCallOptions o, bool unfused) {
    Tensor scores;
    if (unfused) o.attention_scores = &scores;
    GradientTape tape;
    const Tensor y = mha(x, x, o);
    const Tensor r = random_tensor(y.shape(), 43, 0.5f, 1.5f);
    std::vector<Tensor> out = tape.gradient(reduce_sum(multiply(y, r)), mha.trainable_weights());
    out.insert(out.begin(), y);
    return out;
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::vector<Tensor> want = run(c.o, true);
    const std::vector<Tensor> got = run(c.o, false);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].shape(), want[i].shape()) << "tensor " << i;
      for (int64_t e = 0; e < got[i].num_elements(); ++e) {
        const float w = want[i].data<float>()[e];
        ASSERT_NEAR(got[i].data<float>()[e], w, 2e-5 * (1 + std::fabs(w)))
            << "tensor " << i << " element " << e;
      }
    }
  }
}

TEST(MultiHeadAttention, DropoutOnProbabilitiesIsSeededAndOnlyInTraining) {
  const Tensor x = random_tensor(Shape{2, 6, 4}, 31);
  MultiHeadAttention a(2, 2, {.dropout = 0.5f, .seed = 9});
  MultiHeadAttention b(2, 2, {.dropout = 0.5f, .seed = 9});
  a(x);
  b(x);
  for (size_t i = 0; i < a.weights().size(); ++i) b.weights()[i]->assign(a.weights()[i]->tensor());
  const Tensor inference = a(x, x);
  EXPECT_TRUE(inference.equals(a(x, x, {.training = false})));
  const Tensor ta = a(x, x, {.training = true});
  const Tensor tb = b(x, x, {.training = true});
  EXPECT_TRUE(ta.equals(tb));                            // same seed, same call index: same mask
  EXPECT_FALSE(ta.equals(inference));                    // dropout changed something
  EXPECT_FALSE(ta.equals(a(x, x, {.training = true})));  // the next call draws a new mask
  EXPECT_EQ(a.dropout_layer().rng_state().counter, 2u);
  // Another sequence length (generation grows the context) still drops.
  const Tensor longer = random_tensor(Shape{1, 9, 4}, 32);
  EXPECT_EQ(a(longer, longer, {.training = true}).shape(), (Shape{1, 9, 4}));
}

TEST(MultiHeadAttention, FunctionalCallListAndOutputShapes) {
  MultiHeadAttention mha(2, 3, {.name = "fmha"});
  const Shape in[2] = {Shape{4, 6}, Shape{5, 3}};
  mha.build_list(std::span<const Shape>(in, 2));
  EXPECT_TRUE(mha.built());
  EXPECT_EQ(mha.compute_output_shapes(std::span<const Shape>(in, 2)),
            (std::vector<Shape>{Shape{4, 6}}));
  mha.set_functional_call_args(/*use_causal_mask=*/false, /*return_attention_scores=*/true);
  EXPECT_EQ(mha.compute_output_shapes(std::span<const Shape>(in, 2)),
            (std::vector<Shape>{Shape{4, 6}, Shape{2, 4, 5}}));
  const Tensor inputs[2] = {random_tensor(Shape{2, 4, 6}, 41), random_tensor(Shape{2, 5, 3}, 42)};
  const std::vector<Tensor> out = mha.call_list(std::span<const Tensor>(inputs, 2), false);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].shape(), (Shape{2, 4, 6}));
  EXPECT_EQ(out[1].shape(), (Shape{2, 2, 4, 5}));
}

TEST(MultiHeadAttention, BadInputNamesTheLayer) {
  MultiHeadAttention mha(2, 3, {.name = "att"});
  const Tensor q = random_tensor(Shape{2, 3, 4}, 51);
  const Tensor v = random_tensor(Shape{2, 5, 4}, 52);
  expect_throws_with<InvalidArgumentError>(
      [&] {
        mha(q, v, {.attention_mask = Tensor::ones(Shape{2, 3, 4})});
      },
      {"MultiHeadAttention 'att'", "attention_mask [2, 3, 4]", "[batch, T, S] = [2, 3, 5]"});
  expect_throws_with<InvalidArgumentError>(
      [&] { mha(q, v, {.attention_mask = Tensor::ones(Shape{5})}); }, {"attention_mask [5]"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        mha(random_tensor(Shape{2, 4}, 53), v);
      },
      {"MultiHeadAttention 'att'", "the query must be float32 [batch, time, features]", "[2, 4]"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        mha(q, random_tensor(Shape{3, 5, 4}, 54));
      },
      {"must share the batch size"});
  // A broadcastable mask is accepted: [T, S] and [batch, 1, S].
  EXPECT_NO_THROW(mha(q, v, {.attention_mask = Tensor::ones(Shape{3, 5})}));
  EXPECT_NO_THROW(mha(q, v, {.attention_mask = Tensor::ones(Shape{2, 1, 5})}));
}

}  // namespace
}  // namespace dtrain::nn
