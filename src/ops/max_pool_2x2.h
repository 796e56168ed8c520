// Private to dtrain_ops: max pooling over 2x2 windows with stride 2 (Keras's MaxPooling2D
// default) on NHWC float32, vectorized over 8 channels at a time with AVX2
// (src/ops/max_pool_2x2.cc). No header of it reaches include/.
#ifndef DTRAIN_SRC_OPS_MAX_POOL_2X2_H_
#define DTRAIN_SRC_OPS_MAX_POOL_2X2_H_

#include <cstdint>

namespace dtrain::ops::detail {

// The shape these kernels take: input [n, h, w, c], output [n, oh, ow, c] with every window
// inside the input (2·oh <= h, 2·ow <= w: no padding before, none clipped).
struct MaxPool2x2 {
  int64_t n, h, w, c, oh, ow;
};

// Whether this build has the kernels and they take `g` (c a multiple of 8, windows inside).
bool max_pool_2x2_applies(const MaxPool2x2& g);

// y = the window maxima, bit for bit as pool2d's scan from −inf (a value replaces the maximum
// only when greater, so NaNs are skipped), for max_pool_2x2_applies(g).
void max_pool_2x2_forward(const MaxPool2x2& g, const float* x, float* y);

// dx: each window's dy goes to its first position equal to the window's maximum (scanned from
// its first position, replaced only by a greater value), or to the first position when that
// maximum is NaN; every other element of dx is written +0 — including the rows and columns no
// window covers. The same bits as pool2d_backward's tiled path, for max_pool_2x2_applies(g).
void max_pool_2x2_backward(const MaxPool2x2& g, const float* x, const float* dy, float* dx);

}  // namespace dtrain::ops::detail

#endif  // DTRAIN_SRC_OPS_MAX_POOL_2X2_H_
