// The vectorized exp/erf behind GELU and the softmaxes (src/ops/vector_math.h), through the
// public kernels, against glibc's double-precision erf/exp: every float of a dense sweep and the
// special values (±0, ±inf, NaN, Keras's −1e9 mask score).
#include "ops/vector_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "dtrain/ops/activations.h"
#include "dtrain/ops/attention.h"

namespace dtrain::ops {
namespace {

// Distance in units in the last place between two floats (0 for two NaNs).
int64_t ulps(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return 0;
  if (a == b) return 0;
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  const int64_t oa = ia < 0 ? int64_t{INT32_MIN} - ia : ia;
  const int64_t ob = ib < 0 ? int64_t{INT32_MIN} - ib : ib;
  return oa > ob ? oa - ob : ob - oa;
}

// Every 997th float pattern with |x| < 12 (both signs, subnormals included).
std::vector<float> sweep() {
  std::vector<float> xs;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 997) {
    float f;
    const uint32_t bits = static_cast<uint32_t>(b);
    std::memcpy(&f, &bits, 4);
    if (std::isfinite(f) && std::fabs(f) < 12.0f) xs.push_back(f);
  }
  return xs;
}

TEST(VectorMath, GeluForwardMatchesTheExactForm) {
  std::vector<float> x = sweep();
  std::vector<float> y = x;
  activation_inplace(Activation::kGelu, y.data(), 1, static_cast<int64_t>(y.size()));
  int64_t worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double xd = x[i];
    const float want = static_cast<float>(0.5 * xd * (1.0 + std::erf(xd * M_SQRT1_2)));
    // Below ~−5 the product underflows through 1 + erf ≈ 0: compare absolutely there.
    if (std::fabs(want) < 1e-30f) {
      EXPECT_NEAR(y[i], want, 1e-30f) << "x = " << x[i];
      continue;
    }
    // The float formula's own rounding: 1 + erf cancels for x < 0, so the bound is two ulps of
    // the result plus one ulp of erf (near 1: 2⁻²⁴) scaled by 0.5·|x|, against std::erf.
    const float ref = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752440f));
    const double tol = 2.0 * std::fabs(std::nextafter(ref, 0.0f) - ref) +
                       std::fabs(x[i]) * 0.5 * std::ldexp(1.0, -23);
    ASSERT_NEAR(y[i], ref, tol) << "x = " << x[i];
    ASSERT_NEAR(y[i], want, 2 * tol + std::fabs(want) * 1e-7) << "x = " << x[i];
    worst = std::max(worst, ulps(y[i], ref));
  }
  EXPECT_GT(x.size(), 1000000u);
  RecordProperty("worst_ulps_vs_std_erf", static_cast<int>(worst));
}

TEST(VectorMath, GeluBackwardMatchesTheExactDerivative) {
  std::vector<float> x = sweep();
  std::vector<float> dz(x.size(), 1.0f);
  activation_backward_inplace(Activation::kGelu, nullptr, x.data(), dz.data(), 1,
                              static_cast<int64_t>(x.size()), 0.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    const double xd = x[i];
    const double want = 0.5 * (1.0 + std::erf(xd * M_SQRT1_2)) +
                        xd * std::exp(-0.5 * xd * xd) / std::sqrt(2 * M_PI);
    ASSERT_NEAR(dz[i], want, 4e-7 * std::max(1.0, std::fabs(want)) + 1e-30) << "x = " << x[i];
  }
}

// exp_nonpositive (erf's tail, GELU's φ) is exp bit for bit on its domain: every 31st negative
// float pattern (subnormals, the underflow to 0 below ln(FLT_MIN), −inf), ±0 and NaN, in blocks
// (the loops vectorize as the kernels' do).
TEST(VectorMath, ExpNonpositiveIsExpBitForBit) {
  constexpr size_t kBlock = 4096;
  std::vector<float> xs, want(kBlock), got(kBlock);
  int64_t bad = 0, checked = 0;
  const auto check = [&] {
    for (size_t i = 0; i < xs.size(); ++i) want[i] = vmath::exp(xs[i]);
    for (size_t i = 0; i < xs.size(); ++i) got[i] = vmath::exp_nonpositive(xs[i]);
    for (size_t i = 0; i < xs.size(); ++i, ++checked) {
      if (std::isnan(want[i]) && std::isnan(got[i])) continue;
      if (std::memcmp(&want[i], &got[i], 4) != 0 && bad++ < 5) {
        ADD_FAILURE() << "exp_nonpositive(" << xs[i] << ") = " << got[i] << ", exp gives "
                      << want[i];
      }
    }
    xs.clear();
  };
  xs = {0.0f,    -0.0f,        -std::numeric_limits<float>::infinity(), -87.3365479f, -87.34f,
        -1e-45f, std::nanf("")};
  check();
  for (uint64_t b = 0x80000000u; b <= 0xff800000u; b += 31) {
    float f;
    const uint32_t bits = static_cast<uint32_t>(b);
    std::memcpy(&f, &bits, 4);
    xs.push_back(f);
    if (xs.size() == kBlock) check();
  }
  check();
  EXPECT_EQ(bad, 0) << "of " << checked;
}

