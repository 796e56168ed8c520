// The Winograd F(4x4, 3x3) convolutions against a double-precision direct convolution and
// against the direct float kernels (oneDNN, im2col), in all three directions: the error stays
// within a small multiple of the direct kernels' own rounding; which shapes take Winograd;
// bitwise equal results for 1, 2 and 3 threads; and a warm step with no tensor buffer taken
// from the system.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "dtrain/core/random.h"
#include "dtrain/ops/convolution.h"
#include "dtrain/ops/gemm.h"
#include "testutil/count_new.h"
#include "testutil/random_tensor.h"

namespace dtrain::ops {
namespace {

using testutil::random_tensor;

struct Case {
  Shape x, w;
  Padding padding;
};

// Shapes Winograd takes: the CNN's conv2, "same" padding, sizes that are not multiples of the
// 4x4 output tile (partial tiles at the bottom and right), outputs smaller than one tile, more
// tiles than one work chunk, and channel counts in 8-float steps.
const Case kCases[] = {
    {{4, 13, 13, 32}, {3, 3, 32, 64}, Padding::kValid},  // the CNN's conv2
    {{2, 9, 7, 16}, {3, 3, 16, 24}, Padding::kSame},
    {{3, 5, 6, 24}, {3, 3, 24, 16}, Padding::kValid},  // 3x4 output: one partial tile per image
    {{1, 3, 3, 16}, {3, 3, 16, 16}, Padding::kValid},  // 1x1 output
    {{2, 17, 10, 16}, {3, 3, 16, 32}, Padding::kSame},
};

// y, dx, dw of the convolution in double precision (HWIO kernel, NHWC).
struct Reference {
  std::vector<double> y, dx, dw;
};

Reference reference(const Tensor& x, const Tensor& w, const Tensor& dy, Padding p) {
  const int64_t n = x.dim(0), h = x.dim(1), wd = x.dim(2), c = x.dim(3), o = w.dim(3);
  const int64_t oh = dy.dim(1), ow = dy.dim(2);
  const int64_t pt = conv_pad_before(h, 3, 1, 1, p), pl = conv_pad_before(wd, 3, 1, 1, p);
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* pdy = dy.data<float>();
  Reference r;
  r.y.assign(static_cast<size_t>(n * oh * ow * o), 0.0);
  r.dx.assign(static_cast<size_t>(x.num_elements()), 0.0);
  r.dw.assign(static_cast<size_t>(w.num_elements()), 0.0);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        for (int64_t i = 0; i < 3; ++i) {
          for (int64_t j = 0; j < 3; ++j) {
            const int64_t iy = oy + i - pt, ix = ox + j - pl;
            if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
            for (int64_t ci = 0; ci < c; ++ci) {
              const int64_t xi = ((b * h + iy) * wd + ix) * c + ci;
              for (int64_t co = 0; co < o; ++co) {
                const int64_t yi = ((b * oh + oy) * ow + ox) * o + co;
                const int64_t wi = ((i * 3 + j) * c + ci) * o + co;
                r.y[static_cast<size_t>(yi)] += double{px[xi]} * pw[wi];
                r.dx[static_cast<size_t>(xi)] += double{pdy[yi]} * pw[wi];
                r.dw[static_cast<size_t>(wi)] += double{pdy[yi]} * px[xi];
              }
            }
          }
        }
      }
    }
  }
  return r;
}

// max |got − want| / max |want|.
double relative_error(const Tensor& got, const std::vector<double>& want) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(double{got.data<float>()[i]} - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return err / std::max(scale, 1e-30);
}

struct Results {
  Tensor y, dx, dw;
};

Results run(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2DAttrs& a) {
  return Results{conv2d(x, w, Tensor(), a), conv2d_backward_input(dy, w, x.shape(), a),
                 conv2d_backward_filter(x, dy, w.shape(), a)};
}

