// Batched GEMM over OpenBLAS and the fused masked softmax.
#include "dtrain/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/ops/gemm.h"
#include "dtrain/ops/tensor_ops.h"
#include "vector_math.h"

namespace dtrain::ops {
namespace {

// The shape without its last two dimensions (the batch of a batched matrix).
Shape batch_dims(const Shape& s) {
  Shape out;
  for (int d = 0; d + 2 < s.rank(); ++d) out.push_back(s[d]);
  return out;
}

// A selection mask of any numeric or bool dtype as float32 (nonzero: attend).
Tensor mask_as_float(const Tensor& mask) {
  if (mask.dtype() != DType::kBool) return cast(mask, DType::kFloat32);
  Tensor out(mask.shape());
  const auto* src = static_cast<const uint8_t*>(mask.raw_data());
  float* dst = out.data<float>();
  for (int64_t i = 0, n = mask.num_elements(); i < n; ++i) dst[i] = src[i] != 0 ? 1.0f : 0.0f;
  return out;
}

}  // namespace

void strided_batched_gemm(int64_t outer, int64_t inner, bool trans_a, bool trans_b, int64_t m,
                          int64_t n, int64_t k, float alpha, StridedMatrices a, StridedMatrices b,
                          float beta, StridedOutput c) {
  for (int64_t i = 0; i < outer; ++i) {
    for (int64_t j = 0; j < inner; ++j) {
      // With a zero output stride every product after the first accumulates.
      const bool shared_c = c.outer_stride == 0 && c.inner_stride == 0;
      const float b_ij = shared_c && (i > 0 || j > 0) ? 1.0f : beta;
      gemm(trans_a, trans_b, m, n, k, alpha, a.data + i * a.outer_stride + j * a.inner_stride, a.ld,
           b.data + i * b.outer_stride + j * b.inner_stride, b.ld, b_ij,
           c.data + i * c.outer_stride + j * c.inner_stride, c.ld);
    }
  }
}

Tensor batch_matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  DTRAIN_CHECK(a.defined() && b.defined() && a.dtype() == DType::kFloat32 &&
                   b.dtype() == DType::kFloat32 && a.rank() >= 2 && b.rank() >= 2,
               "batch_matmul: expected float32 operands of rank >= 2, got ",
               a.defined() ? a.shape().to_string() : "undefined", " and ",
               b.defined() ? b.shape().to_string() : "undefined");
  const Shape batch_a = batch_dims(a.shape());
  const Shape batch_b = batch_dims(b.shape());
  DTRAIN_CHECK(a.rank() == 2 || b.rank() == 2 || batch_a == batch_b,
               "batch_matmul: batch shapes of ", a.shape().to_string(), " and ",
               b.shape().to_string(), " differ");
  const int64_t m = a.dim(transpose_a ? -1 : -2), ka = a.dim(transpose_a ? -2 : -1);
  const int64_t kb = b.dim(transpose_b ? -1 : -2), n = b.dim(transpose_b ? -2 : -1);
  DTRAIN_CHECK(ka == kb, "batch_matmul: inner dimensions of ", a.shape().to_string(),
               transpose_a ? "ᵀ" : "", " and ", b.shape().to_string(), transpose_b ? "ᵀ" : "",
               " differ (", ka, " vs ", kb, ")");
  const Shape& batch = a.rank() >= b.rank() ? batch_a : batch_b;
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out(out_shape);
  const int64_t count = batch.num_elements();
  const int64_t sa = a.rank() == 2 ? 0 : a.dim(-1) * a.dim(-2);
  const int64_t sb = b.rank() == 2 ? 0 : b.dim(-1) * b.dim(-2);
  strided_batched_gemm(1, count, transpose_a, transpose_b, m, n, ka, 1.0f,
                       {a.data<float>(), 0, sa, a.dim(-1)}, {b.data<float>(), 0, sb, b.dim(-1)},
                       0.0f, {out.data<float>(), 0, m * n, n});
  return out;
}

namespace {

// The mask's element stride for each dimension of `shape` (0 where it broadcasts).
std::vector<int64_t> broadcast_strides(const Shape& mask, const Shape& shape, const char* who) {
  DTRAIN_CHECK(mask.rank() <= shape.rank(), who, ": mask ", mask.to_string(),
               " has more dimensions than the scores ", shape.to_string());
  std::vector<int64_t> strides(shape.rank(), 0);
  int64_t stride = 1;
  for (int d = mask.rank() - 1; d >= 0; --d) {
    const int sd = d + shape.rank() - mask.rank();
    const int64_t md = mask[d];
    DTRAIN_CHECK(md == 1 || md == shape[sd], who, ": mask ", mask.to_string(),
                 " does not broadcast to the scores ", shape.to_string());
    strides[sd] = md == 1 ? 0 : stride;
    stride *= md;
  }
  return strides;
}

}  // namespace

