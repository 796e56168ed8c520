// The convolution and pooling kernels against direct (seven-loop) references, TF's SAME padding
// split, determinism, FTZ and the no-allocation steady state.
#include "dtrain/ops/convolution.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dtrain/core/float_env.h"
#include "dtrain/core/random.h"
#include "dtrain/ops/pooling.h"
#include "testutil/count_new.h"
#include "testutil/expect_throws.h"
#include "testutil/random_tensor.h"

namespace dtrain::ops {
namespace {

using testutil::random_tensor;

struct Ref {
  int64_t pt, pl, oh, ow;
};

Ref ref_geometry(const Shape& x, const Shape& w, const Conv2DAttrs& a) {
  const Padding ph = a.padding == Padding::kCausal ? Padding::kValid : a.padding;
  Ref r{};
  r.oh = conv_output_size(x[1], w[0], a.strides[0], a.dilation[0], ph);
  r.ow = conv_output_size(x[2], w[1], a.strides[1], a.dilation[1], a.padding);
  r.pt = conv_pad_before(x[1], w[0], a.strides[0], a.dilation[0], ph);
  r.pl = conv_pad_before(x[2], w[1], a.strides[1], a.dilation[1], a.padding);
  return r;
}

// y[n, oy, ox, o] = Σ_{i, j, ci} x[n, oy·s − pt + i·d, ox·s − pl + j·d, g·cg + ci] w[i, j, ci, o]
// in double precision.
std::vector<double> reference_conv(const Tensor& x, const Tensor& w, const Conv2DAttrs& a) {
  const Ref r = ref_geometry(x.shape(), w.shape(), a);
  const int64_t n = x.dim(0), h = x.dim(1), wd = x.dim(2), c = x.dim(3);
  const int64_t kh = w.dim(0), kw = w.dim(1), cg = w.dim(2), o = w.dim(3), og = o / a.groups;
  std::vector<double> y(static_cast<size_t>(n * r.oh * r.ow * o), 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oy = 0; oy < r.oh; ++oy)
      for (int64_t ox = 0; ox < r.ow; ++ox)
        for (int64_t oc = 0; oc < o; ++oc) {
          double s = 0;
          const int64_t g = oc / og;
          for (int64_t i = 0; i < kh; ++i)
            for (int64_t j = 0; j < kw; ++j)
              for (int64_t ci = 0; ci < cg; ++ci) {
                const int64_t iy = oy * a.strides[0] - r.pt + i * a.dilation[0];
                const int64_t ix = ox * a.strides[1] - r.pl + j * a.dilation[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                s += static_cast<double>(
                         x.data<float>()[((b * h + iy) * wd + ix) * c + g * cg + ci]) *
                     w.data<float>()[((i * kw + j) * cg + ci) * o + oc];
              }
          y[static_cast<size_t>(((b * r.oh + oy) * r.ow + ox) * o + oc)] = s;
        }
  return y;
}

void expect_close(const Tensor& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(static_cast<size_t>(got.num_elements()), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got.data<float>()[i], want[i], 1e-4 * std::max(1.0, std::fabs(want[i])))
        << what << " element " << i;
  }
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    s += static_cast<double>(a.data<float>()[i]) * b.data<float>()[i];
  }
  return s;
}

struct Case {
  Shape x, w;
  Conv2DAttrs a;
};

const Case kCases[] = {
    {{2, 7, 6, 3}, {3, 3, 3, 4}, {.padding = Padding::kValid}},
    {{2, 7, 6, 3}, {3, 3, 3, 4}, {.padding = Padding::kSame}},
    {{1, 8, 7, 2}, {2, 2, 2, 3}, {.strides = {2, 2}, .padding = Padding::kSame}},
    {{1, 8, 7, 2}, {4, 3, 2, 3}, {.strides = {3, 2}, .padding = Padding::kSame}},
    {{2, 9, 9, 2}, {3, 2, 2, 2}, {.dilation = {2, 3}, .padding = Padding::kValid}},
    {{2, 9, 9, 2}, {3, 3, 2, 2}, {.dilation = {2, 2}, .padding = Padding::kSame}},
    {{2, 5, 5, 6}, {3, 3, 2, 9}, {.strides = {1, 2}, .padding = Padding::kSame, .groups = 3}},
    {{2, 5, 5, 4}, {1, 1, 4, 5}, {.padding = Padding::kValid}},  // the 1×1 shortcut
    {{2, 1, 9, 2}, {1, 3, 2, 2}, {.dilation = {1, 2}, .padding = Padding::kCausal}},
};

TEST(Conv2DKernel, ForwardMatchesDirectReference) {
  int seed = 1;
  for (const Case& c : kCases) {
    const Tensor x = random_tensor(c.x, seed++);
    const Tensor w = random_tensor(c.w, seed++);
    expect_close(conv2d(x, w, Tensor(), c.a), reference_conv(x, w, c.a), "conv2d");
  }
}

TEST(Conv2DKernel, BiasIsAddedPerFilter) {
  const Case& c = kCases[1];
  const Tensor x = random_tensor(c.x, 5), w = random_tensor(c.w, 6);
  const Tensor b = random_tensor(Shape{c.w[3]}, 7);
  const Tensor with = conv2d(x, w, b, c.a), without = conv2d(x, w, Tensor(), c.a);
  for (int64_t i = 0; i < with.num_elements(); ++i) {
    EXPECT_NEAR(with.data<float>()[i], without.data<float>()[i] + b.data<float>()[i % c.w[3]],
                1e-5);
  }
}

// <conv(x, w), dy> = <x, backward_input(dy)> = <w, backward_filter(x, dy)>: the backward
// kernels are the adjoints of the forward one.
TEST(Conv2DKernel, BackwardKernelsAreAdjoints) {
  int seed = 100;
  for (const Case& c : kCases) {
    const Tensor x = random_tensor(c.x, seed++);
    const Tensor w = random_tensor(c.w, seed++);
    const Tensor y = conv2d(x, w, Tensor(), c.a);
    const Tensor dy = random_tensor(y.shape(), seed++);
    const double lhs = dot(y, dy);
    const double via_x = dot(x, conv2d_backward_input(dy, w, x.shape(), c.a));
    const double via_w = dot(w, conv2d_backward_filter(x, dy, w.shape(), c.a));
    EXPECT_NEAR(via_x, lhs, 1e-4 * std::max(1.0, std::fabs(lhs)));
    EXPECT_NEAR(via_w, lhs, 1e-4 * std::max(1.0, std::fabs(lhs)));
  }
}

TEST(Conv2DKernel, SamePaddingPutsTheExtraRowBottomRight) {
  // in 4, kernel 2, stride 1: total padding 1, all of it after (TF), so output 0 sees x[0..1].
  EXPECT_EQ(conv_pad_before(4, 2, 1, 1, Padding::kSame), 0);
  EXPECT_EQ(conv_pad_before(5, 3, 1, 1, Padding::kSame), 1);
  EXPECT_EQ(conv_pad_before(7, 4, 3, 1, Padding::kSame), 1);  // out 3, total 3: 1 before, 2 after
  EXPECT_EQ(conv_output_size(7, 4, 3, 1, Padding::kSame), 3);
  EXPECT_EQ(conv_output_size(7, 3, 2, 2, Padding::kValid), 2);
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4}, Shape{1, 1, 4, 1});
  const Tensor w = Tensor::from_vector<float>({1, 10}, Shape{1, 2, 1, 1});
  const Tensor y = conv2d(x, w, Tensor(), {.padding = Padding::kSame});
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{21, 32, 43, 4}));
}