class WinogradTest : public ::testing::Test {
 protected:
  void TearDown() override {
    set_conv_algo(ConvAlgo::kAuto);
    set_conv_backend(ConvBackend::kOnednn);
    set_num_threads(1);
  }
};

// Winograd's transforms scale values by up to ~100 (Bᵀ's and Aᵀ's entries 4, 5, 8 in both
// dimensions) before they cancel, so its rounding error is larger than the direct sum's: measured
// here at most ~2e-6 of the largest output against ~3e-7 for oneDNN (printed below). The bound,
// 2e-5 of the largest value, is ten times the worst measured and still four orders of magnitude
// under the size of a wrong tap or a dropped tile (which gives errors of order 1e-1).
constexpr double kTolerance = 2e-5;

TEST_F(WinogradTest, MatchesTheDirectConvolutionInEveryDirection) {
  uint64_t seed = 1;
  for (size_t k = 0; k < std::size(kCases); ++k) {
    const Case& c = kCases[k];
    const Conv2DAttrs a{.padding = c.padding};
    const Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++);
    set_conv_algo(ConvAlgo::kDirect);
    const Tensor dy = random_tensor(conv2d(x, w, Tensor(), a).shape(), seed++);
    const Results d = run(x, w, dy, a);
    set_conv_algo(ConvAlgo::kAuto);
    const int64_t calls0 = winograd_conv_calls();
    const Results wg = run(x, w, dy, a);
    EXPECT_EQ(winograd_conv_calls() - calls0, 3) << "case " << k;
    const Reference r = reference(x, w, dy, c.padding);
    const double ey = relative_error(wg.y, r.y), edx = relative_error(wg.dx, r.dx),
                 edw = relative_error(wg.dw, r.dw);
    std::printf(
        "case %zu: max relative error vs double, winograd / direct: y %.2e / %.2e, dx %.2e / "
        "%.2e, dw %.2e / %.2e\n",
        k, ey, relative_error(d.y, r.y), edx, relative_error(d.dx, r.dx), edw,
        relative_error(d.dw, r.dw));
    EXPECT_LT(ey, kTolerance) << "case " << k;
    EXPECT_LT(edx, kTolerance) << "case " << k;
    EXPECT_LT(edw, kTolerance) << "case " << k;
  }
}

TEST_F(WinogradTest, AddsTheBias) {
  const Case& c = kCases[1];
  const Conv2DAttrs a{.padding = c.padding};
  const Tensor x = random_tensor(c.x, 5), w = random_tensor(c.w, 6);
  const Tensor b = random_tensor(Shape{c.w[3]}, 7);
  const Tensor with = conv2d(x, w, b, a), without = conv2d(x, w, Tensor(), a);
  const int64_t o = c.w[3];
  for (int64_t i = 0; i < with.num_elements(); ++i) {
    ASSERT_FLOAT_EQ(with.data<float>()[i], without.data<float>()[i] + b.data<float>()[i % o]);
  }
}

TEST_F(WinogradTest, TakesOnlyItsShapesAndCanBeTurnedOff) {
  const auto calls = [](const Shape& xs, const Shape& ws, const Conv2DAttrs& a) {
    const int64_t calls0 = winograd_conv_calls();
    const Tensor x = random_tensor(xs, 1), w = random_tensor(ws, 2);
    const Tensor y = conv2d(x, w, Tensor(), a);
    (void)conv2d_backward_input(y, w, xs, a);
    (void)conv2d_backward_filter(x, y, ws, a);
    return winograd_conv_calls() - calls0;
  };
  const Shape x{2, 9, 9, 16};
  EXPECT_EQ(calls(x, {3, 3, 16, 16}, {}), 3);
  EXPECT_EQ(calls(x, {3, 3, 16, 16}, {.strides = {2, 2}}), 0);
  EXPECT_EQ(calls(x, {3, 3, 16, 16}, {.dilation = {2, 2}}), 0);
  EXPECT_EQ(calls(x, {3, 3, 8, 16}, {.groups = 2}), 0);
  EXPECT_EQ(calls(x, {5, 5, 16, 16}, {}), 0);
  EXPECT_EQ(calls({2, 9, 9, 1}, {3, 3, 1, 32}, {}), 0);  // the CNN's conv1
  EXPECT_EQ(calls({2, 9, 9, 8}, {3, 3, 8, 16}, {}), 0);
  EXPECT_EQ(calls({2, 9, 9, 20}, {3, 3, 20, 16}, {}), 0);
  set_conv_algo(ConvAlgo::kDirect);
  EXPECT_EQ(calls(x, {3, 3, 16, 16}, {}), 0);
}

