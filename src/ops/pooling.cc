// Max and average pooling over NHWC windows; padded positions take no part (they are neither a
// maximum nor counted in an average).
#include "dtrain/ops/pooling.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

#include "dtrain/core/error.h"
#include "dtrain/core/parallel_for.h"
#include "max_pool_2x2.h"

namespace dtrain::ops {

namespace {

struct PoolGeometry {
  int64_t n, h, w, c, oh, ow, ph, pw, sh, sw, pt, pl;
};

PoolGeometry pool_geometry(const Tensor& x, const Pool2DAttrs& a, const char* op) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() == 4, op,
               ": expected float32 input [batch, height, width, channels], got ",
               x.defined() ? x.shape().to_string() : "undefined");
  DTRAIN_CHECK(a.pool[0] >= 1 && a.pool[1] >= 1 && a.strides[0] >= 1 && a.strides[1] >= 1, op,
               ": pool size and strides must be positive");
  DTRAIN_CHECK(a.padding != Padding::kCausal, op, ": padding must be 'valid' or 'same'");
  PoolGeometry g{};
  g.n = x.dim(0), g.h = x.dim(1), g.w = x.dim(2), g.c = x.dim(3);
  g.ph = a.pool[0], g.pw = a.pool[1], g.sh = a.strides[0], g.sw = a.strides[1];
  g.oh = conv_output_size(g.h, g.ph, g.sh, 1, a.padding);
  g.ow = conv_output_size(g.w, g.pw, g.sw, 1, a.padding);
  g.pt = conv_pad_before(g.h, g.ph, g.sh, 1, a.padding);
  g.pl = conv_pad_before(g.w, g.pw, g.sw, 1, a.padding);
  DTRAIN_CHECK(g.oh > 0 && g.ow > 0, op, ": pool ", g.ph, "x", g.pw, " is larger than the input ",
               g.h, "x", g.w, " under padding='", padding_name(a.padding), "'");
  return g;
}

// The 2x2 kernels' view of g, when they take it (pool and strides 2, no padding before).
bool max_pool_2x2_view(PoolKind kind, const PoolGeometry& g, detail::MaxPool2x2* v) {
  if (kind != PoolKind::kMax || g.ph != 2 || g.pw != 2 || g.sh != 2 || g.sw != 2 || g.pt != 0 ||
      g.pl != 0) {
    return false;
  }
  *v = detail::MaxPool2x2{.n = g.n, .h = g.h, .w = g.w, .c = g.c, .oh = g.oh, .ow = g.ow};
  return detail::max_pool_2x2_applies(*v);
}

// The window of output (oy, ox), clipped to the input: rows [y0, y1), columns [x0, x1).
struct Window {
  int64_t y0, y1, x0, x1;
};
Window window(const PoolGeometry& g, int64_t oy, int64_t ox) {
  const int64_t y = oy * g.sh - g.pt, x = ox * g.sw - g.pl;
  return {std::max<int64_t>(y, 0), std::min(y + g.ph, g.h), std::max<int64_t>(x, 0),
          std::min(x + g.pw, g.w)};
}