TEST(VectorMath, GeluSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> y = {0.0f, -0.0f, inf, -inf, std::nanf(""), 20.0f, -20.0f};
  activation_inplace(Activation::kGelu, y.data(), 1, static_cast<int64_t>(y.size()));
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], inf);
  EXPECT_TRUE(std::isnan(y[3]));  // −inf · (1 + erf(−inf)) = −inf · 0, as std::erf gives
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_EQ(y[5], 20.0f);
  EXPECT_EQ(y[6], -0.0f);
}

TEST(VectorMath, SoftmaxRowsWithinAFewUlps) {
  // Rows of 37 (a vector body and a tail) spanning the float exponent range of exp.
  constexpr int64_t kCols = 37;
  std::vector<float> x;
  for (int64_t r = 0; r < 4000; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      x.push_back(static_cast<float>(std::sin(r * 7.1 + c * 1.3) * (1 + r % 90)));
    }
  }
  const int64_t rows = static_cast<int64_t>(x.size()) / kCols;
  std::vector<float> y(x.size());
  softmax_rows(x.data(), y.data(), rows, kCols, false);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * kCols;
    double mx = xr[0], sum = 0;
    for (int64_t c = 0; c < kCols; ++c) mx = std::max<double>(mx, xr[c]);
    for (int64_t c = 0; c < kCols; ++c) sum += std::exp(static_cast<double>(xr[c]) - mx);
    for (int64_t c = 0; c < kCols; ++c) {
      // From the float difference x − max the kernel rounds to (as before), in double.
      const double want = std::exp(static_cast<double>(xr[c] - static_cast<float>(mx))) / sum;
      if (want < 1e-37) {
        ASSERT_NEAR(y[r * kCols + c], want, 2e-38) << r << "," << c;
      } else {
        ASSERT_LE(ulps(y[r * kCols + c], static_cast<float>(want)), 8) << r << "," << c;
      }
    }
  }
}

TEST(VectorMath, CausalMaskedSoftmaxEqualsTheExplicitMask) {
  // The causal fast path (masked keys unread) against the same mask given as a tensor, with
  // an extra selection mask that leaves some rows' visible keys all masked (the full pass).
  constexpr int64_t kB = 2, kT = 9;
  Tensor scores(Shape{kB, kT, kT});
  Tensor lower(Shape{kB, kT, kT});
  Tensor sel(Shape{kB, kT, kT});
  for (int64_t i = 0; i < scores.num_elements(); ++i) {
    const int64_t t = (i / kT) % kT, s = i % kT;
    scores.data<float>()[i] = static_cast<float>(std::cos(i * 0.37) * 3);
    const bool keep = (i / (kT * kT)) == 0 || s != 0 || t > 3;  // batch 1: rows 0-3 lose key 0
    sel.data<float>()[i] = keep ? 1.0f : 0.0f;
    lower.data<float>()[i] = (s <= t && keep) ? 1.0f : 0.0f;
  }
  const Tensor fast = masked_softmax(scores, sel, {.scale = 0.5f, .causal = true});
  const Tensor full = masked_softmax(scores, lower, {.scale = 0.5f});
  // Row 0 of batch 1 has its only visible key masked: every score of the row is then 1e9
  // down and the row is uniform (Keras's fully masked row), through the full pass.
  for (int64_t i = 0; i < fast.num_elements(); ++i) {
    const int64_t b = i / (kT * kT), t = (i / kT) % kT, s = i % kT;
    if (b == 1 && t == 0) {
      EXPECT_NEAR(fast.data<float>()[i], 1.0f / kT, 1e-6f) << i;
    } else {
      EXPECT_NEAR(fast.data<float>()[i], full.data<float>()[i], 1e-7f) << i;
      if (s > t) {
        EXPECT_EQ(fast.data<float>()[i], 0.0f) << i;
      }
    }
  }
}

}  // namespace
}  // namespace dtrain::ops
