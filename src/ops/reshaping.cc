// Layout kernels: index arithmetic over row-major strides; the innermost axis is copied as a run.
#include "dtrain/ops/reshaping.h"

#include <algorithm>
#include <cstring>

namespace dtrain::ops {
namespace {

void check_float(const Tensor& x, const char* fn) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32, fn, ": expected a float32 tensor");
}

void strides_of(const Shape& s, int64_t* st) {
  int64_t acc = 1;
  for (int d = s.rank() - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= s[d];
  }
}

// Copies between a small tensor and the window at `offset` of a big one (to the big one when
// into_big), one innermost run at a time.
void copy_window(const float* small_src, float* small_dst, const Shape& small, float* big_dst,
                 const float* big_src, const Shape& big, const Shape& offset, bool into_big) {
  const int rank = small.rank();
  if (small.num_elements() == 0) return;
  int64_t bst[Shape::kMaxRank];
  strides_of(big, bst);
  const int64_t run = rank == 0 ? 1 : small[rank - 1];
  const int64_t rows = rank == 0 ? 1 : small.num_elements() / run;
  int64_t idx[Shape::kMaxRank] = {};
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int d = 0; d < rank; ++d) off += (idx[d] + offset[d]) * bst[d];
    if (into_big) {
      std::memcpy(big_dst + off, small_src + r * run, static_cast<size_t>(run) * sizeof(float));
    } else {
      std::memcpy(small_dst + r * run, big_src + off, static_cast<size_t>(run) * sizeof(float));
    }
    for (int d = rank - 2; d >= 0; --d) {
      if (++idx[d] < small[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

Tensor transpose(const Tensor& x, std::span<const int> perm) {
  check_float(x, "transpose");
  const int rank = x.rank();
  DTRAIN_CHECK(static_cast<int>(perm.size()) == rank, "transpose: permutation of ", perm.size(),
               " axes for a tensor of shape ", x.shape().to_string());
  bool seen[Shape::kMaxRank] = {};
  Shape out_shape;
  for (int p : perm) {
    DTRAIN_CHECK(p >= 0 && p < rank && !seen[p], "transpose: not a permutation of 0..", rank - 1);
    seen[p] = true;
    out_shape.push_back(x.dim(p));
  }
  Tensor out(out_shape);
  int64_t xst[Shape::kMaxRank];
  strides_of(x.shape(), xst);
  int64_t st[Shape::kMaxRank];  // x's stride along each output axis
  for (int d = 0; d < rank; ++d) st[d] = xst[perm[d]];
  const float* px = x.data<float>();
  float* po = out.data<float>();
  int64_t idx[Shape::kMaxRank] = {};
  const int64_t n = out.num_elements();
  const int64_t last = rank == 0 ? 1 : out_shape[rank - 1];
  const int64_t last_stride = rank == 0 ? 0 : st[rank - 1];
  for (int64_t i = 0; i < n; i += last) {
    int64_t off = 0;
    for (int d = 0; d + 1 < rank; ++d) off += idx[d] * st[d];
    for (int64_t j = 0; j < last; ++j) po[i + j] = px[off + j * last_stride];
    for (int d = rank - 2; d >= 0; --d) {
      if (++idx[d] < out_shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

Tensor pad(const Tensor& x, const Shape& before, const Shape& after) {
  check_float(x, "pad");
  DTRAIN_CHECK(before.rank() == x.rank() && after.rank() == x.rank(), "pad: paddings for ",
               before.rank(), " axes, tensor of shape ", x.shape().to_string());
  Shape out_shape;
  for (int d = 0; d < x.rank(); ++d) {
    DTRAIN_CHECK(before[d] >= 0 && after[d] >= 0, "pad: negative padding");
    out_shape.push_back(before[d] + x.dim(d) + after[d]);
  }
  Tensor out(out_shape);
  std::fill_n(out.data<float>(), out.num_elements(), 0.0f);
  copy_window(x.data<float>(), nullptr, x.shape(), out.data<float>(), nullptr, out_shape, before,
              true);
  return out;
}

Tensor crop(const Tensor& x, const Shape& begin, const Shape& size) {
  check_float(x, "crop");
  DTRAIN_CHECK(begin.rank() == x.rank() && size.rank() == x.rank(), "crop: window of rank ",
               size.rank(), " for a tensor of shape ", x.shape().to_string());
  for (int d = 0; d < x.rank(); ++d) {
    DTRAIN_CHECK(begin[d] >= 0 && size[d] >= 0 && begin[d] + size[d] <= x.dim(d), "crop: window ",
                 begin.to_string(), " + ", size.to_string(), " outside ", x.shape().to_string());
  }
  Tensor out(size);
  copy_window(nullptr, out.data<float>(), size, nullptr, x.data<float>(), x.shape(), begin, false);
  return out;
}

Tensor repeat_elements(const Tensor& x, int axis, int64_t k) {
  check_float(x, "repeat_elements");
  const int a = axis < 0 ? axis + x.rank() : axis;
  DTRAIN_CHECK(a >= 0 && a < x.rank() && k >= 1, "repeat_elements: axis ", axis, " and factor ", k,
               " for a tensor of shape ", x.shape().to_string());
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= x.dim(d);
  for (int d = a + 1; d < x.rank(); ++d) inner *= x.dim(d);
  const int64_t n = x.dim(a);
  Shape out_shape = x.shape();
  out_shape[a] = n * k;
  Tensor out(out_shape);
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < n; ++i) {
      const float* src = px + (o * n + i) * inner;
      for (int64_t r = 0; r < k; ++r) {
        std::memcpy(po + ((o * n + i) * k + r) * inner, src,
                    static_cast<size_t>(inner) * sizeof(float));
      }
    }
  }
  return out;
}

Tensor sum_repeats(const Tensor& g, int axis, int64_t k) {
  check_float(g, "sum_repeats");
  const int a = axis < 0 ? axis + g.rank() : axis;
  DTRAIN_CHECK(a >= 0 && a < g.rank() && k >= 1 && g.dim(a) % k == 0, "sum_repeats: axis ", axis,
               " and factor ", k, " for a tensor of shape ", g.shape().to_string());
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= g.dim(d);
  for (int d = a + 1; d < g.rank(); ++d) inner *= g.dim(d);
  const int64_t n = g.dim(a) / k;
  Shape out_shape = g.shape();
  out_shape[a] = n;
  Tensor out(out_shape);
  const float* pg = g.data<float>();
  float* po = out.data<float>();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < n; ++i) {
      float* dst = po + (o * n + i) * inner;
      std::copy_n(pg + ((o * n + i) * k) * inner, inner, dst);
      for (int64_t r = 1; r < k; ++r) {
        const float* src = pg + ((o * n + i) * k + r) * inner;
        for (int64_t j = 0; j < inner; ++j) dst[j] += src[j];
      }
    }
  }
  return out;
}

}  // namespace dtrain::ops
