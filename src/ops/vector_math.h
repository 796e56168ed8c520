// Branch-free float exp and erf that GCC vectorizes in plain loops (no libm calls, no
// -ffast-math): whatever ISA the build targets (SSE2, AVX2, AVX-512) runs them 4-16 lanes at a
// time. Accuracy: exp within 2 ulp and erf within about 2 ulp of glibc's expf/erff over the
// float range (tests/ops/vector_math_test.cc checks both). Private to src/ops.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace dtrain::ops::vmath {

// a·b + c: one rounding where the target has FMA, two otherwise (std::fma would be a slow libm
// call without the instruction).
inline float mul_add(float a, float b, float c) {
#if defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

namespace detail {

inline constexpr float kExpMax = 88.7228317f;   // ln(FLT_MAX)
inline constexpr float kExpMin = -87.3365479f;  // ln(FLT_MIN)

// eˣ = p·2ⁿ for x in [ln(FLT_MIN), ln(FLT_MAX)]: the Cody–Waite reduction x = n·ln2 + r
// (|r| ≤ ln2/2) and a degree-6 polynomial for eʳ; returns p, and n (an integer) in `n`.
inline float exp_reduced(float x, float& n) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi exact in 9 bits
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5·2²³: adding it rounds to an integer
  n = (x * kLog2e + kRound) - kRound;
  const float r = mul_add(n, -kLn2Lo, mul_add(n, -kLn2Hi, x));
  // Minimax coefficients for eʳ on [−ln2/2, ln2/2] (Cephes expf).
  float p = 1.9875691500e-4f;
  p = mul_add(p, r, 1.3981999507e-3f);
  p = mul_add(p, r, 8.3334519073e-3f);
  p = mul_add(p, r, 4.1665795894e-2f);
  p = mul_add(p, r, 1.6666665459e-1f);
  p = mul_add(p, r, 5.0000001201e-1f);
  return mul_add(p * r, r, r) + 1.0f;
}

}  // namespace detail

// eˣ: detail::exp_reduced, then 2ⁿ through the exponent bits. Underflows to exactly 0 below
// ln(FLT_MIN) (where expf would return a subnormal; dtrain flushes those anyway), overflows to
// +inf above ln(FLT_MAX), NaN propagates.
inline float exp(float x) {
  using detail::kExpMax, detail::kExpMin;
  float xc = x > kExpMax ? kExpMax : x;  // (ternaries, not fmin/fmax: those do not vectorize)
  xc = xc < kExpMin ? kExpMin : xc;
  float n;
  const float p = detail::exp_reduced(xc, n);
  // 2ⁿ as two normal factors (n reaches 128 at the top of the range, -126 at the bottom).
  const int32_t k = static_cast<int32_t>(n);
  const int32_t k1 = k >> 1;
  float y = p * std::bit_cast<float>((k1 + 127) << 23) * std::bit_cast<float>((k - k1 + 127) << 23);
  y = x < kExpMin ? 0.0f : y;
  y = x > kExpMax ? INFINITY : y;
  return x != x ? x : y;
}

// exp(x) for x ≤ 0 (and NaN), bit for bit: the same reduction, polynomial and underflow to 0,
// without what only a positive argument needs (the overflow clamp and +inf, and 2ⁿ split in two
// factors for n = 128: here n ≥ −126, one normal factor). erf's tail and GELU's φ(x) only ever
// take such arguments: 40% off the exact GELU's forward pass (session 18). A positive x is
// outside its domain.
inline float exp_nonpositive(float x) {
  using detail::kExpMin;
  float n;
  const float p = detail::exp_reduced(x < kExpMin ? kExpMin : x, n);
  const float y = p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return x < kExpMin ? 0.0f : y;  // NaN propagates through p
}

// erf(x). Two minimax approximations (N. Juffa's erff): an odd polynomial for |x| < 0.9277
// and 1 − exp(polynomial in |x|) beyond, both evaluated and one selected so that the loop stays
// branch-free.
inline float erf(float a) {
  const float t = std::fabs(a);
  const float s = a * a;
  // |a| ≥ 0.927734375
  float r = mul_add(-1.72853470e-5f, t, 3.83197126e-4f);
  const float u = mul_add(-3.88396438e-3f, t, 2.42546219e-2f);
  r = mul_add(r, s, u);
  r = mul_add(r, t, -1.06777877e-1f);
  r = mul_add(r, t, -6.34846687e-1f);
  r = mul_add(r, t, -1.28717512e-1f);
  r = mul_add(r, t, -t);
  const float big = std::copysign(1.0f - exp_nonpositive(r), a);  // r < 0 (−inf for |a| = inf)
  // |a| < 0.927734375
  float q = -5.96761703e-4f;
  q = mul_add(q, s, 4.99119423e-3f);
  q = mul_add(q, s, -2.67681349e-2f);
  q = mul_add(q, s, 1.12819925e-1f);
  q = mul_add(q, s, -3.76125336e-1f);
  q = mul_add(q, s, 1.28379166e-1f);
  const float small = mul_add(q, a, a);
  return t > 0.927734375f ? big : small;
}

// y[i] = e^(y[i] − shift) for i < n; returns Σ y[i] in double (four partial sums, so the sum
// vectorizes too; the order is fixed, so the result is deterministic).
inline double exp_shifted_sum(float* y, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) y[i] = exp(y[i] - shift);
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) acc[j] += y[i + j];
  }
  double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; i < n; ++i) sum += y[i];
  return sum;
}

// Σ a[i]·b[i] for i < n in double, four partial sums.
inline double dot(const float* a, const float* b, int64_t n) {
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) acc[j] += static_cast<double>(a[i + j]) * b[i + j];
  }
  double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

}  // namespace dtrain::ops::vmath
