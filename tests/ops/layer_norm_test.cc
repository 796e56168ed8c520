// Layer norm's forward and backward kernels against a double-precision reference, for row lengths
// around the 8-lane sums' width (d = 1 … 130: no full group, exact groups, groups plus a tail),
// with and without γ/β; then the same bits for one thread and two.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "dtrain/core/random.h"
#include "dtrain/ops/gemm.h"
#include "dtrain/ops/normalization.h"

namespace dtrain::ops {
namespace {

constexpr float kEpsilon = 1e-3f;

struct Outputs {
  std::vector<float> y, stats, dx, dgamma, dbeta;
};

struct Inputs {
  int64_t rows, d;
  std::vector<float> x, dy, gamma, beta;
};

Inputs make_inputs(int64_t rows, int64_t d) {
  Philox rng(static_cast<uint64_t>(rows * 1009 + d));
  Inputs in{rows,
            d,
            std::vector<float>(rows * d),
            std::vector<float>(rows * d),
            std::vector<float>(d),
            std::vector<float>(d)};
  for (float& v : in.x) v = 1.0f + 2.0f * (rng.uniform() - 0.5f);
  for (float& v : in.dy) v = rng.uniform() - 0.5f;
  for (float& v : in.gamma) v = 0.5f + rng.uniform();
  for (float& v : in.beta) v = rng.uniform() - 0.5f;
  return in;
}

Outputs run(const Inputs& in, bool affine) {
  const int64_t n = in.rows * in.d;
  Outputs out{std::vector<float>(n), std::vector<float>(2 * in.rows), std::vector<float>(n),
              std::vector<float>(in.d), std::vector<float>(in.d)};
  const float* gamma = affine ? in.gamma.data() : nullptr;
  layer_norm_forward(in.x.data(), in.rows, in.d, gamma, affine ? in.beta.data() : nullptr, kEpsilon,
                     out.y.data(), out.stats.data());
  layer_norm_backward(in.dy.data(), in.x.data(), in.rows, in.d, out.stats.data(), gamma,
                      out.dx.data(), out.dgamma.data(), out.dbeta.data());
  return out;
}

// |got − want| within a few float roundings of the magnitudes involved.
void expect_near(const char* what, int64_t at, double got, double want, double scale) {
  EXPECT_LE(std::fabs(got - want), 1e-5 * (std::fabs(want) + scale))
      << what << "[" << at << "] = " << got << ", want " << want;
}

TEST(LayerNormKernels, MatchADoubleReference) {
  for (const int64_t d : {1, 3, 7, 8, 9, 16, 23, 127, 128, 130}) {
    for (const bool affine : {false, true}) {
      SCOPED_TRACE(testing::Message() << "d " << d << " affine " << affine);
      const Inputs in = make_inputs(5, d);
      const Outputs got = run(in, affine);
      std::vector<double> dgamma(d, 0.0), dbeta(d, 0.0);
      for (int64_t r = 0; r < in.rows; ++r) {
        const float* x = in.x.data() + r * d;
        const float* dy = in.dy.data() + r * d;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < d; ++j) mean += x[j];
        mean /= static_cast<double>(d);
        for (int64_t j = 0; j < d; ++j) var += (x[j] - mean) * (x[j] - mean);
        var /= static_cast<double>(d);
        const double inv = 1.0 / std::sqrt(var + kEpsilon);
        expect_near("mean", r, got.stats[2 * r], mean, 1.0);
        expect_near("inv_std", r, got.stats[2 * r + 1], inv, 1.0);
        std::vector<double> xh(d), gh(d);
        double s1 = 0, s2 = 0;
        for (int64_t j = 0; j < d; ++j) {
          xh[j] = (x[j] - mean) * inv;
          const double g = affine ? in.gamma[j] : 1.0, b = affine ? in.beta[j] : 0.0;
          expect_near("y", r * d + j, got.y[r * d + j], xh[j] * g + b, 1.0);
          gh[j] = dy[j] * g;
          s1 += gh[j];
          s2 += gh[j] * xh[j];
          dgamma[j] += dy[j] * xh[j];
          dbeta[j] += dy[j];
        }
        for (int64_t j = 0; j < d; ++j) {
          const double want = inv * (gh[j] - s1 / d - xh[j] * s2 / d);
          expect_near("dx", r * d + j, got.dx[r * d + j], want, inv);
        }
      }
      for (int64_t j = 0; j < d; ++j) {
        expect_near("dgamma", j, got.dgamma[j], dgamma[j], 1.0);
        expect_near("dbeta", j, got.dbeta[j], dbeta[j], 1.0);
      }
    }
  }
}

TEST(LayerNormKernels, SameBitsForOneThreadAndTwo) {
  for (const int64_t d : {7, 128, 130}) {
    const Inputs in = make_inputs(300, d);
    set_num_threads(1);
    const Outputs one = run(in, true);
    set_num_threads(2);
    const Outputs two = run(in, true);
    set_num_threads(1);
    EXPECT_EQ(one.y, two.y) << "d " << d;
    EXPECT_EQ(one.stats, two.stats) << "d " << d;
    EXPECT_EQ(one.dx, two.dx) << "d " << d;
    EXPECT_EQ(one.dgamma, two.dgamma) << "d " << d;
    EXPECT_EQ(one.dbeta, two.dbeta) << "d " << d;
  }
}

}  // namespace
}  // namespace dtrain::ops
