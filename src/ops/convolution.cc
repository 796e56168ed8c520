// Convolutions as im2col + GEMM over NHWC. The column matrix of a batch chunk has one row per
// output pixel (n, oh, ow) and, per group, the patch in (kh, kw, c) order, so that group g's
// rows times the HWIO kernel's columns [g·out/G, (g+1)·out/G) give its output channels; the
// result rows are already NHWC. The workspace is a thread_local buffer that only grows.
#include "dtrain/ops/convolution.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <vector>

#include "convolution_onednn.h"
#include "dtrain/core/error.h"
#include "dtrain/ops/gemm.h"
#include "winograd.h"

namespace dtrain::ops {

Padding padding_from_name(const std::string& name, const std::string& where) {
  std::string s = name;
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "valid") return Padding::kValid;
  if (s == "same") return Padding::kSame;
  if (s == "causal") return Padding::kCausal;
  throw InvalidArgumentError(
      str_cat(where, ": unknown padding '", name, "' (expected 'valid' or 'same')"));
}

const char* padding_name(Padding p) {
  switch (p) {
    case Padding::kValid:
      return "valid";
    case Padding::kSame:
      return "same";
    case Padding::kCausal:
      return "causal";
  }
  return "valid";
}

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t dilation, Padding p) {
  const int64_t effective = (kernel - 1) * dilation + 1;
  if (p == Padding::kValid) return in >= effective ? (in - effective) / stride + 1 : 0;
  return (in + stride - 1) / stride;  // same and causal: ceil(in / stride)
}

int64_t conv_pad_before(int64_t in, int64_t kernel, int64_t stride, int64_t dilation, Padding p) {
  const int64_t effective = (kernel - 1) * dilation + 1;
  if (p == Padding::kValid) return 0;
  if (p == Padding::kCausal) return effective - 1;
  const int64_t out = conv_output_size(in, kernel, stride, dilation, p);
  const int64_t total = std::max<int64_t>((out - 1) * stride + effective - in, 0);
  return total / 2;
}

int64_t conv_transpose_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t dilation,
                                   Padding p) {
  if (p == Padding::kValid) return (in - 1) * stride + (kernel - 1) * dilation + 1;
  return in * stride;
}

