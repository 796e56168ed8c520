// Private to dtrain_ops: the oneDNN backend of ops/convolution.h (src/ops/convolution_onednn.cc).
// No oneDNN header here, so that convolution.cc and tests stay free of it.
#ifndef DTRAIN_SRC_OPS_CONVOLUTION_ONEDNN_H_
#define DTRAIN_SRC_OPS_CONVOLUTION_ONEDNN_H_

#include <cstdint>

namespace dtrain::ops::detail {

// One convolution's geometry over NHWC input, HWIO kernel (groups split the I and O axes).
struct OnednnConv {
  int64_t n, h, w, c;      // input
  int64_t oh, ow, o;       // output
  int64_t kh, kw, groups;  // kernel
  int64_t sh, sw, dh, dw;  // strides, dilations (1 = none)
  int64_t pt, pl;          // padding before (after is derived)
};

// Whether the oneDNN path is on: DTRAIN_CONV unset or "onednn"; "im2col" turns it off (read
// once). conv_backend_override() sets it for this thread for A/B tests.
bool onednn_enabled();

// Each returns false (having written nothing) where oneDNN does not take the shape, so that the
// caller falls back to im2col. y [n, oh, ow, o] = x ⋆ w (+ bias when non-null);
// dx [n, h, w, c] = the adjoint for dy (overwritten); dw [kh, kw, c/groups, o] (overwritten).
bool onednn_conv2d(const OnednnConv& g, const float* x, const float* w, const float* bias,
                   float* y);
bool onednn_conv2d_backward_input(const OnednnConv& g, const float* dy, const float* w, float* dx);
bool onednn_conv2d_backward_filter(const OnednnConv& g, const float* x, const float* dy, float* dw);

}  // namespace dtrain::ops::detail

#endif  // DTRAIN_SRC_OPS_CONVOLUTION_ONEDNN_H_
