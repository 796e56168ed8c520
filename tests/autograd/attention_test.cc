// The attention and embedding ops: values against naive loops, finite-difference gradients,
// and errors for bad shapes and ids.
#include "dtrain/autograd/attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include "dtrain/autograd/embedding.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"

namespace dtrain {
namespace {

using testutil::expect_throws_with;
using testutil::gradcheck;
using testutil::random_tensor;
using Inputs = std::vector<Tensor>;
constexpr double kTol = 2e-2;

// Σ_k a[b, i, k] b[b, k, j] by loops, for a [B, m, k], b [B, k, n].
Tensor naive_bmm(const Tensor& a, const Tensor& b) {
  const int64_t batch = a.dim(0), m = a.dim(1), k = a.dim(2), n = b.dim(2);
  Tensor out = Tensor::zeros(Shape{batch, m, n});
  for (int64_t x = 0; x < batch; ++x)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q) {
          s += a.data<float>()[(x * m + i) * k + q] * b.data<float>()[(x * k + q) * n + j];
        }
        out.data<float>()[(x * m + i) * n + j] = static_cast<float>(s);
      }
  return out;
}

void expect_near_all(const Tensor& a, const Tensor& b, double tol = 1e-5) {
  ASSERT_EQ(a.shape(), b.shape());
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    EXPECT_NEAR(a.data<float>()[i], b.data<float>()[i], tol) << "element " << i;
  }
}

TEST(BatchMatmul, MatchesLoopsAndBroadcastsARank2Operand) {
  const Tensor a = random_tensor(Shape{3, 2, 4}, 1);
  const Tensor b = random_tensor(Shape{3, 4, 5}, 2);
  expect_near_all(batch_matmul(a, b), naive_bmm(a, b));
  const Tensor w = random_tensor(Shape{4, 5}, 3);
  Tensor wb(Shape{3, 4, 5});
  for (int i = 0; i < 3; ++i) wb[i].copy_from(w);
  expect_near_all(batch_matmul(a, w), naive_bmm(a, wb));
}

TEST(BatchMatmul, GradientsForEveryTransposition) {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const Tensor a = random_tensor(ta ? Shape{2, 3, 4, 3} : Shape{2, 3, 3, 4}, 11);
      const Tensor b = random_tensor(tb ? Shape{2, 3, 5, 4} : Shape{2, 3, 4, 5}, 12);
      EXPECT_LT(
          gradcheck([&](const Inputs& v) { return batch_matmul(v[0], v[1], ta, tb); }, {a, b}),
          kTol)
          << "transpose_a=" << ta << " transpose_b=" << tb;
      // A shared rank-2 right operand: its gradient sums over the batch.
      const Tensor w = random_tensor(tb ? Shape{5, 4} : Shape{4, 5}, 13);
      EXPECT_LT(
          gradcheck([&](const Inputs& v) { return batch_matmul(v[0], v[1], ta, tb); }, {a, w}),
          kTol);
    }
  }
}

TEST(BatchMatmul, RejectsMismatchedShapes) {
  expect_throws_with<InvalidArgumentError>(
      [] {
        batch_matmul(Tensor(Shape{2, 3, 4}), Tensor(Shape{2, 5, 6}));
      },
      {"batch_matmul", "[2, 3, 4]", "[2, 5, 6]"});
  expect_throws_with<InvalidArgumentError>(
      [] {
        batch_matmul(Tensor(Shape{2, 3, 4}), Tensor(Shape{3, 4, 6}));
      },
      {"batch shapes"});
}