TEST_F(WinogradTest, BitwiseIndependentOfTheThreadCount) {
  for (size_t k : {size_t{0}, size_t{4}}) {
    const Case& c = kCases[k];
    const Conv2DAttrs a{.padding = c.padding};
    const Tensor x = random_tensor(c.x, 21), w = random_tensor(c.w, 22);
    set_num_threads(1);
    const Tensor dy = random_tensor(conv2d(x, w, Tensor(), a).shape(), 23);
    const Results one = run(x, w, dy, a);
    for (int threads : {2, 3}) {
      set_num_threads(threads);
      const Results many = run(x, w, dy, a);
      EXPECT_TRUE(many.y.equals(one.y)) << "case " << k << " threads " << threads;
      EXPECT_TRUE(many.dx.equals(one.dx)) << "case " << k << " threads " << threads;
      EXPECT_TRUE(many.dw.equals(one.dw)) << "case " << k << " threads " << threads;
    }
  }
}

// A long reduction: backward-weights sums over 8,192 tiles in 76 passes (a pass holds ~512 KiB
// of transformed data: 108 tiles at 16 + 16 channels); the passes' sums add up (a dropped pass
// gives an error of order 1e-2, a dropped tile's contribution ~1e-3).
TEST_F(WinogradTest, BackwardWeightsOverSeveralPasses) {
  const Shape xs{128, 30, 30, 16}, ws{3, 3, 16, 16};
  const Conv2DAttrs a{.padding = Padding::kSame};
  const Tensor x = random_tensor(xs, 41), w = random_tensor(ws, 42);
  const Tensor dy = random_tensor(xs, 43);
  const Tensor wg = conv2d_backward_filter(x, dy, ws, a);
  set_conv_algo(ConvAlgo::kDirect);
  const Tensor direct = conv2d_backward_filter(x, dy, ws, a);
  const Reference r = reference(x, w, dy, a.padding);
  const double e = relative_error(wg, r.dw), ed = relative_error(direct, r.dw);
  std::printf("backward weights, 128x30x30x16: max relative error winograd %.2e, direct %.2e\n", e,
              ed);
  // Over 8,192 tiles (57,600 products per weight) the float sums' own rounding grows for every
  // kernel (the direct one's error is printed beside): the bound follows it.
  EXPECT_LT(e, std::max(kTolerance, 4.0 * ed));
}

TEST_F(WinogradTest, WarmStepAllocatesNothing) {
  const Case& c = kCases[0];
  const Conv2DAttrs a{.padding = c.padding};
  const Tensor x = random_tensor(c.x, 31), w = random_tensor(c.w, 32);
  const Tensor b = random_tensor(Shape{c.w[3]}, 33);
  auto step = [&] {
    const Tensor y = conv2d(x, w, b, a);
    (void)conv2d_backward_input(y, w, x.shape(), a);
    (void)conv2d_backward_filter(x, y, w.shape(), a);
  };
  step();
  step();
  const uint64_t system0 = allocator_stats().system_allocations;
  const long news0 = testutil::new_calls();
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(testutil::new_calls() - news0, 0);
  EXPECT_EQ(allocator_stats().system_allocations - system0, 0u);
}

}  // namespace
}  // namespace dtrain::ops
