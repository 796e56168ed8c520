// Convolution kernels on float32 NHWC tensors (tf.nn.conv2d's default layout), without autograd:
// forward, and the two backward products (d input, d filter) that autograd and
// Conv2DTranspose use. Kernels are HWIO, as Keras stores them: [kh, kw, in / groups, out].
// Implementation: oneDNN primitives on the NHWC/HWIO buffers (cached per thread and shape), or
// im2col into a per-thread workspace that is reused across calls and one OpenBLAS GEMM per group
// (see docs/decisions.md); no heap allocation once warm. Deterministic for a fixed thread
// count; correct under FTZ/DAZ. Thread-safe (each thread has its own caches and workspace).
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain::ops {

// Keras's padding modes. kSame pads as TensorFlow does: total = max((out − 1)·stride +
// (k − 1)·dilation + 1 − in, 0), total / 2 before (top/left), the rest after (bottom/right).
// kCausal (Conv1D only) pads (k − 1)·dilation before the width axis and nothing after.
enum class Padding { kValid, kSame, kCausal };
// "valid" / "same" / "causal" (case-insensitive as Keras); throws InvalidArgumentError naming
// `where` and the value otherwise.
Padding padding_from_name(const std::string& name, const std::string& where);
const char* padding_name(Padding p);

// Output length along one axis, and the padding before it.
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t dilation, Padding p);
int64_t conv_pad_before(int64_t in, int64_t kernel, int64_t stride, int64_t dilation, Padding p);

// The attributes of a 2-D convolution ([height, width] pairs). A 1-D convolution is a 2-D one
// over height 1.
struct Conv2DAttrs {
  int64_t strides[2] = {1, 1};
  int64_t dilation[2] = {1, 1};
  Padding padding = Padding::kValid;
  int64_t groups = 1;
};

// y [n, oh, ow, out] = conv(x [n, h, w, in], w [kh, kw, in / groups, out]) + bias [out] (bias
// may be undefined). Throws InvalidArgumentError naming `op` for bad ranks, a channel count
// that does not match the kernel, groups that do not divide the channels, or a kernel larger
// than the (padded) input.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2DAttrs& a,
              const char* op = "conv2d");
// d x [n, h, w, in] of y = conv2d(x, w) for d y; `x_shape` is x's shape. Also the forward of a
// transposed convolution.
Tensor conv2d_backward_input(const Tensor& dy, const Tensor& w, const Shape& x_shape,
                             const Conv2DAttrs& a);
// d w [kh, kw, in / groups, out] of y = conv2d(x, w) for d y.
Tensor conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Shape& w_shape,
                              const Conv2DAttrs& a);

// Output spatial size of a transposed convolution (Keras's Conv2DTranspose without
// output_padding): valid: (in − 1)·stride + (k − 1)·dilation + 1; same: in·stride.
int64_t conv_transpose_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t dilation,
                                   Padding p);

// The convolution kernels' backend: oneDNN (the default; shapes it does not take fall back to
// im2col) or im2col + OpenBLAS. Initially from
// DTRAIN_CONV ("im2col" or "onednn"); process-wide.
enum class ConvBackend { kOnednn, kIm2col };
void set_conv_backend(ConvBackend b);
ConvBackend conv_backend();
// How many convolution calls oneDNN has taken in this process, rather than im2col (for tests
// and benchmarks).
int64_t fast_conv_calls();

// The convolution algorithm: kAuto (the default) runs 3x3, stride-1, undilated, ungrouped
// convolutions whose channel counts are multiples of 8 and at least 16 (both ways) through
// Winograd F(4x4, 3x3) in all three directions, and everything else directly (the backend above);
// kDirect never uses Winograd. Initially from DTRAIN_CONV_ALGO ("auto", "winograd" or "direct";
// another value throws InvalidArgumentError); process-wide. Winograd differs from the direct
// convolution by rounding only (docs/decisions.md).
enum class ConvAlgo { kAuto, kDirect };
void set_conv_algo(ConvAlgo a);
ConvAlgo conv_algo();
// How many convolution calls the Winograd kernels have taken in this process.
int64_t winograd_conv_calls();

// Moves the channel axis: [n, c, d1, ...] → [n, d1, ..., c] and back (rank ≥ 3).
Tensor to_channels_last(const Tensor& x);
Tensor to_channels_first(const Tensor& x);

}  // namespace dtrain::ops