TEST(Conv2DKernel, DeterministicRunToRun) {
  const Case& c = kCases[5];
  const Tensor x = random_tensor(c.x, 11), w = random_tensor(c.w, 12);
  const Tensor y1 = conv2d(x, w, Tensor(), c.a), y2 = conv2d(x, w, Tensor(), c.a);
  EXPECT_TRUE(y1.equals(y2));
  const Tensor dy = random_tensor(y1.shape(), 13);
  EXPECT_TRUE(conv2d_backward_input(dy, w, x.shape(), c.a)
                  .equals(conv2d_backward_input(dy, w, x.shape(), c.a)));
  EXPECT_TRUE(conv2d_backward_filter(x, dy, w.shape(), c.a)
                  .equals(conv2d_backward_filter(x, dy, w.shape(), c.a)));
}

TEST(Conv2DKernel, SubnormalInputsFlushUnderFtz) {
  ScopedFlushDenormals ftz(true);
  Tensor x = random_tensor(Shape{1, 5, 5, 2}, 21);
  Tensor x_zeroed = x.clone();
  for (int64_t i = 0; i < x.num_elements(); i += 3) {
    x.data<float>()[i] = std::numeric_limits<float>::denorm_min() * 7;
    x_zeroed.data<float>()[i] = 0.0f;
  }
  const Tensor w = random_tensor(Shape{3, 3, 2, 2}, 22);
  const Conv2DAttrs a{.padding = Padding::kSame};
  EXPECT_TRUE(conv2d(x, w, Tensor(), a).equals(conv2d(x_zeroed, w, Tensor(), a)));
  const Pool2DAttrs p{.padding = Padding::kSame};
  EXPECT_TRUE(pool2d(PoolKind::kAverage, x, p).equals(pool2d(PoolKind::kAverage, x_zeroed, p)));
}