// Max pooling's gradient when the windows tile the input without overlap (strides = pool size,
// no padding before; the last windows may be clipped): every input position is in at most one
// window, so dx is written once, without a zero-fill first. Per window and per block of
// channels: the maximum m in row-major order exactly as the general scan finds it (a later value
// replaces it only when strictly greater), then the gradient goes to the first position equal
// to m, or to the first position when m is NaN — the general scan's choice. Vectorizes over
// channels. Writes 0 + dy as the general path's += into zeros does (so −0 becomes +0).
void max_pool_backward_tiled(const PoolGeometry& g, const float* px, const float* pdy, float* pdx) {
  constexpr int64_t kBlock = 64;
  const int64_t row = g.w * g.c;
  const int64_t covered_h = std::min(g.oh * g.sh, g.h), covered_w = std::min(g.ow * g.sw, g.w);
  // Images are independent: the batch splits over parallel_for's threads.
  parallel_for(g.n, grain_for(2 * g.h * row), [&](int64_t n_begin, int64_t n_end) {
    // Per channel of the block: the window's maximum, and an all-ones mask while no position has
    // taken the gradient yet (integer masks, so that the loops vectorize).
    alignas(32) float m[kBlock];
    alignas(32) uint32_t open[kBlock];
    alignas(32) uint32_t grad[kBlock];
    for (int64_t n = n_begin; n < n_end; ++n) {
      const float* img = px + n * g.h * row;
      float* dimg = pdx + n * g.h * row;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const Window win = window(g, oy, ox);
          const float* gy = pdy + ((n * g.oh + oy) * g.ow + ox) * g.c;
          for (int64_t c0 = 0; c0 < g.c; c0 += kBlock) {
            const int64_t cb = std::min(kBlock, g.c - c0);
            const float* first = img + (win.y0 * g.w + win.x0) * g.c + c0;
            for (int64_t c = 0; c < cb; ++c) {
              m[c] = first[c];
              open[c] = ~0u;
              grad[c] = std::bit_cast<uint32_t>(0.0f + gy[c0 + c]);
            }
            for (int64_t iy = win.y0; iy < win.y1; ++iy) {
              for (int64_t ix = win.x0; ix < win.x1; ++ix) {
                const float* src = img + (iy * g.w + ix) * g.c + c0;
                for (int64_t c = 0; c < cb; ++c) m[c] = src[c] > m[c] ? src[c] : m[c];
              }
            }
            for (int64_t iy = win.y0; iy < win.y1; ++iy) {
              for (int64_t ix = win.x0; ix < win.x1; ++ix) {
                const int64_t at = (iy * g.w + ix) * g.c + c0;
                const float* src = img + at;
                float* d = dimg + at;
                for (int64_t c = 0; c < cb; ++c) {
                  const uint32_t hit = (src[c] == m[c] ? ~0u : 0u) & open[c];
                  open[c] &= ~hit;
                  d[c] = std::bit_cast<float>(grad[c] & hit);
                }
              }
            }
            // A NaN maximum equals nothing: the first position takes the gradient.
            float* d = dimg + (win.y0 * g.w + win.x0) * g.c + c0;
            for (int64_t c = 0; c < cb; ++c) {
              d[c] = std::bit_cast<float>(std::bit_cast<uint32_t>(d[c]) | (grad[c] & open[c]));
            }
          }
        }
        // Columns right of the last window in this band of rows.
        for (int64_t iy = oy * g.sh; iy < std::min((oy + 1) * g.sh, g.h); ++iy) {
          std::fill(dimg + iy * row + covered_w * g.c, dimg + (iy + 1) * row, 0.0f);
        }
      }
      std::fill(dimg + covered_h * row, dimg + g.h * row, 0.0f);  // rows below the last window
    }
  });
}

}  // namespace

Tensor pool2d(PoolKind kind, const Tensor& x, const Pool2DAttrs& a, const char* op) {
  const PoolGeometry g = pool_geometry(x, a, op);
  Tensor y(Shape{g.n, g.oh, g.ow, g.c});
  const float* px = x.data<float>();
  float* py = y.data<float>();
  detail::MaxPool2x2 v;
  if (max_pool_2x2_view(kind, g, &v)) {
    detail::max_pool_2x2_forward(v, px, py);
    return y;
  }
  parallel_for(g.n, grain_for(g.h * g.w * g.c), [&](int64_t n_begin, int64_t n_end) {
    for (int64_t n = n_begin; n < n_end; ++n) {
      const float* img = px + n * g.h * g.w * g.c;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const Window win = window(g, oy, ox);
          float* out = py + ((n * g.oh + oy) * g.ow + ox) * g.c;
          if (kind == PoolKind::kMax) {
            std::fill_n(out, g.c, -std::numeric_limits<float>::infinity());
            for (int64_t iy = win.y0; iy < win.y1; ++iy) {
              for (int64_t ix = win.x0; ix < win.x1; ++ix) {
                const float* src = img + (iy * g.w + ix) * g.c;
                for (int64_t c = 0; c < g.c; ++c) out[c] = std::max(out[c], src[c]);
              }
            }
          } else {
            std::fill_n(out, g.c, 0.0f);
            for (int64_t iy = win.y0; iy < win.y1; ++iy) {
              for (int64_t ix = win.x0; ix < win.x1; ++ix) {
                const float* src = img + (iy * g.w + ix) * g.c;
                for (int64_t c = 0; c < g.c; ++c) out[c] += src[c];
              }
            }
            const float inv = 1.0f / static_cast<float>((win.y1 - win.y0) * (win.x1 - win.x0));
            for (int64_t c = 0; c < g.c; ++c) out[c] *= inv;
          }
        }
      }
    }
  });
  return y;
}