Tensor masked_softmax(const Tensor& x, const Tensor& mask, const MaskedSoftmaxOptions& options,
                      const char* who) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() >= 2, who,
               ": expected float32 scores of rank >= 2, got ",
               x.defined() ? x.shape().to_string() : "undefined");
  const int64_t t_len = x.dim(-2), s_len = x.dim(-1);
  const int64_t rows = s_len == 0 ? 0 : x.num_elements() / s_len;
  Tensor y(x.shape());
  if (rows == 0) return y;
  // The mask as float32 (bool read as bytes), with its strides against x.
  Tensor m;
  std::vector<int64_t> strides;
  if (mask.defined()) {
    strides = broadcast_strides(mask.shape(), x.shape(), who);
    if (options.additive) {
      DTRAIN_CHECK(mask.dtype() == DType::kFloat32, who, ": an additive mask must be float32, got ",
                   dtype_name(mask.dtype()));
      m = mask;
    } else {
      m = mask_as_float(mask);
    }
  }
  const float* pm = m.defined() ? m.data<float>() : nullptr;
  const int rank = x.rank();
  std::vector<int64_t> index(rank - 1, 0);  // multi-index of the current row
  int64_t mask_row = 0;                     // its offset into the mask
  const int64_t mask_col = pm ? strides[rank - 1] : 0;
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const float scale = options.scale;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * s_len;
    float* yr = py + r * s_len;
    const int64_t t = r % t_len;
    // Causal: keys after the query position are masked (Keras's lower-triangular mask).
    const int64_t visible =
        options.causal ? std::clamp<int64_t>(t + 1 + options.causal_offset, 0, s_len) : s_len;
    // Fast path: only the visible keys are read. A causally masked key's e^(v − max) is exactly
    // 0 in float once some visible key is unmasked (its score is 1e9 below), so those are
    // written as 0 unread. A row whose visible keys are all masked takes the full pass below.
    bool done = false;
    if (visible > 0) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < visible; ++s) {
        float v = xr[s] * scale;
        if (pm) {
          const float mv = pm[mask_row + s * mask_col];
          v = options.additive ? v + mv : (mv != 0.0f ? v : v + kMaskedScore);
        }
        yr[s] = v;
        mx = std::max(mx, v);
      }
      if (visible == s_len || mx > 0.5f * kMaskedScore) {
        if (!std::isfinite(mx)) mx = 0;
        const float inv = static_cast<float>(1.0 / vmath::exp_shifted_sum(yr, visible, mx));
        for (int64_t s = 0; s < visible; ++s) yr[s] *= inv;
        std::fill(yr + visible, yr + s_len, 0.0f);
        done = true;
      }
    }
    if (!done) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < s_len; ++s) {
        float v = xr[s] * scale;
        if (pm) {
          const float mv = pm[mask_row + s * mask_col];
          v = options.additive ? v + mv : (mv != 0.0f ? v : v + kMaskedScore);
        }
        if (s >= visible) v += kMaskedScore;
        yr[s] = v;
        mx = std::max(mx, v);
      }
      if (!std::isfinite(mx)) mx = 0;
      const float inv = static_cast<float>(1.0 / vmath::exp_shifted_sum(yr, s_len, mx));
      for (int64_t s = 0; s < s_len; ++s) yr[s] *= inv;
    }
    if (pm) {
      // Advance the row's multi-index and its mask offset.
      for (int d = rank - 2; d >= 0; --d) {
        mask_row += strides[d];
        if (++index[d] < x.dim(d)) break;
        mask_row -= strides[d] * x.dim(d);
        index[d] = 0;
      }
    }
  }
  return y;
}

void masked_softmax_backward_inplace(const Tensor& y, Tensor& dy, float scale) {
  const int64_t s_len = y.dim(-1);
  const int64_t rows = s_len == 0 ? 0 : y.num_elements() / s_len;
  const float* py = y.data<float>();
  float* pd = dy.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = py + r * s_len;
    float* dr = pd + r * s_len;
    const float d = static_cast<float>(vmath::dot(dr, yr, s_len));
    for (int64_t s = 0; s < s_len; ++s) dr[s] = scale * yr[s] * (dr[s] - d);
  }
}

}  // namespace dtrain::ops