namespace {

struct Geometry {
  int64_t n, h, w, c;      // input
  int64_t oh, ow, o;       // output
  int64_t kh, kw, cg, og;  // kernel, channels per group
  int64_t sh, sw, dh, dw;  // strides, dilations
  int64_t pt, pl;          // padding before
  int64_t groups;
  int64_t kg() const { return kh * kw * cg; }    // patch length per group
  int64_t row() const { return kg() * groups; }  // column-matrix row length
  int64_t pixels() const { return oh * ow; }     // output pixels per image
  bool identity_columns() const {                // a 1×1 stride-1 kernel: col = x
    return kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0;
  }
};

Geometry geometry(const Shape& x, const Shape& w, const Conv2DAttrs& a, const char* op) {
  DTRAIN_CHECK(x.rank() == 4, op, ": expected input [batch, height, width, channels], got ",
               x.to_string());
  DTRAIN_CHECK(w.rank() == 4, op, ": expected kernel [kh, kw, in/groups, out], got ",
               w.to_string());
  DTRAIN_CHECK(a.groups >= 1 && a.strides[0] >= 1 && a.strides[1] >= 1 && a.dilation[0] >= 1 &&
                   a.dilation[1] >= 1,
               op, ": strides, dilation and groups must be positive");
  Geometry g{};
  g.n = x[0], g.h = x[1], g.w = x[2], g.c = x[3];
  g.kh = w[0], g.kw = w[1], g.cg = w[2], g.o = w[3];
  g.groups = a.groups;
  DTRAIN_CHECK(g.c % g.groups == 0, op, ": groups=", g.groups, " does not divide the ", g.c,
               " input channels");
  DTRAIN_CHECK(g.o % g.groups == 0, op, ": groups=", g.groups, " does not divide the ", g.o,
               " output channels");
  DTRAIN_CHECK(g.cg * g.groups == g.c, op, ": input has ", g.c, " channels but kernel ",
               w.to_string(), " with groups=", g.groups, " expects ", g.cg * g.groups);
  g.og = g.o / g.groups;
  g.sh = a.strides[0], g.sw = a.strides[1], g.dh = a.dilation[0], g.dw = a.dilation[1];
  const Padding ph = a.padding == Padding::kCausal ? Padding::kValid : a.padding;
  g.oh = conv_output_size(g.h, g.kh, g.sh, g.dh, ph);
  g.ow = conv_output_size(g.w, g.kw, g.sw, g.dw, a.padding);
  g.pt = conv_pad_before(g.h, g.kh, g.sh, g.dh, ph);
  g.pl = conv_pad_before(g.w, g.kw, g.sw, g.dw, a.padding);
  if (a.padding == Padding::kCausal) {
    g.ow = conv_output_size(g.w + g.pl, g.kw, g.sw, g.dw, Padding::kValid);
  }
  DTRAIN_CHECK(g.oh > 0 && g.ow > 0, op, ": kernel ", g.kh, "x", g.kw, " (dilation ", g.dh, "x",
               g.dw, ") is larger than the input ", g.h, "x", g.w, " under padding='",
               padding_name(a.padding), "'");
  return g;
}

// Grows (never shrinks) this thread's workspace to n floats.
float* workspace(int64_t n) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

// Images per chunk so that a chunk's column matrix stays under ~32 MiB.
int64_t chunk_images(const Geometry& g) {
  constexpr int64_t kMaxFloats = int64_t{8} << 20;
  const int64_t per_image = std::max<int64_t>(g.pixels() * g.row(), 1);
  return std::clamp<int64_t>(kMaxFloats / per_image, 1, std::max<int64_t>(g.n, 1));
}

// col [images·oh·ow, row] ← patches of x's images [n0, n0 + images).
void im2col(const float* x, const Geometry& g, int64_t n0, int64_t images, float* col) {
  const int64_t row = g.row(), kg = g.kg();
  for (int64_t n = 0; n < images; ++n) {
    const float* img = x + (n0 + n) * g.h * g.w * g.c;
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        float* dst_row = col + ((n * g.oh + oy) * g.ow + ox) * row;
        for (int64_t i = 0; i < g.kh; ++i) {
          const int64_t iy = oy * g.sh - g.pt + i * g.dh;
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t ix = ox * g.sw - g.pl + j * g.dw;
            const bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
            const float* src = img + (iy * g.w + ix) * g.c;
            for (int64_t gr = 0; gr < g.groups; ++gr) {
              float* dst = dst_row + gr * kg + (i * g.kw + j) * g.cg;
              if (inside) {
                std::memcpy(dst, src + gr * g.cg, static_cast<size_t>(g.cg) * sizeof(float));
              } else {
                std::fill_n(dst, g.cg, 0.0f);
              }
            }
          }
        }
      }
    }
  }
}

// dx's images [n0, n0 + images) += scatter of col (the adjoint of im2col).
void col2im(const float* col, const Geometry& g, int64_t n0, int64_t images, float* dx) {
  const int64_t row = g.row(), kg = g.kg();
  for (int64_t n = 0; n < images; ++n) {
    float* img = dx + (n0 + n) * g.h * g.w * g.c;
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        const float* src_row = col + ((n * g.oh + oy) * g.ow + ox) * row;
        for (int64_t i = 0; i < g.kh; ++i) {
          const int64_t iy = oy * g.sh - g.pt + i * g.dh;
          if (iy < 0 || iy >= g.h) continue;
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t ix = ox * g.sw - g.pl + j * g.dw;
            if (ix < 0 || ix >= g.w) continue;
            float* dst = img + (iy * g.w + ix) * g.c;
            for (int64_t gr = 0; gr < g.groups; ++gr) {
              const float* src = src_row + gr * kg + (i * g.kw + j) * g.cg;
              float* d = dst + gr * g.cg;
              for (int64_t c = 0; c < g.cg; ++c) d[c] += src[c];
            }
          }
        }
      }
    }
  }
}

// oneDNN's view of g (null when the oneDNN backend is off).
bool onednn_view(const Geometry& g, detail::OnednnConv* d) {
  if (!detail::onednn_enabled()) return false;
  *d = detail::OnednnConv{.n = g.n,
                          .h = g.h,
                          .w = g.w,
                          .c = g.c,
                          .oh = g.oh,
                          .ow = g.ow,
                          .o = g.o,
                          .kh = g.kh,
                          .kw = g.kw,
                          .groups = g.groups,
                          .sh = g.sh,
                          .sw = g.sw,
                          .dh = g.dh,
                          .dw = g.dw,
                          .pt = g.pt,
                          .pl = g.pl};
  return true;
}

