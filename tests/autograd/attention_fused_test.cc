// The fused attention op against the unfused chain it replaces (multihead_scores →
// masked_softmax → multihead_combine), forward and gradients, for causal, key padding and
// causal + padding masks on shapes that leave partial blocks (odd T, T past one block of 48
// queries and keys, key_dim not a multiple of 8); finite-difference gradient checks; and
// errors for masks the kernel cannot serve.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dtrain/autograd/attention.h"
#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"

namespace dtrain {
namespace {

using testutil::expect_throws_with;
using testutil::gradcheck;
using testutil::random_tensor;
using Inputs = std::vector<Tensor>;

enum class Masks { kNone, kCausal, kPadding, kCausalPadding };

bool causal_of(Masks m) { return m == Masks::kCausal || m == Masks::kCausalPadding; }
bool padded(Masks m) { return m == Masks::kPadding || m == Masks::kCausalPadding; }

// A key padding mask [B, S]: batch row b keeps its first S − 3·b − 1 keys (row 0 loses one, so
// the last key is masked; every row keeps key 0, so every query sees a key).
Tensor padding_mask(int64_t batch, int64_t s) {
  Tensor m = Tensor::zeros(Shape{batch, s});
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < std::max<int64_t>(1, s - 3 * b - 1); ++j)
      m.data<float>()[b * s + j] = 1;
  }
  return m;
}

// The unfused chain, with the key mask broadcast as [B, 1, 1, S].
Tensor unfused(const Inputs& x, const Tensor& mask, float scale, bool causal) {
  const Tensor m = mask.defined() ? mask.reshape(Shape{mask.dim(0), 1, 1, mask.dim(1)}) : mask;
  const Tensor p =
      masked_softmax(multihead_scores(x[0], x[1]), m, {.scale = scale, .causal = causal});
  return multihead_combine(p, x[2]);
}

// Output and the gradients of Σ out ⊙ r with respect to query, key and value.
Inputs value_and_gradients(const std::function<Tensor(const Inputs&)>& f, Inputs x) {
  GradientTape tape;
  for (auto& t : x) tape.watch(t);
  const Tensor out = f(x);
  const Tensor r = random_tensor(out.shape(), 99, 0.5f, 1.5f);
  const Tensor loss = reduce_sum(multiply(out, r));
  Inputs g = tape.gradient(loss, x);
  g.insert(g.begin(), out);
  return g;
}

void compare(int64_t batch, int64_t t, int64_t s, int64_t heads, int64_t h, int64_t hv,
             Masks masks) {
  SCOPED_TRACE(testing::Message() << "B " << batch << " T " << t << " S " << s << " N " << heads
                                  << " H " << h << " Hv " << hv << " masks "
                                  << static_cast<int>(masks));
  const uint64_t seed = static_cast<uint64_t>(t * 1000 + s * 10 + h);
  const Inputs x = {random_tensor(Shape{batch, t, heads, h}, seed, -2, 2),
                    random_tensor(Shape{batch, s, heads, h}, seed + 1, -2, 2),
                    random_tensor(Shape{batch, s, heads, hv}, seed + 2)};
  const Tensor mask = padded(masks) ? padding_mask(batch, s) : Tensor();
  const float scale = 1.0f / std::sqrt(static_cast<float>(h));
  const bool causal = causal_of(masks);
  const Inputs want =
      value_and_gradients([&](const Inputs& v) { return unfused(v, mask, scale, causal); }, x);
  const Inputs got = value_and_gradients(
      [&](const Inputs& v) {
        return fused_attention(v[0], v[1], v[2], mask, {.scale = scale, .causal = causal});
      },
      x);
  const char* names[] = {"output", "d query", "d key", "d value"};
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(got[i].shape(), want[i].shape()) << names[i];
    for (int64_t e = 0; e < got[i].num_elements(); ++e) {
      const float w = want[i].data<float>()[e];
      ASSERT_NEAR(got[i].data<float>()[e], w, 2e-5 * (1 + std::fabs(w)))
          << names[i] << " element " << e;
    }
  }
}

TEST(FusedAttention, EqualsTheUnfusedChainForEveryMask) {
  for (Masks m : {Masks::kNone, Masks::kCausal, Masks::kPadding, Masks::kCausalPadding}) {
    compare(2, 13, 13, 2, 12, 5, m);     // one partial block; key_dim 12, value_dim 5
    compare(2, 53, 53, 3, 20, 20, m);    // odd T, two blocks (of 48), the second partial
    compare(1, 97, 97, 2, 9, 16, m);     // three key blocks: the online rescaling
    compare(3, 130, 130, 1, 32, 32, m);  // several blocks of both; the benchmark's head size
    compare(1, 1, 1, 1, 3, 3, m);        // a single position
  }
  // Cross attention (T ≠ S): a query past the keys sees all of them when causal.
  for (Masks m : {Masks::kNone, Masks::kPadding, Masks::kCausal}) {
    compare(2, 9, 100, 2, 7, 4, m);
    compare(2, 100, 9, 2, 7, 4, m);
  }
}

TEST(FusedAttention, Gradients) {
  for (Masks m : {Masks::kNone, Masks::kCausal, Masks::kPadding, Masks::kCausalPadding}) {
    for (int64_t t : {7, 67}) {
      SCOPED_TRACE(testing::Message() << "T " << t << " masks " << static_cast<int>(m));
      const int64_t batch = t > 10 ? 1 : 2;
      const Tensor q = random_tensor(Shape{batch, t, 2, 3}, 201 + t);
      const Tensor k = random_tensor(Shape{batch, t, 2, 3}, 202 + t);
      const Tensor v = random_tensor(Shape{batch, t, 2, 5}, 203 + t);
      const Tensor mask = padded(m) ? padding_mask(batch, t) : Tensor();
      const FusedAttentionOptions o{.scale = 0.7f, .causal = causal_of(m)};
      EXPECT_LT(
          gradcheck([&](const Inputs& x) { return fused_attention(x[0], x[1], x[2], mask, o); },
                    {q, k, v}),
          2e-2);
    }
  }
}

TEST(FusedAttention, RejectsMasksItCannotServe) {
  const Tensor q = random_tensor(Shape{2, 4, 1, 3}, 1);
  const Tensor v = random_tensor(Shape{2, 4, 1, 3}, 2);
  // Batch row 1 masks key 0: its first query sees no key under a causal mask.
  Tensor mask = Tensor::ones(Shape{2, 4});
  mask.data<float>()[4] = 0;
  EXPECT_NO_THROW(fused_attention(q, q, v, mask, {.causal = false}));
  expect_throws_with<InvalidArgumentError>(
      [&] { fused_attention(q, q, v, mask, {.causal = true}); },
      {"fused_attention", "sees no unmasked key"});
  // Without the causal mask, a batch row with every key masked.
  Tensor all = Tensor::ones(Shape{2, 4});
  for (int j = 0; j < 4; ++j) all.data<float>()[j] = 0;
  expect_throws_with<InvalidArgumentError>([&] { fused_attention(q, q, v, all); },
                                           {"fused_attention", "sees no unmasked key"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        fused_attention(q, q, v, Tensor::ones(Shape{2, 5}));
      },
      {"fused_attention", "key_mask [2, 5]", "[2, 4]"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        fused_attention(q, random_tensor(Shape{2, 4, 1, 2}, 3), v);
      },
      {"fused_attention", "[2, 4, 1, 2]"});
}

}  // namespace
}  // namespace dtrain