TEST(MaskedSoftmax, MatchesKerasAddingMinusOneBillion) {
  const Tensor x = random_tensor(Shape{2, 3, 4}, 21);
  const Tensor mask = Tensor::from_vector<float>({1, 1, 0, 1, 0, 1, 1, 1, 0, 0, 0, 0}, Shape{3, 4});
  const float scale = 0.5f;
  const Tensor y = masked_softmax(x, mask, {.scale = scale});
  for (int64_t r = 0; r < 6; ++r) {
    // In float32, as Keras computes: s − 1e9 rounds to −1e9 for small s.
    float z[4];
    double sum = 0, mx = -1e30;
    for (int s = 0; s < 4; ++s) {
      z[s] = x.data<float>()[r * 4 + s] * scale;
      if (mask.data<float>()[(r % 3) * 4 + s] == 0) z[s] += -1e9f;
      mx = std::max(mx, static_cast<double>(z[s]));
    }
    for (int s = 0; s < 4; ++s) sum += std::exp(z[s] - mx);
    for (int s = 0; s < 4; ++s) {
      EXPECT_NEAR(y.data<float>()[r * 4 + s], std::exp(z[s] - mx) / sum, 1e-6) << r << "," << s;
    }
  }
  // The row with every key masked is uniform, as in Keras.
  for (int s = 0; s < 4; ++s) EXPECT_NEAR(y.data<float>()[2 * 4 + s], 0.25, 1e-2);
}

TEST(MaskedSoftmax, CausalMasksLaterKeysWithoutAMaskTensor) {
  const Tensor x = random_tensor(Shape{2, 4, 4}, 22);
  Tensor tril(Shape{4, 4});
  for (int t = 0; t < 4; ++t)
    for (int s = 0; s < 4; ++s) tril.data<float>()[t * 4 + s] = s <= t ? 1.0f : 0.0f;
  expect_near_all(masked_softmax(x, Tensor(), {.causal = true}), masked_softmax(x, tril), 1e-7);
  // Causal and an explicit mask combine (both must allow a position).
  const Tensor pad = Tensor::from_vector<float>({1, 1, 1, 0}, Shape{1, 1, 4});
  const Tensor y = masked_softmax(x, pad, {.causal = true});
  EXPECT_EQ(y.data<float>()[3 * 4 + 3], 0.0f);
  EXPECT_EQ(y.data<float>()[1 * 4 + 2], 0.0f);
  EXPECT_GT(y.data<float>()[3 * 4 + 2], 0.0f);
}

TEST(MaskedSoftmax, BoolAndIntegerMasksSelect) {
  const Tensor x = random_tensor(Shape{2, 3}, 23);
  Tensor b(DType::kBool, Shape{2, 3});
  const uint8_t bits[6] = {1, 0, 1, 0, 1, 1};
  std::memcpy(b.raw_data(), bits, 6);
  const Tensor i = Tensor::from_vector<int32_t>({1, 0, 1, 0, 1, 1}, Shape{2, 3});
  const Tensor f = Tensor::from_vector<float>({1, 0, 1, 0, 1, 1}, Shape{2, 3});
  expect_near_all(masked_softmax(x, b), masked_softmax(x, f), 0);
  expect_near_all(masked_softmax(x, i), masked_softmax(x, f), 0);
}

TEST(MaskedSoftmax, Gradients) {
  const Tensor x = random_tensor(Shape{2, 2, 3, 5}, 31, -2, 2);
  const Tensor mask = Tensor::from_vector<float>({1, 0, 1, 1, 1, 1, 1, 1, 0, 1}, Shape{2, 1, 1, 5});
  const Tensor additive = random_tensor(Shape{3, 5}, 32);
  EXPECT_LT(gradcheck([](const Inputs& v) { return masked_softmax(v[0]); }, {x}), kTol);
  EXPECT_LT(
      gradcheck([&](const Inputs& v) { return masked_softmax(v[0], mask, {.scale = 0.7f}); }, {x}),
      kTol);
  EXPECT_LT(
      gradcheck([](const Inputs& v) { return masked_softmax(v[0], {}, {.causal = true}); }, {x}),
      kTol);
  EXPECT_LT(gradcheck(
                [&](const Inputs& v) {
                  return masked_softmax(v[0], additive, {.scale = 2.0f, .additive = true});
                },
                {x}),
            kTol);
}

TEST(MaskedSoftmax, RejectsAMaskThatDoesNotBroadcast) {
  expect_throws_with<InvalidArgumentError>(
      [] {
        masked_softmax(Tensor::zeros(Shape{2, 3, 4}), Tensor::ones(Shape{3, 5}));
      },
      {"mask [3, 5]", "[2, 3, 4]"});
  expect_throws_with<InvalidArgumentError>(
      [] {
        masked_softmax(Tensor::zeros(Shape{3, 4}), Tensor::ones(Shape{2, 3, 4}));
      },
      {"more dimensions"});
}

