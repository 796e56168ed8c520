// Concatenation and slicing along an axis: each is a copy of contiguous blocks, the tensor seen
// as [outer, n, inner] around the axis.
#include "dtrain/ops/array_ops.h"

#include <cstring>

#include "dtrain/core/error.h"

namespace dtrain::ops {

namespace {

// Product of the dimensions before / after `axis`.
int64_t outer_of(const Shape& s, int axis) {
  int64_t n = 1;
  for (int i = 0; i < axis; ++i) n *= s[i];
  return n;
}
int64_t inner_of(const Shape& s, int axis) {
  int64_t n = 1;
  for (int i = axis + 1; i < s.rank(); ++i) n *= s[i];
  return n;
}

}  // namespace

int normalize_axis(int axis, int rank, const char* op) {
  const int a = axis < 0 ? axis + rank : axis;
  DTRAIN_CHECK(a >= 0 && a < rank, op, ": axis ", axis, " is out of range for a tensor of rank ",
               rank);
  return a;
}

Tensor concat(std::span<const Tensor> xs, int axis) {
  DTRAIN_CHECK(!xs.empty(), "concat: needs at least one tensor");
  const Shape& first = xs[0].shape();
  const int a = normalize_axis(axis, first.rank(), "concat");
  Shape out_shape = first;
  out_shape[a] = 0;
  for (const Tensor& x : xs) {
    DTRAIN_CHECK(x.dtype() == DType::kFloat32, "concat: expects float32 tensors");
    bool ok = x.rank() == first.rank();
    for (int i = 0; ok && i < first.rank(); ++i) ok = i == a || x.dim(i) == first[i];
    DTRAIN_CHECK(ok, "concat: shapes ", first.to_string(), " and ", x.shape().to_string(),
                 " differ outside axis ", axis);
    out_shape[a] += x.dim(a);
  }
  Tensor out(out_shape);
  const int64_t outer = outer_of(out_shape, a), inner = inner_of(out_shape, a);
  const int64_t row = out_shape[a] * inner;
  float* po = out.data<float>();
  int64_t offset = 0;
  for (const Tensor& x : xs) {
    const int64_t block = x.dim(a) * inner;
    const float* px = x.data<float>();
    if (block > 0) {
      for (int64_t o = 0; o < outer; ++o) {
        std::memcpy(po + o * row + offset, px + o * block, static_cast<size_t>(block) * 4);
      }
    }
    offset += block;
  }
  return out;
}

Tensor slice_axis(const Tensor& x, int axis, int64_t begin, int64_t size) {
  const int a = normalize_axis(axis, x.rank(), "slice");
  DTRAIN_CHECK(begin >= 0 && size >= 0 && begin + size <= x.dim(a), "slice: [", begin, ", ",
               begin + size, ") is out of range for dimension ", a, " of shape ",
               x.shape().to_string());
  Shape out_shape = x.shape();
  out_shape[a] = size;
  Tensor out(out_shape);
  const int64_t outer = outer_of(x.shape(), a), inner = inner_of(x.shape(), a);
  const int64_t row = x.dim(a) * inner, block = size * inner;
  const float* px = x.data<float>();
  float* po = out.data<float>();
  if (block > 0) {
    for (int64_t o = 0; o < outer; ++o) {
      std::memcpy(po + o * block, px + o * row + begin * inner, static_cast<size_t>(block) * 4);
    }
  }
  return out;
}

void add_slice_inplace(Tensor& out, const Tensor& g, int axis, int64_t begin) {
  const int a = normalize_axis(axis, out.rank(), "slice gradient");
  const int64_t outer = outer_of(out.shape(), a), inner = inner_of(out.shape(), a);
  const int64_t row = out.dim(a) * inner, block = g.dim(a) * inner;
  const float* pg = g.data<float>();
  float* po = out.data<float>();
  for (int64_t o = 0; o < outer; ++o) {
    float* dst = po + o * row + begin * inner;
    const float* src = pg + o * block;
    for (int64_t i = 0; i < block; ++i) dst[i] += src[i];
  }
}

}  // namespace dtrain::ops