// The im2col backend touches no heap at all once warm; oneDNN's execute() allocates a small
// argument map per call (convolution_onednn_test checks that nothing accumulates).
TEST(Conv2DKernel, SteadyStateAllocatesNoHeap) {
  set_conv_backend(ConvBackend::kIm2col);
  const Case& c = kCases[2];
  const Tensor x = random_tensor(c.x, 31), w = random_tensor(c.w, 32);
  const Tensor b = random_tensor(Shape{c.w[3]}, 33);
  auto step = [&] {
    const Tensor y = conv2d(x, w, b, c.a);
    (void)conv2d_backward_input(y, w, x.shape(), c.a);
    (void)conv2d_backward_filter(x, y, w.shape(), c.a);
  };
  step();  // grows the workspace and fills the allocator's cache
  const long news0 = testutil::new_calls();
  const uint64_t system0 = allocator_stats().system_allocations;
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(testutil::new_calls() - news0, 0);
  EXPECT_EQ(allocator_stats().system_allocations - system0, 0u);
  set_conv_backend(ConvBackend::kOnednn);
}

TEST(Conv2DKernel, BadInputsNameTheProblem) {
  const Tensor x = random_tensor(Shape{1, 4, 4, 3}, 41);
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        conv2d(x, random_tensor(Shape{5, 5, 3, 2}, 1), Tensor(), {});
      },
      {"larger than the input"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        conv2d(x, random_tensor(Shape{3, 3, 2, 2}, 1), Tensor(), {});
      },
      {"3 channels"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        conv2d(x, random_tensor(Shape{3, 3, 1, 2}, 1), Tensor(), {.groups = 2});
      },
      {"does not divide"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        conv2d(random_tensor(Shape{4, 4, 3}, 1), random_tensor(Shape{3, 3, 3, 2}, 1), Tensor(), {});
      },
      {"expected input [batch, height, width, channels]"});
  testutil::expect_throws_with<InvalidArgumentError>([&] { padding_from_name("full", "here"); },
                                                     {"unknown padding 'full'"});
}

TEST(PoolKernel, MaxAndAverageWithTfSamePadding) {
  // 1×3×3×1: 1..9. 2×2 stride 2 same → out 2×2, windows clipped at the bottom/right edges.
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, Shape{1, 3, 3, 1});
  const Pool2DAttrs same{.padding = Padding::kSame};
  EXPECT_EQ(pool2d(PoolKind::kMax, x, same).to_vector<float>(), (std::vector<float>{5, 6, 8, 9}));
  // Averages over the valid elements only: (1+2+4+5)/4, (3+6)/2, (7+8)/2, 9.
  EXPECT_EQ(pool2d(PoolKind::kAverage, x, same).to_vector<float>(),
            (std::vector<float>{3, 4.5f, 7.5f, 9}));
  const Pool2DAttrs valid{};
  EXPECT_EQ(pool2d(PoolKind::kMax, x, valid).to_vector<float>(), (std::vector<float>{5}));
  const Tensor dx = pool2d_backward(PoolKind::kMax, x, Tensor::ones(Shape{1, 2, 2, 1}), same);
  EXPECT_EQ(dx.to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 1, 1, 0, 1, 1}));
  const Tensor da = pool2d_backward(PoolKind::kAverage, x, Tensor::ones(Shape{1, 2, 2, 1}), same);
  EXPECT_EQ(da.to_vector<float>(),
            (std::vector<float>{0.25f, 0.25f, 0.5f, 0.25f, 0.25f, 0.5f, 0.5f, 0.5f, 1}));
  testutil::expect_throws_with<InvalidArgumentError>(
      [&] {
        pool2d(PoolKind::kMax, x, {.pool = {4, 4}, .strides = {1, 1}});
      },
      {"larger than"});
}

