// The oneDNN convolution backend against the im2col + OpenBLAS one, in one process: the same
// results within float tolerance over strides, padding, dilation, groups and 1×1 kernels, bit
// for bit run to run (one and two threads), and a warm step that takes no tensor buffer from the
// system and no growing number of small heap blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

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
  Conv2DAttrs a;
};

const Case kCases[] = {
    {{2, 7, 6, 3}, {3, 3, 3, 4}, {.padding = Padding::kValid}},
    {{2, 7, 6, 3}, {3, 3, 3, 4}, {.padding = Padding::kSame}},
    {{1, 8, 7, 2}, {2, 2, 2, 3}, {.strides = {2, 2}, .padding = Padding::kSame}},
    {{1, 8, 7, 2}, {4, 3, 2, 3}, {.strides = {3, 2}, .padding = Padding::kSame}},
    {{1, 9, 8, 2}, {3, 3, 2, 3}, {.strides = {2, 3}, .padding = Padding::kValid}},
    {{2, 9, 9, 2}, {3, 2, 2, 2}, {.dilation = {2, 3}, .padding = Padding::kValid}},
    {{2, 9, 9, 2}, {3, 3, 2, 2}, {.dilation = {2, 2}, .padding = Padding::kSame}},
    {{2, 5, 5, 6}, {3, 3, 2, 9}, {.strides = {1, 2}, .padding = Padding::kSame, .groups = 3}},
    {{2, 6, 6, 4}, {3, 3, 1, 8}, {.padding = Padding::kSame, .groups = 4}},  // depthwise ×2
    {{2, 5, 5, 4}, {1, 1, 4, 5}, {.padding = Padding::kValid}},
    {{2, 1, 9, 2}, {1, 3, 2, 2}, {.dilation = {1, 2}, .padding = Padding::kCausal}},
    {{2, 9, 8, 1}, {3, 3, 1, 5}, {.strides = {2, 2}, .padding = Padding::kSame}},
    {{2, 9, 9, 1}, {3, 2, 1, 4}, {.dilation = {2, 2}, .padding = Padding::kSame}},
    {{4, 28, 28, 1}, {3, 3, 1, 32}, {.padding = Padding::kValid}},    // the CNN's conv1
    {{4, 13, 13, 32}, {3, 3, 32, 64}, {.padding = Padding::kValid}},  // and conv2
    // Channel counts in whole 8-float blocks: forward and backward-weights on oneDNN's blocked
    // activations with reorders (strides, padding, dilation, and a 1x1 kernel).
    {{2, 9, 8, 8}, {3, 3, 8, 16}, {.strides = {2, 2}, .padding = Padding::kSame}},
    {{2, 9, 9, 16}, {3, 3, 16, 8}, {.dilation = {2, 2}, .padding = Padding::kSame}},
    {{2, 5, 4, 24}, {1, 1, 24, 8}, {.padding = Padding::kValid}},
};

void expect_close(const Tensor& got, const Tensor& want, const char* what, size_t index) {
  ASSERT_EQ(got.shape(), want.shape()) << what << " case " << index;
  float scale = 1.0f;
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    scale = std::max(scale, std::fabs(want.data<float>()[i]));
  }
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5f * scale)
        << what << " case " << index << " element " << i;
  }
}

// The direct kernels only: Winograd (conv_algo) would take the 3x3 shapes with whole 8-float
// channel blocks (tests/ops/winograd_test.cc).
class ConvBackendTest : public ::testing::Test {
 protected:
  void SetUp() override { set_conv_algo(ConvAlgo::kDirect); }
  void TearDown() override {
    set_conv_algo(ConvAlgo::kAuto);
    set_conv_backend(ConvBackend::kOnednn);
    set_num_threads(1);
  }
};