TEST(MultiheadProducts, MatchExplicitLoops) {
  const int64_t B = 2, T = 3, S = 4, N = 2, H = 3;
  const Tensor q = random_tensor(Shape{B, T, N, H}, 41);
  const Tensor k = random_tensor(Shape{B, S, N, H}, 42);
  const Tensor scores = multihead_scores(q, k);
  ASSERT_EQ(scores.shape(), (Shape{B, N, T, S}));
  auto at = [](const Tensor& x, std::initializer_list<int64_t> idx) {
    int64_t off = 0, d = 0;
    for (int64_t i : idx) off = off * x.dim(static_cast<int>(d++)) + i;
    return x.data<float>()[off];
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < S; ++s) {
          double e = 0;
          for (int64_t h = 0; h < H; ++h) e += at(q, {b, t, n, h}) * at(k, {b, s, n, h});
          EXPECT_NEAR(at(scores, {b, n, t, s}), e, 1e-5);
        }
  const Tensor v = random_tensor(Shape{B, S, N, 5}, 43);
  const Tensor out = multihead_combine(scores, v);
  ASSERT_EQ(out.shape(), (Shape{B, T, N, 5}));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < 5; ++h) {
          double e = 0;
          for (int64_t s = 0; s < S; ++s) e += at(scores, {b, n, t, s}) * at(v, {b, s, n, h});
          EXPECT_NEAR(at(out, {b, t, n, h}), e, 1e-5);
        }
}

TEST(MultiheadProducts, Gradients) {
  const Tensor q = random_tensor(Shape{2, 3, 2, 3}, 51);
  const Tensor k = random_tensor(Shape{2, 4, 2, 3}, 52);
  const Tensor p = random_tensor(Shape{2, 2, 3, 4}, 53);
  const Tensor v = random_tensor(Shape{2, 4, 2, 5}, 54);
  EXPECT_LT(gradcheck([](const Inputs& x) { return multihead_scores(x[0], x[1]); }, {q, k}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& x) { return multihead_combine(x[0], x[1]); }, {p, v}), kTol);
}

// The causal products (small_gemm on the lower triangle) against the full products with the
// upper triangle zeroed, and through a causal softmax against the unskipped path; T = 13 and
// H = 20 leave partial row blocks and column chunks.
TEST(MultiheadProducts, CausalEqualsTheFullProductsOnTheLowerTriangle) {
  const int64_t B = 2, T = 13, N = 2, H = 20;
  const Tensor q = random_tensor(Shape{B, T, N, H}, 71);
  const Tensor k = random_tensor(Shape{B, T, N, H}, 72);
  const Tensor v = random_tensor(Shape{B, T, N, 7}, 73);
  const Tensor full = multihead_scores(q, k);
  const Tensor causal = multihead_scores(q, k, true);
  Tensor lower = full.clone();
  for (int64_t i = 0; i < lower.num_elements(); ++i) {
    if (i % T > (i / T) % T) lower.data<float>()[i] = 0.0f;
  }
  for (int64_t i = 0; i < lower.num_elements(); ++i) {
    ASSERT_NEAR(causal.data<float>()[i], lower.data<float>()[i], 1e-5) << i;
  }
  const Tensor out_full = multihead_combine(lower, v);
  const Tensor out_causal = multihead_combine(lower, v, true);
  for (int64_t i = 0; i < out_full.num_elements(); ++i) {
    ASSERT_NEAR(out_causal.data<float>()[i], out_full.data<float>()[i], 1e-5) << i;
  }
  // The causal combine does not read above the diagonal.
  Tensor poisoned = lower.clone();
  for (int64_t i = 0; i < poisoned.num_elements(); ++i) {
    if (i % T > (i / T) % T) poisoned.data<float>()[i] = std::nanf("");
  }
  const Tensor out_poisoned = multihead_combine(poisoned, v, true);
  for (int64_t i = 0; i < out_full.num_elements(); ++i) {
    ASSERT_EQ(out_poisoned.data<float>()[i], out_causal.data<float>()[i]) << i;
  }
}