// dx of max pooling by the per-channel scan in row-major window order (the first maximum of
// each window; a NaN is never "greater", so a window whose first value is NaN sends it there).
std::vector<double> reference_max_pool_backward(const Tensor& x, const Tensor& dy,
                                                const Pool2DAttrs& a) {
  std::vector<double> want(static_cast<size_t>(x.num_elements()), 0.0);
  const int64_t h = x.dim(1), w = x.dim(2), c = x.dim(3), oh = dy.dim(1), ow = dy.dim(2);
  const int64_t ph = a.pool[0], pw = a.pool[1], sh = a.strides[0], sw = a.strides[1];
  const int64_t pt = conv_pad_before(h, ph, sh, 1, a.padding);
  const int64_t pl = conv_pad_before(w, pw, sw, 1, a.padding);
  for (int64_t n = 0; n < x.dim(0); ++n)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox)
        for (int64_t ch = 0; ch < c; ++ch) {
          int64_t best = -1;
          for (int64_t iy = std::max<int64_t>(oy * sh - pt, 0); iy < std::min(oy * sh - pt + ph, h);
               ++iy)
            for (int64_t ix = std::max<int64_t>(ox * sw - pl, 0);
                 ix < std::min(ox * sw - pl + pw, w); ++ix) {
              const int64_t at = ((n * h + iy) * w + ix) * c + ch;
              if (best < 0 || x.data<float>()[at] > x.data<float>()[best]) best = at;
            }
          want[static_cast<size_t>(best)] += dy.data<float>()[((n * oh + oy) * ow + ox) * c + ch];
        }
  return want;
}

// Max-pool backward over several channels, overlapping windows and ties (values drawn from a
// few levels): each window's gradient goes to the first maximum of its channel, as a
// per-channel scan in row-major window order finds it.
TEST(PoolKernel, MaxBackwardPicksTheFirstMaximumPerChannel) {
  Philox rng(77);
  Tensor x(Shape{2, 7, 6, 5});
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    x.data<float>()[i] = std::floor(rng.uniform(0.0f, 3.0f));
  }
  const Pool2DAttrs a{.pool = {3, 3}, .strides = {2, 2}, .padding = Padding::kSame};
  const Tensor y = pool2d(PoolKind::kMax, x, a);
  const Tensor dy = random_tensor(y.shape(), 78);
  const Tensor dx = pool2d_backward(PoolKind::kMax, x, dy, a);
  expect_close(dx, reference_max_pool_backward(x, dy, a), "max pool backward");
}

// Windows that tile the input (strides = pool size: the CNN's MaxPooling2D) take a one-pass
// path that writes dx without zero-filling it first. Same answer as the scan, exactly: ties,
// a NaN first in its window, more channels than one block (70), odd sizes whose last row and
// column no window covers (valid) or whose last windows are clipped (same), and a dx buffer
// that the allocator hands back dirty.
TEST(PoolKernel, MaxBackwardOverTilingWindowsMatchesTheScanExactly) {
  for (const Padding pad : {Padding::kValid, Padding::kSame}) {
    for (const Shape& shape : {Shape{2, 7, 5, 70}, Shape{3, 6, 9, 3}, Shape{1, 2, 2, 1}}) {
      Philox rng(91);
      Tensor x(shape);
      for (int64_t i = 0; i < x.num_elements(); ++i) {
        x.data<float>()[i] = std::floor(rng.uniform(-2.0f, 2.0f));
      }
      x.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
      x.data<float>()[x.num_elements() - 1] = -0.0f;
      const Pool2DAttrs a{.padding = pad};
      const Tensor y = pool2d(PoolKind::kMax, x, a);
      const Tensor dy = random_tensor(y.shape(), 92);
      { Tensor dirty = Tensor::full(shape, 7.0); }  // back in the allocator's free list
      const Tensor dx = pool2d_backward(PoolKind::kMax, x, dy, a);
      const std::vector<double> want = reference_max_pool_backward(x, dy, a);
      ASSERT_EQ(static_cast<size_t>(dx.num_elements()), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(dx.data<float>()[i], static_cast<float>(want[i]))
            << shape.to_string() << " " << padding_name(pad) << " element " << i;
      }
    }
  }
}