TEST_F(ConvBackendTest, OnednnMatchesIm2col) {
  uint64_t seed = 1;
  for (size_t k = 0; k < std::size(kCases); ++k) {
    const Case& c = kCases[k];
    const Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++);
    const Tensor b = random_tensor(Shape{c.w[3]}, seed++);
    set_conv_backend(ConvBackend::kIm2col);
    const Tensor y_ref = conv2d(x, w, b, c.a);
    const Tensor dy = random_tensor(y_ref.shape(), seed++);
    const Tensor dx_ref = conv2d_backward_input(dy, w, x.shape(), c.a);
    const Tensor dw_ref = conv2d_backward_filter(x, dy, w.shape(), c.a);
    set_conv_backend(ConvBackend::kOnednn);
    const int64_t runs0 = fast_conv_calls();
    expect_close(conv2d(x, w, b, c.a), y_ref, "forward", k);
    expect_close(conv2d_backward_input(dy, w, x.shape(), c.a), dx_ref, "backward_input", k);
    expect_close(conv2d_backward_filter(x, dy, w.shape(), c.a), dw_ref, "backward_filter", k);
    EXPECT_EQ(fast_conv_calls() - runs0, 3) << "oneDNN did not take case " << k;
  }
}

TEST_F(ConvBackendTest, Im2colBackendDoesNotUseOnednn) {
  const Case& c = kCases[1];
  const Tensor x = random_tensor(c.x, 7), w = random_tensor(c.w, 8);
  set_conv_backend(ConvBackend::kIm2col);
  const int64_t runs0 = fast_conv_calls();
  (void)conv2d(x, w, Tensor(), c.a);
  EXPECT_EQ(fast_conv_calls(), runs0);
}

TEST_F(ConvBackendTest, OnednnIsDeterministicRunToRun) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (size_t k : {size_t{7}, size_t{11}, size_t{13}, size_t{14}, size_t{15}, size_t{16}}) {
      const Case& c = kCases[k];
      const Tensor x = random_tensor(c.x, 11), w = random_tensor(c.w, 12);
      const Tensor y1 = conv2d(x, w, Tensor(), c.a), y2 = conv2d(x, w, Tensor(), c.a);
      EXPECT_TRUE(y1.equals(y2)) << "case " << k << " threads " << threads;
      const Tensor dy = random_tensor(y1.shape(), 13);
      EXPECT_TRUE(conv2d_backward_input(dy, w, x.shape(), c.a)
                      .equals(conv2d_backward_input(dy, w, x.shape(), c.a)))
          << "case " << k << " threads " << threads;
      EXPECT_TRUE(conv2d_backward_filter(x, dy, w.shape(), c.a)
                      .equals(conv2d_backward_filter(x, dy, w.shape(), c.a)))
          << "case " << k << " threads " << threads;
    }
  }
}

// Once warm (primitives created, scratchpad grown) a step takes no tensor buffer from the system
// and the same number of heap blocks every step: oneDNN's execute() builds a small argument map
// per call (its C API), which is freed again, so nothing accumulates.
TEST_F(ConvBackendTest, WarmStepAllocatesNoTensorBuffers) {
  const Case& c = kCases[14];
  const Tensor x = random_tensor(c.x, 31), w = random_tensor(c.w, 32);
  const Tensor b = random_tensor(Shape{c.w[3]}, 33);
  const int64_t runs0 = fast_conv_calls();
  auto step = [&] {
    const Tensor y = conv2d(x, w, b, c.a);
    (void)conv2d_backward_input(y, w, x.shape(), c.a);
    (void)conv2d_backward_filter(x, y, w.shape(), c.a);
  };
  step();
  step();
  ASSERT_EQ(fast_conv_calls() - runs0, 6);
  const uint64_t system0 = allocator_stats().system_allocations;
  const long news0 = testutil::new_calls();
  step();
  const long per_step = testutil::new_calls() - news0;
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(testutil::new_calls() - news0, 6 * per_step);
  EXPECT_EQ(allocator_stats().system_allocations - system0, 0u);
  std::printf("heap blocks per warm step (inside oneDNN's execute): %ld\n", per_step);
}

}  // namespace
}  // namespace dtrain::ops