// The Winograd kernels' view of g, or false where they do not take it (winograd.h).
bool winograd_view(const Geometry& g, detail::WinogradConv* d) {
  if (g.kh != 3 || g.kw != 3 || g.sh != 1 || g.sw != 1 || g.dh != 1 || g.dw != 1 || g.groups != 1) {
    return false;
  }
  *d = detail::WinogradConv{.n = g.n,
                            .h = g.h,
                            .w = g.w,
                            .c = g.c,
                            .oh = g.oh,
                            .ow = g.ow,
                            .o = g.o,
                            .pt = g.pt,
                            .pl = g.pl};
  return detail::winograd_applies(*d);
}

void check_float(const Tensor& t, const char* op, const char* what) {
  DTRAIN_CHECK(t.defined() && t.dtype() == DType::kFloat32, op, ": ", what,
               " must be a float32 tensor");
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2DAttrs& a,
              const char* op) {
  check_float(x, op, "input");
  check_float(w, op, "kernel");
  const Geometry g = geometry(x.shape(), w.shape(), a, op);
  Tensor y(Shape{g.n, g.oh, g.ow, g.o});
  float* py = y.data<float>();
  const int64_t m_total = g.n * g.pixels();
  if (bias.defined()) {
    check_float(bias, op, "bias");
    DTRAIN_CHECK(bias.num_elements() == g.o, op, ": bias ", bias.shape().to_string(),
                 " does not match ", g.o, " filters");
  }
  detail::WinogradConv wg;
  if (winograd_view(g, &wg)) {
    detail::winograd_conv2d(wg, x.data<float>(), w.data<float>(),
                            bias.defined() ? bias.data<float>() : nullptr, py);
    return y;
  }
  detail::OnednnConv d;
  if (onednn_view(g, &d)) {
    const float* pb = bias.defined() ? bias.data<float>() : nullptr;
    if (detail::onednn_conv2d(d, x.data<float>(), w.data<float>(), pb, py)) return y;
  }
  if (bias.defined()) {
    const float* pb = bias.data<float>();
    for (int64_t r = 0; r < m_total; ++r) std::copy_n(pb, g.o, py + r * g.o);
  }
  const float beta = bias.defined() ? 1.0f : 0.0f;
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const int64_t chunk = chunk_images(g);
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t images = std::min(chunk, g.n - n0);
    const int64_t m = images * g.pixels();
    const float* col;
    if (g.identity_columns()) {
      col = px + n0 * g.h * g.w * g.c;
    } else {
      float* ws = workspace(m * g.row());
      im2col(px, g, n0, images, ws);
      col = ws;
    }
    float* out = py + n0 * g.pixels() * g.o;
    for (int64_t gr = 0; gr < g.groups; ++gr) {
      gemm(false, false, m, g.og, g.kg(), 1.0f, col + gr * g.kg(), g.row(), pw + gr * g.og, g.o,
           beta, out + gr * g.og, g.o);
    }
  }
  return y;
}

Tensor conv2d_backward_input(const Tensor& dy, const Tensor& w, const Shape& x_shape,
                             const Conv2DAttrs& a) {
  const char* op = "conv2d_backward_input";
  check_float(dy, op, "gradient");
  check_float(w, op, "kernel");
  const Geometry g = geometry(x_shape, w.shape(), a, op);
  DTRAIN_CHECK(dy.shape() == (Shape{g.n, g.oh, g.ow, g.o}), op, ": gradient ",
               dy.shape().to_string(), " does not match the output [", g.n, ", ", g.oh, ", ", g.ow,
               ", ", g.o, "]");
  detail::WinogradConv wg;
  if (winograd_view(g, &wg)) {
    Tensor out(x_shape);
    detail::winograd_conv2d_backward_input(wg, dy.data<float>(), w.data<float>(),
                                           out.data<float>());
    return out;
  }
  detail::OnednnConv d;
  if (onednn_view(g, &d)) {
    Tensor out(x_shape);
    if (detail::onednn_conv2d_backward_input(d, dy.data<float>(), w.data<float>(),
                                             out.data<float>())) {
      return out;
    }
  }
  Tensor dx = Tensor::zeros(x_shape);
  float* pdx = dx.data<float>();
  const float* pdy = dy.data<float>();
  const float* pw = w.data<float>();
  const int64_t chunk = chunk_images(g);
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t images = std::min(chunk, g.n - n0);
    const int64_t m = images * g.pixels();
    const float* gy = pdy + n0 * g.pixels() * g.o;
    if (g.identity_columns()) {
      // dx = dy · wᵀ directly (dx is zero, and each element is written once).
      float* out = pdx + n0 * g.h * g.w * g.c;
      for (int64_t gr = 0; gr < g.groups; ++gr) {
        gemm(false, true, m, g.kg(), g.og, 1.0f, gy + gr * g.og, g.o, pw + gr * g.og, g.o, 0.0f,
             out + gr * g.kg(), g.row());
      }
      continue;
    }
    float* dcol = workspace(m * g.row());
    for (int64_t gr = 0; gr < g.groups; ++gr) {
      gemm(false, true, m, g.kg(), g.og, 1.0f, gy + gr * g.og, g.o, pw + gr * g.og, g.o, 0.0f,
           dcol + gr * g.kg(), g.row());
    }
    col2im(dcol, g, n0, images, pdx);
  }
  return dx;
}