// The AVX2 2x2 kernels (channel counts that are multiples of 8, every window inside the input:
// the CNN's pools) against the scans, bit for bit, forward and backward: ties, NaNs (first in
// a window, and later in one, where the forward skips it), −0, uncovered last rows and columns.
TEST(PoolKernel, TwoByTwoMaxKernelsMatchTheScansExactly) {
  for (const Padding pad : {Padding::kValid, Padding::kSame}) {
    for (const Shape& shape :
         {Shape{2, 7, 5, 16}, Shape{2, 6, 4, 64}, Shape{3, 26, 26, 32}, Shape{2, 11, 11, 64}}) {
      Philox rng(93);
      Tensor x(shape);
      float* px = x.data<float>();
      for (int64_t i = 0; i < x.num_elements(); ++i) px[i] = std::floor(rng.uniform(-2.0f, 2.0f));
      const int64_t c = shape[3], row = shape[2] * c;
      px[0] = std::numeric_limits<float>::quiet_NaN();
      px[c + 1] = std::numeric_limits<float>::quiet_NaN();  // second position of window 0
      px[row + 2] = -0.0f;
      px[x.num_elements() - 1] = -0.0f;
      const Pool2DAttrs a{.padding = pad};
      const Tensor y = pool2d(PoolKind::kMax, x, a);
      const int64_t oh = y.dim(1), ow = y.dim(2);
      for (int64_t n = 0; n < shape[0]; ++n)
        for (int64_t oy = 0; oy < oh; ++oy)
          for (int64_t ox = 0; ox < ow; ++ox)
            for (int64_t ch = 0; ch < c; ++ch) {
              float m = -std::numeric_limits<float>::infinity();
              for (int64_t iy = 2 * oy; iy < std::min(2 * oy + 2, shape[1]); ++iy)
                for (int64_t ix = 2 * ox; ix < std::min(2 * ox + 2, shape[2]); ++ix)
                  m = std::max(m, px[((n * shape[1] + iy) * shape[2] + ix) * c + ch]);
              const float got = y.data<float>()[((n * oh + oy) * ow + ox) * c + ch];
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(m))
                  << shape.to_string() << " " << padding_name(pad) << " forward " << n << "," << oy
                  << "," << ox << "," << ch;
            }
      Tensor dy = random_tensor(y.shape(), 94);
      dy.data<float>()[1] = -0.0f;
      { Tensor dirty = Tensor::full(shape, 7.0); }  // back in the allocator's free list
      const Tensor dx = pool2d_backward(PoolKind::kMax, x, dy, a);
      const std::vector<double> want = reference_max_pool_backward(x, dy, a);
      ASSERT_EQ(static_cast<size_t>(dx.num_elements()), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(dx.data<float>()[i]),
                  std::bit_cast<uint32_t>(static_cast<float>(want[i])))
            << shape.to_string() << " " << padding_name(pad) << " element " << i;
      }
    }
  }
}

TEST(PoolKernel, GlobalPools) {
  const Tensor x = Tensor::from_vector<float>({1, -1, 3, -5, 2, 0, 4, 8}, Shape{1, 2, 2, 2});
  EXPECT_EQ(global_pool(PoolKind::kMax, x).to_vector<float>(), (std::vector<float>{4, 8}));
  EXPECT_EQ(global_pool(PoolKind::kAverage, x).to_vector<float>(),
            (std::vector<float>{2.5f, 0.5f}));
  const Tensor dx = global_pool_backward(PoolKind::kMax, x, Tensor::ones(Shape{1, 2}));
  EXPECT_EQ(dx.to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 0, 0, 1, 1}));
}

TEST(ChannelsFirst, TransposesBothWays) {
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, Shape{1, 2, 3});  // [n, c, l]
  const Tensor last = to_channels_last(x);
  EXPECT_EQ(last.shape(), (Shape{1, 3, 2}));
  EXPECT_EQ(last.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_TRUE(to_channels_first(last).equals(x));
}

}  // namespace
}  // namespace dtrain::ops
