// MultiHeadAttention::call_cached: decoding through a key/value cache equals one full causal
// self-attention call.
#include <gtest/gtest.h>

#include <cmath>

#include "dtrain/autograd/functions.h"
#include "dtrain/nn/attention.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"

namespace dtrain::nn {
namespace {

using testutil::random_tensor;

// x[:, t0:t1, :] of x [B, T, F].
Tensor steps(const Tensor& x, int64_t t0, int64_t t1) {
  const int64_t B = x.dim(0), T = x.dim(1), F = x.dim(2);
  Tensor out(Shape{B, t1 - t0, F});
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(x.data<float>() + (b * T + t0) * F, (t1 - t0) * F,
                out.data<float>() + b * (t1 - t0) * F);
  }
  return out;
}

void expect_rows_near(const Tensor& full, const Tensor& part, int64_t t0, double tol) {
  const int64_t B = full.dim(0), T = full.dim(1), F = full.dim(2), t = part.dim(1);
  double worst = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < t; ++i)
      for (int64_t f = 0; f < F; ++f) {
        worst = std::max(
            worst, std::fabs(static_cast<double>(full.data<float>()[(b * T + t0 + i) * F + f] -
                                                 part.data<float>()[(b * t + i) * F + f])));
      }
  EXPECT_LT(worst, tol) << "rows from " << t0;
}

TEST(AttentionCache, TokenByTokenEqualsOneCausalCall) {
  MultiHeadAttention mha(4, 8, {.value_dim = 6, .output_shape = 10, .seed = 31});
  const Tensor x = random_tensor(Shape{2, 9, 12}, 32);
  const Tensor full = mha(x, x, {.use_causal_mask = true});
  AttentionCache cache;
  for (int64_t t = 0; t < 9; ++t) {
    const Tensor y = mha.call_cached(steps(x, t, t + 1), cache);
    ASSERT_EQ(y.shape(), (Shape{2, 1, 10}));
    EXPECT_EQ(cache.length(), t + 1);
    expect_rows_near(full, y, t, 1e-5);
  }
  // A prompt in one piece, then single tokens, then a chunk.
  AttentionCache c2;
  expect_rows_near(full, mha.call_cached(steps(x, 0, 4), c2), 0, 1e-5);
  expect_rows_near(full, mha.call_cached(steps(x, 4, 5), c2), 4, 1e-5);
  expect_rows_near(full, mha.call_cached(steps(x, 5, 9), c2), 5, 1e-5);
  EXPECT_EQ(c2.keys.shape(), (Shape{2, 9, 4, 8}));
  EXPECT_EQ(c2.values.shape(), (Shape{2, 9, 4, 6}));
  // And the cache matters: a fresh cache for the second token is not the causal row.
  AttentionCache fresh;
  const Tensor alone = mha.call_cached(steps(x, 1, 2), fresh);
  EXPECT_GT(std::fabs(alone.data<float>()[0] - full.data<float>()[1 * 10]), 1e-4);
  c2.clear();
  EXPECT_EQ(c2.length(), 0);
}

TEST(AttentionCache, RejectsInputsThatDoNotFit) {
  MultiHeadAttention mha(2, 4, {.seed = 33, .name = "att"});
  AttentionCache cache;
  mha.call_cached(random_tensor(Shape{1, 3, 8}, 34), cache);
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        mha.call_cached(random_tensor(Shape{2, 1, 8}, 35), cache);
      },
      {"MultiHeadAttention 'att': the cache holds a batch of 1"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        mha.call_cached(random_tensor(Shape{1, 1, 5}, 36), cache);
      },
      {"MultiHeadAttention 'att': built for query, value and key features 8"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        mha.call_cached(Tensor(Shape{1, 0, 8}), cache);
      },
      {"call_cached expects"});
}

}  // namespace
}  // namespace dtrain::nn