Tensor conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Shape& w_shape,
                              const Conv2DAttrs& a) {
  const char* op = "conv2d_backward_filter";
  check_float(x, op, "input");
  check_float(dy, op, "gradient");
  const Geometry g = geometry(x.shape(), w_shape, a, op);
  DTRAIN_CHECK(dy.shape() == (Shape{g.n, g.oh, g.ow, g.o}), op, ": gradient ",
               dy.shape().to_string(), " does not match the output [", g.n, ", ", g.oh, ", ", g.ow,
               ", ", g.o, "]");
  Tensor dw(w_shape);
  float* pdw = dw.data<float>();
  detail::WinogradConv wg;
  if (winograd_view(g, &wg)) {
    detail::winograd_conv2d_backward_filter(wg, x.data<float>(), dy.data<float>(), pdw);
    return dw;
  }
  detail::OnednnConv d;
  if (onednn_view(g, &d)) {
    if (detail::onednn_conv2d_backward_filter(d, x.data<float>(), dy.data<float>(), pdw)) {
      return dw;
    }
  }
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  const int64_t chunk = chunk_images(g);
  if (g.n == 0) dw.fill(0.0);
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t images = std::min(chunk, g.n - n0);
    const int64_t m = images * g.pixels();
    const float* col;
    if (g.identity_columns()) {
      col = px + n0 * g.h * g.w * g.c;
    } else {
      float* ws = workspace(m * g.row());
      im2col(px, g, n0, images, ws);
      col = ws;
    }
    const float* gy = pdy + n0 * g.pixels() * g.o;
    const float beta = n0 == 0 ? 0.0f : 1.0f;
    for (int64_t gr = 0; gr < g.groups; ++gr) {
      // dw_g [kg, og] = col_gᵀ · dy_g
      gemm(true, false, g.kg(), g.og, m, 1.0f, col + gr * g.kg(), g.row(), gy + gr * g.og, g.o,
           beta, pdw + gr * g.og, g.o);
    }
  }
  return dw;
}

namespace {

// [n, a, b, c] viewed as three axes → [n, b, a, c]... generalised: swaps the block of axes
// 1..k−1 with axis k for channels-last, or axis r−1 with 1..r−2 for channels-first.
Tensor move_axis(const Tensor& x, bool to_last, const char* op) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() >= 3, op,
               ": expected a float32 tensor of rank >= 3, got ",
               x.defined() ? x.shape().to_string() : "undefined");
  const int r = x.rank();
  const int64_t n = x.dim(0);
  int64_t spatial = 1;
  for (int i = 1; i < r - 1; ++i) spatial *= to_last ? x.dim(i + 1) : x.dim(i);
  const int64_t c = to_last ? x.dim(1) : x.dim(r - 1);
  std::vector<int64_t> dims(static_cast<size_t>(r));
  dims[0] = n;
  if (to_last) {
    for (int i = 1; i < r - 1; ++i) dims[static_cast<size_t>(i)] = x.dim(i + 1);
    dims[static_cast<size_t>(r - 1)] = c;
  } else {
    dims[1] = c;
    for (int i = 2; i < r; ++i) dims[static_cast<size_t>(i)] = x.dim(i - 1);
  }
  Tensor y{Shape(dims)};
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (int64_t b = 0; b < n; ++b) {
    const float* src = px + b * spatial * c;
    float* dst = py + b * spatial * c;
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t s = 0; s < spatial; ++s) {
        if (to_last) {
          dst[s * c + ch] = src[ch * spatial + s];
        } else {
          dst[ch * spatial + s] = src[s * c + ch];
        }
      }
    }
  }
  return y;
}

}  // namespace

Tensor to_channels_last(const Tensor& x) { return move_axis(x, true, "to_channels_last"); }
Tensor to_channels_first(const Tensor& x) { return move_axis(x, false, "to_channels_first"); }

}  // namespace dtrain::ops
