// Winograd F(4x4, 3x3) convolutions on NHWC / HWIO float buffers (internal to ops/): forward,
// backward-data (a forward convolution of dy with the flipped, transposed kernel) and
// backward-weights (the exact adjoint of the forward's transforms). 6x6 input tiles give 4x4
// outputs; the 36 transformed-domain products per tile chunk are small GEMMs. Deterministic and
// bitwise independent of the thread count: work is split over fixed tile chunks (forward,
// backward-data) or over the 36 transformed positions (backward-weights), never inside a sum.
#pragma once

#include <cstdint>

namespace dtrain::ops::detail {

// A 3x3, stride-1, undilated, ungrouped convolution: x [n, h, w, c] → y [n, oh, ow, o], with
// pt / pl rows / columns of zeros before the input (the rest after, implied by oh / ow).
struct WinogradConv {
  int64_t n, h, w, c;
  int64_t oh, ow, o;
  int64_t pt, pl;
};

// Whether the Winograd kernels take this geometry (channel counts in whole 8-float vectors,
// padding that backward-data can mirror) and the algorithm choice allows them (ConvAlgo).
bool winograd_applies(const WinogradConv& g);

// y = conv(x, w) (+ bias when not null).
void winograd_conv2d(const WinogradConv& g, const float* x, const float* w, const float* bias,
                     float* y);
// dx [n, h, w, c] of y = conv(x, w) for dy [n, oh, ow, o].
void winograd_conv2d_backward_input(const WinogradConv& g, const float* dy, const float* w,
                                    float* dx);
// dw [3, 3, c, o] of y = conv(x, w) for dy.
void winograd_conv2d_backward_filter(const WinogradConv& g, const float* x, const float* dy,
                                     float* dw);

}  // namespace dtrain::ops::detail