TEST(MultiheadProducts, CausalGradients) {
  const Tensor q = random_tensor(Shape{2, 7, 2, 3}, 81);
  const Tensor k = random_tensor(Shape{2, 7, 2, 3}, 82);
  const Tensor v = random_tensor(Shape{2, 7, 2, 5}, 84);
  EXPECT_LT(gradcheck([](const Inputs& x) { return multihead_scores(x[0], x[1], true); }, {q, k}),
            kTol);
  // The products through a causal softmax, as MultiHeadAttention chains them, against the
  // same chain without the causal products.
  auto chain = [](bool causal_products) {
    return [causal_products](const Inputs& x) {
      const Tensor p = masked_softmax(multihead_scores(x[0], x[1], causal_products), Tensor(),
                                      {.scale = 0.5f, .causal = true});
      return multihead_combine(p, x[2], causal_products);
    };
  };
  EXPECT_LT(gradcheck(chain(true), {q, k, v}), kTol);
  const Tensor a = chain(true)({q, k, v});
  const Tensor b = chain(false)({q, k, v});
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    ASSERT_NEAR(a.data<float>()[i], b.data<float>()[i], 1e-5) << i;
  }
}

TEST(MultiheadProducts, CausalNeedsASquareProduct) {
  expect_throws_with<InvalidArgumentError>(
      [] {
        multihead_scores(Tensor::zeros(Shape{1, 3, 2, 4}), Tensor::zeros(Shape{1, 5, 2, 4}), true);
      },
      {"causal", "3 queries and 5 keys"});
}

TEST(EmbeddingLookup, GathersRowsAndScattersGradients) {
  const Tensor table = random_tensor(Shape{6, 3}, 61);
  const Tensor ids = Tensor::from_vector<int32_t>({5, 0, 2, 2, 5, 1}, Shape{2, 3});
  const Tensor out = embedding_lookup(table, ids);
  ASSERT_EQ(out.shape(), (Shape{2, 3, 3}));
  for (int64_t p = 0; p < 6; ++p)
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(out.data<float>()[p * 3 + j], table.data<float>()[ids.data<int32_t>()[p] * 3 + j]);
    }
  // Float ids (what Keras casts) give the same rows.
  const Tensor fids = Tensor::from_vector<float>({5, 0, 2, 2, 5, 1}, Shape{2, 3});
  EXPECT_TRUE(embedding_lookup(table, fids).equals(out));
  EXPECT_LT(gradcheck([&](const Inputs& x) { return embedding_lookup(x[0], ids); }, {table}), kTol);
  // Untouched rows (3, 4) get exactly zero.
  Tensor t = table.clone();
  GradientTape tape;
  tape.watch(t);
  const Tensor g = tape.gradient(reduce_sum(embedding_lookup(t, ids)), t);
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_EQ(g.data<float>()[3 * 3 + j], 0.0f);
    EXPECT_EQ(g.data<float>()[4 * 3 + j], 0.0f);
    EXPECT_EQ(g.data<float>()[2 * 3 + j], 2.0f);  // id 2 appears twice
  }
}

TEST(EmbeddingLookup, NamesTheCallerPositionAndIdOutOfRange) {
  const Tensor table = Tensor::zeros(Shape{4, 2});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        embedding_lookup(table, Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 0}, Shape{2, 3}),
                         "Embedding 'tok'");
      },
      {"Embedding 'tok'", "id 4", "position [1, 1]", "[0, 4)"});
  expect_throws_with<InvalidArgumentError>(
      [&] { embedding_lookup(table, Tensor::from_vector<int32_t>({-1}, Shape{1})); },
      {"id -1", "position [0]"});
  expect_throws_with<InvalidArgumentError>(
      [&] { embedding_lookup(table, Tensor::from_vector<float>({1.5f}, Shape{1})); },
      {"id 1.5", "not an integer"});
}

}  // namespace
}  // namespace dtrain