Tensor pool2d_backward(PoolKind kind, const Tensor& x, const Tensor& dy, const Pool2DAttrs& a) {
  const PoolGeometry g = pool_geometry(x, a, "pool2d_backward");
  DTRAIN_CHECK(dy.defined() && dy.shape() == (Shape{g.n, g.oh, g.ow, g.c}),
               "pool2d_backward: gradient ", dy.defined() ? dy.shape().to_string() : "undefined",
               " does not match the output");
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  detail::MaxPool2x2 v;
  if (max_pool_2x2_view(kind, g, &v)) {
    Tensor dx(x.shape());
    detail::max_pool_2x2_backward(v, px, pdy, dx.data<float>());
    return dx;
  }
  if (kind == PoolKind::kMax && g.sh == g.ph && g.sw == g.pw && g.pt == 0 && g.pl == 0) {
    Tensor dx(x.shape());
    max_pool_backward_tiled(g, px, pdy, dx.data<float>());
    return dx;
  }
  Tensor dx = Tensor::zeros(x.shape());
  float* pdx = dx.data<float>();
  parallel_for(g.n, grain_for(2 * g.h * g.w * g.c), [&](int64_t n_begin, int64_t n_end) {
    for (int64_t n = n_begin; n < n_end; ++n) {
      const float* img = px + n * g.h * g.w * g.c;
      float* dimg = pdx + n * g.h * g.w * g.c;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const Window win = window(g, oy, ox);
          const float* gy = pdy + ((n * g.oh + oy) * g.ow + ox) * g.c;
          if (kind == PoolKind::kMax) {
            for (int64_t c = 0; c < g.c; ++c) {
              int64_t best = -1;
              float best_v = -std::numeric_limits<float>::infinity();
              for (int64_t iy = win.y0; iy < win.y1; ++iy) {
                for (int64_t ix = win.x0; ix < win.x1; ++ix) {
                  const int64_t at = (iy * g.w + ix) * g.c + c;
                  if (best < 0 || img[at] > best_v) best = at, best_v = img[at];
                }
              }
              dimg[best] += gy[c];
            }
          } else {
            const float inv = 1.0f / static_cast<float>((win.y1 - win.y0) * (win.x1 - win.x0));
            for (int64_t iy = win.y0; iy < win.y1; ++iy) {
              for (int64_t ix = win.x0; ix < win.x1; ++ix) {
                float* d = dimg + (iy * g.w + ix) * g.c;
                for (int64_t c = 0; c < g.c; ++c) d[c] += gy[c] * inv;
              }
            }
          }
        }
      }
    }
  });
  return dx;
}

namespace {
void check_global(const Tensor& x, const char* op) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() >= 3, op,
               ": expected float32 input [batch, ..., channels], got ",
               x.defined() ? x.shape().to_string() : "undefined");
}
}  // namespace

Tensor global_pool(PoolKind kind, const Tensor& x) {
  check_global(x, "global_pool");
  const int64_t n = x.dim(0), c = x.dim(-1);
  const int64_t s = n * c == 0 ? 0 : x.num_elements() / (n * c);
  DTRAIN_CHECK(s > 0, "global_pool: input ", x.shape().to_string(), " has no positions");
  Tensor y(Shape{n, c});
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(n, grain_for(s * c), [&](int64_t b_begin, int64_t b_end) {
    for (int64_t b = b_begin; b < b_end; ++b) {
      float* out = py + b * c;
      const float* img = px + b * s * c;
      std::copy_n(img, c, out);
      for (int64_t i = 1; i < s; ++i) {
        const float* src = img + i * c;
        if (kind == PoolKind::kMax) {
          for (int64_t k = 0; k < c; ++k) out[k] = std::max(out[k], src[k]);
        } else {
          for (int64_t k = 0; k < c; ++k) out[k] += src[k];
        }
      }
      if (kind == PoolKind::kAverage) {
        const float inv = 1.0f / static_cast<float>(s);
        for (int64_t k = 0; k < c; ++k) out[k] *= inv;
      }
    }
  });
  return y;
}

Tensor global_pool_backward(PoolKind kind, const Tensor& x, const Tensor& dy) {
  check_global(x, "global_pool_backward");
  const int64_t n = x.dim(0), c = x.dim(-1);
  const int64_t s = n * c == 0 ? 0 : x.num_elements() / (n * c);
  DTRAIN_CHECK(dy.defined() && dy.shape() == (Shape{n, c}), "global_pool_backward: gradient ",
               dy.defined() ? dy.shape().to_string() : "undefined", " does not match [", n, ", ", c,
               "]");
  Tensor dx = Tensor::zeros(x.shape());
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  parallel_for(n, grain_for(s * c), [&](int64_t b_begin, int64_t b_end) {
    for (int64_t b = b_begin; b < b_end; ++b) {
      const float* img = px + b * s * c;
      float* dimg = pdx + b * s * c;
      const float* g = pdy + b * c;
      if (kind == PoolKind::kAverage) {
        const float inv = 1.0f / static_cast<float>(s);
        for (int64_t i = 0; i < s; ++i) {
          for (int64_t k = 0; k < c; ++k) dimg[i * c + k] = g[k] * inv;
        }
        continue;
      }
      for (int64_t k = 0; k < c; ++k) {
        int64_t best = 0;
        for (int64_t i = 1; i < s; ++i) {
          if (img[i * c + k] > img[best * c + k]) best = i;
        }
        dimg[best * c + k] = g[k];
      }
    }
  });
  return dx;
}

}  // namespace dtrain::ops
