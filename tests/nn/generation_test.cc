// KV-cached generation for nn::GPT: GPTDecoder's logits equal the full forward's, cached
// generation equals the plain recompute-everything loop token for token (also past the context,
// where the window slides), and bad prompts are clear errors.
#include "dtrain/nn/generation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dtrain/core/error.h"
#include "testutil/expect_throws.h"

namespace dtrain::nn {
namespace {

using testutil::expect_throws_with;

GPTConfig small() {
  return {.vocab_size = 13,
          .context = 10,
          .num_layers = 2,
          .d_model = 16,
          .num_heads = 4,
          .seed = 5,
          .name = "lm"};
}

TEST(GPTDecoder, PiecewiseLogitsEqualTheFullForward) {
  GPT lm(small());
  const std::vector<int32_t> ids = {3, 1, 12, 0, 7, 7, 2, 9};
  Tensor tokens(DType::kInt32, Shape{1, 8});
  std::copy(ids.begin(), ids.end(), tokens.data<int32_t>());
  const Tensor full = lm(tokens);  // [1, 8, 13]
  GPTDecoder dec(lm);
  // A 3-token prompt, then one token at a time.
  std::vector<Tensor> rows;
  rows.push_back(dec.feed(std::span<const int32_t>(ids.data(), 3)));
  for (size_t i = 3; i < ids.size(); ++i) {
    rows.push_back(dec.feed(std::span<const int32_t>(ids.data() + i, 1)));
  }
  EXPECT_EQ(dec.length(), 8);
  for (size_t k = 0; k < rows.size(); ++k) {
    const int64_t t = static_cast<int64_t>(k) + 2;  // the position each logit row belongs to
    double worst = 0;
    for (int64_t v = 0; v < 13; ++v) {
      worst = std::max(worst, std::fabs(static_cast<double>(rows[k].data<float>()[v] -
                                                            full.data<float>()[t * 13 + v])));
    }
    EXPECT_LT(worst, 1e-5) << "position " << t;
  }
  expect_throws_with<InvalidArgumentError>(
      [&] {
        const std::vector<int32_t> more = {1, 2, 3};
        dec.feed(more);
      },
      {"GPT 'lm': cannot decode 3 more tokens after 8: the context is 10"});
  dec.reset();
  EXPECT_EQ(dec.length(), 0);
}

TEST(Generate, CachedEqualsUncachedGreedyTokenForToken) {
  GPT lm(small());
  const std::vector<int32_t> prompt = {4, 8, 15 % 13};
  std::vector<int32_t> streamed;
  // 14 new tokens: past the context of 10, so the window slides for the last ones.
  const std::vector<int32_t> cached = generate(
      lm, prompt,
      {.max_new_tokens = 14, .sampler = {.temperature = 0.0f}, .on_token = [&](int32_t id) {
         streamed.push_back(id);
       }});
  const std::vector<int32_t> plain = generate(
      lm, prompt, {.max_new_tokens = 14, .sampler = {.temperature = 0.0f}, .use_cache = false});
  ASSERT_EQ(cached.size(), 14u);
  EXPECT_EQ(cached, plain);
  EXPECT_EQ(streamed, cached);
  for (int32_t id : cached) EXPECT_TRUE(id >= 0 && id < 13);
  // Seeded sampling is reproducible.
  const GenerateOptions sampled{.max_new_tokens = 12,
                                .sampler = {.temperature = 1.0f, .top_k = 5, .seed = 9}};
  EXPECT_EQ(generate(lm, prompt, sampled), generate(lm, prompt, sampled));
}

TEST(Generate, RejectsPromptsThatDoNotFit) {
  GPT lm(small());
  expect_throws_with<InvalidArgumentError>([&] { generate(lm, std::vector<int32_t>{}, {}); },
                                           {"the prompt is empty"});
  const std::vector<int32_t> long_prompt(11, 1);
  expect_throws_with<InvalidArgumentError>(
      [&] { generate(lm, long_prompt, {}); },
      {"the prompt has 11 tokens, more than the model's context of 10"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        generate(lm, std::vector<int32_t>{1, 13}, {.max_new_tokens = 1});
      },
      {"input_dim 13", "id 13"});
}

}  // namespace
}  // namespace dtrain::nn
