// The fused optimizer kernels against straightforward double-precision loops, on lengths that
// exercise the vector body and the scalar tail, with guard elements that must stay untouched.
#include "dtrain/ops/optimizer_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "dtrain/core/random.h"

namespace dtrain::ops {
namespace {

constexpr float kGuard = 12345.0f;
constexpr int kPad = 8;

// n values plus kPad guard elements after them.
struct Array {
  std::vector<float> data;
  Array(int64_t n, Philox& rng, float lo, float hi) : data(n + kPad, kGuard) {
    for (int64_t i = 0; i < n; ++i) data[i] = lo + (hi - lo) * rng.uniform();
  }
  float* p() { return data.data(); }
  void expect_guards(int64_t n) const {
    for (int i = 0; i < kPad; ++i) EXPECT_EQ(data[n + i], kGuard) << "wrote past n = " << n;
  }
};

void expect_near_all(const Array& got, const std::vector<double>& want, const char* what) {
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got.data[i], want[i], 1e-6 * std::abs(want[i]) + 1e-7) << what << "[" << i << "]";
  }
}

std::vector<double> to_double(const Array& a, int64_t n) {
  return std::vector<double>(a.data.begin(), a.data.begin() + n);
}

class KernelTest : public ::testing::TestWithParam<int64_t> {
 protected:
  int64_t n() const { return GetParam(); }
  Philox rng_{7};
};

TEST_P(KernelTest, WeightDecayAndSgd) {
  Array var(n(), rng_, -1, 1), g(n(), rng_, -1, 1);
  std::vector<double> want = to_double(var, n());
  for (int64_t i = 0; i < n(); ++i) want[i] = (want[i] - want[i] * 0.01) - 0.1 * g.data[i];
  weight_decay_update(var.p(), n(), 0.01f);
  sgd_update(var.p(), g.p(), n(), 0.1f);
  expect_near_all(var, want, "var");
  var.expect_guards(n());
}

TEST_P(KernelTest, SgdMomentumAndNesterov) {
  for (bool nesterov : {false, true}) {
    Array var(n(), rng_, -1, 1), m(n(), rng_, -1, 1), g(n(), rng_, -1, 1);
    std::vector<double> wv = to_double(var, n()), wm = to_double(m, n());
    for (int64_t i = 0; i < n(); ++i) {
      wm[i] = 0.9 * wm[i] - 0.05 * g.data[i];
      wv[i] += nesterov ? 0.9 * wm[i] - 0.05 * g.data[i] : wm[i];
    }
    if (nesterov) {
      sgd_nesterov_update(var.p(), m.p(), g.p(), n(), 0.05f, 0.9f);
    } else {
      sgd_momentum_update(var.p(), m.p(), g.p(), n(), 0.05f, 0.9f);
    }
    expect_near_all(var, wv, "var");
    expect_near_all(m, wm, "m");
    var.expect_guards(n());
    m.expect_guards(n());
  }
}

TEST_P(KernelTest, AdamAndAmsgrad) {
  for (bool amsgrad : {false, true}) {
    Array var(n(), rng_, -1, 1), m(n(), rng_, -0.1f, 0.1f), v(n(), rng_, 0, 0.01f),
        vhat(n(), rng_, 0, 0.02f), g(n(), rng_, -1, 1);
    std::vector<double> wv = to_double(var, n()), wm = to_double(m, n()), wvv = to_double(v, n()),
                        wh = to_double(vhat, n());
    const double lr_t = 0.003, b1 = 0.9, b2 = 0.999, eps = 1e-7, wd_lr = 1e-4;
    for (int64_t i = 0; i < n(); ++i) {
      const double gi = g.data[i];
      wm[i] += (gi - wm[i]) * (1 - b1);
      wvv[i] += (gi * gi - wvv[i]) * (1 - b2);
      wh[i] = std::max(wh[i], wvv[i]);
      wv[i] -= wv[i] * wd_lr;
      wv[i] -= lr_t * wm[i] / (std::sqrt(amsgrad ? wh[i] : wvv[i]) + eps);
    }
    if (amsgrad) {
      adam_amsgrad_update(var.p(), m.p(), v.p(), vhat.p(), g.p(), n(), lr_t, 1 - b1, 1 - b2, eps,
                          wd_lr);
      expect_near_all(vhat, wh, "vhat");
    } else {
      adam_update(var.p(), m.p(), v.p(), g.p(), n(), lr_t, 1 - b1, 1 - b2, eps, wd_lr);
    }
    expect_near_all(var, wv, "var");
    expect_near_all(m, wm, "m");
    expect_near_all(v, wvv, "v");
    for (const Array* a : {&var, &m, &v, &vhat}) a->expect_guards(n());
  }
}

TEST_P(KernelTest, RmspropVariants) {
  for (bool centered : {false, true}) {
    for (bool momentum : {false, true}) {
      Array var(n(), rng_, -1, 1), v(n(), rng_, 0.5f, 1), mom(n(), rng_, -0.1f, 0.1f),
          a(n(), rng_, -0.1f, 0.1f), g(n(), rng_, -1, 1);
      std::vector<double> wv = to_double(var, n()), wvv = to_double(v, n()),
                          wmom = to_double(mom, n()), wa = to_double(a, n());
      const double lr = 0.01, rho = 0.9, mu = 0.5, eps = 1e-7;
      for (int64_t i = 0; i < n(); ++i) {
        const double gi = g.data[i];
        wvv[i] = rho * wvv[i] + (1 - rho) * gi * gi;
        double d = wvv[i] + eps;
        if (centered) {
          wa[i] = rho * wa[i] + (1 - rho) * gi;
          d = wvv[i] - wa[i] * wa[i] + eps;
        }
        const double inc = gi * lr / std::sqrt(d);
        if (momentum) {
          wmom[i] = mu * wmom[i] + inc;
          wv[i] -= wmom[i];
        } else {
          wv[i] -= inc;
        }
      }
      const std::vector<float> mom_before = mom.data, a_before = a.data;
      rmsprop_update(var.p(), v.p(), momentum ? mom.p() : nullptr, centered ? a.p() : nullptr,
                     g.p(), n(), lr, rho, 1 - rho, mu, eps);
      expect_near_all(var, wv, "var");
      expect_near_all(v, wvv, "velocity");
      if (momentum) {
        expect_near_all(mom, wmom, "momentum");
      } else {
        EXPECT_EQ(mom.data, mom_before) << "momentum slot touched without momentum";
      }
      if (centered) {
        expect_near_all(a, wa, "average_gradient");
      } else {
        EXPECT_EQ(a.data, a_before) << "average_gradient touched when not centered";
      }
      for (const Array* x : {&var, &v, &mom, &a}) x->expect_guards(n());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Lengths, KernelTest, ::testing::Values(0, 1, 7, 16, 33, 1003));

}  // namespace
}  // namespace dtrain::ops
