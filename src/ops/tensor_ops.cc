// Float32 kernels. Loops are written so that g++ -O3 vectorizes them; shapes are checked at the
// entry of each function and the loops trust them.
#include "dtrain/ops/tensor_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dtrain/core/parallel_for.h"
#include "dtrain/ops/gemm.h"

namespace dtrain::ops {
namespace {

void check_float(const Tensor& t, const char* fn) {
  DTRAIN_CHECK(t.defined(), fn, ": undefined tensor");
  DTRAIN_CHECK(t.dtype() == DType::kFloat32, fn, ": expected float32, got ", dtype_name(t.dtype()),
               " of shape ", t.shape().to_string());
}

int normalize_axis(int axis, int rank, const char* fn) {
  const int a = axis < 0 ? axis + rank : axis;
  DTRAIN_CHECK(a >= 0 && a < rank, fn, ": axis ", axis, " out of range for rank ", rank);
  return a;
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const int rank = std::max(a.rank(), b.rank());
  Shape out;
  for (int i = 0; i < rank; ++i) {
    const int ia = a.rank() - rank + i, ib = b.rank() - rank + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    DTRAIN_CHECK(da == db || da == 1 || db == 1, "broadcast: incompatible shapes ", a.to_string(),
                 " and ", b.to_string());
    out.push_back(da == 1 ? db : da);
  }
  return out;
}

namespace {

// Whether `inner`, without its leading 1s, equals the last dimensions of `outer` (so that
// `inner` repeats unchanged over outer's leading dimensions).
bool trailing_dims_match(const Shape& inner, const Shape& outer) {
  int first = 0;
  while (first < inner.rank() && inner[first] == 1) ++first;
  const int k = inner.rank() - first;
  if (k > outer.rank()) return false;
  for (int i = 0; i < k; ++i) {
    if (inner[first + i] != outer[outer.rank() - k + i]) return false;
  }
  return true;
}

template <class F>
void binary_loop(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  const int64_t n = out.num_elements();
  // The elementwise cases split over elements (or rows), each computed alone.
  if (a.shape() == b.shape()) {
    parallel_for(n, kParallelGrainElements, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = f(pa[i], pb[i]);
    });
    return;
  }
  if (b.num_elements() == 1 && a.num_elements() == n) {
    const float s = pb[0];
    parallel_for(n, kParallelGrainElements, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = f(pa[i], s);
    });
    return;
  }
  if (a.num_elements() == 1 && b.num_elements() == n) {
    const float s = pa[0];
    parallel_for(n, kParallelGrainElements, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = f(s, pb[i]);
    });
    return;
  }
  // b broadcasts over the leading dimensions of a (bias-like: a [..., c], b [c] or [1, c]; or a
  // [B, T, d], b [T, d]): rows of b's size.
  if (a.num_elements() == n && b.num_elements() > 0 &&
      trailing_dims_match(b.shape(), out.shape())) {
    const int64_t c = b.num_elements(), rows = n / c;
    parallel_for(rows, grain_for(c), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t j = 0; j < c; ++j) po[r * c + j] = f(pa[r * c + j], pb[j]);
      }
    });
    return;
  }
  // General case: walk the output with per-operand strides (0 on broadcast dimensions).
  const Shape& os = out.shape();
  const int rank = os.rank();
  int64_t sa[Shape::kMaxRank] = {}, sb[Shape::kMaxRank] = {};
  {
    int64_t ta = 1, tb = 1;
    for (int i = rank - 1; i >= 0; --i) {
      const int ia = a.rank() - rank + i, ib = b.rank() - rank + i;
      const int64_t da = ia >= 0 ? a.shape()[ia] : 1, db = ib >= 0 ? b.shape()[ib] : 1;
      sa[i] = da == 1 ? 0 : ta;
      sb[i] = db == 1 ? 0 : tb;
      ta *= da;
      tb *= db;
    }
  }
  int64_t idx[Shape::kMaxRank] = {};
  int64_t oa = 0, ob = 0;
  for (int64_t i = 0; i < n; ++i) {
    po[i] = f(pa[oa], pb[ob]);
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < os[d]) {
        oa += sa[d];
        ob += sb[d];
        break;
      }
      oa -= sa[d] * (os[d] - 1);
      ob -= sb[d] * (os[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  check_float(a, "binary op");
  check_float(b, "binary op");
  Tensor out(broadcast_shapes(a.shape(), b.shape()));
  switch (op) {
    case BinaryOp::kAdd:
      binary_loop(a, b, out, [](float x, float y) { return x + y; });
      break;
    case BinaryOp::kSub:
      binary_loop(a, b, out, [](float x, float y) { return x - y; });
      break;
    case BinaryOp::kMul:
      binary_loop(a, b, out, [](float x, float y) { return x * y; });
      break;
    case BinaryOp::kDiv:
      binary_loop(a, b, out, [](float x, float y) { return x / y; });
      break;
    case BinaryOp::kMaximum:
      binary_loop(a, b, out, [](float x, float y) { return x >= y ? x : y; });
      break;
    case BinaryOp::kMinimum:
      binary_loop(a, b, out, [](float x, float y) { return x <= y ? x : y; });
      break;
    case BinaryOp::kGreaterEqual:
      binary_loop(a, b, out, [](float x, float y) { return x >= y ? 1.0f : 0.0f; });
      break;
    case BinaryOp::kLessEqual:
      binary_loop(a, b, out, [](float x, float y) { return x <= y ? 1.0f : 0.0f; });
      break;
  }
  return out;
}

Tensor reduce_to_shape(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  check_float(g, "reduce_to_shape");
  const Shape& gs = g.shape();
  DTRAIN_CHECK(broadcast_shapes(gs, shape) == gs, "reduce_to_shape: ", shape.to_string(),
               " does not broadcast to ", gs.to_string());
  Tensor out = Tensor::zeros(shape);
  if (shape.num_elements() > 0 && trailing_dims_match(shape, gs)) {
    // The sum over g's leading dimensions: per element, over the rows in order, as below.
    const int64_t c = shape.num_elements();
    column_sum(g.data<float>(), g.num_elements() / c, c, out.data<float>());
    return out;
  }
  const int rank = gs.rank();
  int64_t so[Shape::kMaxRank] = {};
  {
    int64_t t = 1;
    for (int i = rank - 1; i >= 0; --i) {
      const int is = shape.rank() - rank + i;
      const int64_t d = is >= 0 ? shape[is] : 1;
      so[i] = d == 1 ? 0 : t;
      t *= d;
    }
  }
  const float* pg = g.data<float>();
  float* po = out.data<float>();
  int64_t idx[Shape::kMaxRank] = {};
  int64_t off = 0;
  const int64_t n = g.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    po[off] += pg[i];
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < gs[d]) {
        off += so[d];
        break;
      }
      off -= so[d] * (gs[d] - 1);
      idx[d] = 0;
    }
  }
  return out;
}

namespace {

void unary_range(UnaryOp op, const float* px, float* po, int64_t begin, int64_t end) {
  switch (op) {
    case UnaryOp::kNeg:
      for (int64_t i = begin; i < end; ++i) po[i] = -px[i];
      break;
    case UnaryOp::kExp:
      for (int64_t i = begin; i < end; ++i) po[i] = std::exp(px[i]);
      break;
    case UnaryOp::kLog:
      for (int64_t i = begin; i < end; ++i) po[i] = std::log(px[i]);
      break;
    case UnaryOp::kSqrt:
      for (int64_t i = begin; i < end; ++i) po[i] = std::sqrt(px[i]);
      break;
    case UnaryOp::kSquare:
      for (int64_t i = begin; i < end; ++i) po[i] = px[i] * px[i];
      break;
    case UnaryOp::kAbs:
      for (int64_t i = begin; i < end; ++i) po[i] = std::fabs(px[i]);
      break;
    case UnaryOp::kRelu:
      for (int64_t i = begin; i < end; ++i) po[i] = px[i] < 0 ? 0.0f : px[i];
      break;
    case UnaryOp::kSigmoid:
      for (int64_t i = begin; i < end; ++i) po[i] = sigmoid_scalar(px[i]);
      break;
    case UnaryOp::kTanh:
      for (int64_t i = begin; i < end; ++i) po[i] = std::tanh(px[i]);
      break;
  }
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x) {
  check_float(x, "unary op");
  Tensor out(x.shape());
  const float* px = x.data<float>();
  float* po = out.data<float>();
  // Elementwise: ranges of elements on parallel_for's threads (the libm calls cost about eight).
  const bool cheap =
      op == UnaryOp::kNeg || op == UnaryOp::kSquare || op == UnaryOp::kAbs || op == UnaryOp::kRelu;
  parallel_for(x.num_elements(), cheap ? kParallelGrainElements : kParallelGrainElements / 8,
               [&](int64_t begin, int64_t end) { unary_range(op, px, po, begin, end); });
  return out;
}

Tensor affine(const Tensor& x, float alpha, float beta) {
  check_float(x, "affine");
  Tensor out(x.shape());
  const float* px = x.data<float>();
  float* po = out.data<float>();
  parallel_for(x.num_elements(), kParallelGrainElements, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) po[i] = px[i] * alpha + beta;
  });
  return out;
}

Tensor clip(const Tensor& x, float lo, float hi) {
  check_float(x, "clip");
  Tensor out(x.shape());
  const float* px = x.data<float>();
  float* po = out.data<float>();
  parallel_for(x.num_elements(), kParallelGrainElements, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) po[i] = std::min(std::max(px[i], lo), hi);
  });
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  check_float(a, "matmul");
  check_float(b, "matmul");
  DTRAIN_CHECK(a.rank() == 2 && b.rank() == 2, "matmul: expected rank-2 operands, got ",
               a.shape().to_string(), " and ", b.shape().to_string());
  const int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  const int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  const int64_t kb = transpose_b ? b.dim(1) : b.dim(0);
  const int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  DTRAIN_CHECK(k == kb, "matmul: inner dimensions differ: ", a.shape().to_string(),
               transpose_a ? "ᵀ" : "", " · ", b.shape().to_string(), transpose_b ? "ᵀ" : "");
  Tensor out(Shape{m, n});
  if (k == 0) {
    out.fill(0);
    return out;
  }
  gemm(transpose_a, transpose_b, m, n, k, 1.0f, a.data<float>(), a.dim(1), b.data<float>(),
       b.dim(1), 0.0f, out.data<float>(), n);
  return out;
}

void bias_add_inplace(Tensor& y, const Tensor& b) {
  check_float(y, "bias_add");
  check_float(b, "bias_add");
  const int64_t cols = y.dim(-1);
  DTRAIN_CHECK(b.num_elements() == cols, "bias_add: bias of shape ", b.shape().to_string(),
               " does not match the last dimension of ", y.shape().to_string());
  float* py = y.data<float>();
  const float* pb = b.data<float>();
  const int64_t rows = y.num_elements() / std::max<int64_t>(cols, 1);
  parallel_for(rows, grain_for(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* yr = py + r * cols;
      for (int64_t c = 0; c < cols; ++c) yr[c] += pb[c];
    }
  });
}

void column_sum(const float* x, int64_t rows, int64_t cols, float* out) {
  // Each thread sums its own columns over every row in row order: the single-thread order.
  parallel_for(cols, std::max<int64_t>(16, grain_for(rows)), [&](int64_t c0, int64_t c1) {
    std::fill(out + c0, out + c1, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      for (int64_t c = c0; c < c1; ++c) out[c] += xr[c];
    }
  });
}

Tensor reduce_sum(const Tensor& x, std::optional<int> axis, bool keepdims) {
  check_float(x, "reduce_sum");
  const float* px = x.data<float>();
  if (!axis) {
    double s = 0;
    for (int64_t i = 0, n = x.num_elements(); i < n; ++i) s += px[i];
    Shape shape;
    if (keepdims) {
      for (int i = 0; i < x.rank(); ++i) shape.push_back(1);
    }
    return Tensor::full(shape, s);
  }
  const int a = normalize_axis(*axis, x.rank(), "reduce_sum");
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < a; ++i) outer *= x.shape()[i];
  for (int i = a + 1; i < x.rank(); ++i) inner *= x.shape()[i];
  const int64_t len = x.shape()[a];
  Shape shape;
  for (int i = 0; i < x.rank(); ++i) {
    if (i != a) {
      shape.push_back(x.shape()[i]);
    } else if (keepdims) {
      shape.push_back(1);
    }
  }
  Tensor out = Tensor::zeros(shape);
  float* po = out.data<float>();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t l = 0; l < len; ++l) {
      const float* src = px + (o * len + l) * inner;
      float* dst = po + o * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] += src[i];
    }
  }
  return out;
}

Tensor reduce_mean(const Tensor& x, std::optional<int> axis, bool keepdims) {
  Tensor s = reduce_sum(x, axis, keepdims);
  const int64_t count =
      axis ? x.shape()[normalize_axis(*axis, x.rank(), "reduce_mean")] : x.num_elements();
  float* p = s.data<float>();
  const float inv = count == 0 ? std::numeric_limits<float>::quiet_NaN() : 1.0f / count;
  for (int64_t i = 0, n = s.num_elements(); i < n; ++i) p[i] *= inv;
  return s;
}

Tensor expand_reduced(const Tensor& g, const Shape& shape, std::optional<int> axis) {
  check_float(g, "expand_reduced");
  Tensor out(shape);
  float* po = out.data<float>();
  const float* pg = g.data<float>();
  if (!axis) {
    std::fill_n(po, out.num_elements(), pg[0]);
    return out;
  }
  const int a = normalize_axis(*axis, shape.rank(), "expand_reduced");
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < a; ++i) outer *= shape[i];
  for (int i = a + 1; i < shape.rank(); ++i) inner *= shape[i];
  const int64_t len = shape[a];
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t l = 0; l < len; ++l) {
      std::copy_n(pg + o * inner, inner, po + (o * len + l) * inner);
    }
  }
  return out;
}

Tensor softmax(const Tensor& x) {
  check_float(x, "softmax");
  DTRAIN_CHECK(x.rank() >= 1, "softmax: needs rank >= 1");
  Tensor out(x.shape());
  const int64_t cols = x.dim(-1);
  softmax_rows(x.data<float>(), out.data<float>(), x.num_elements() / std::max<int64_t>(cols, 1),
               cols, false);
  return out;
}

Tensor log_softmax(const Tensor& x) {
  check_float(x, "log_softmax");
  DTRAIN_CHECK(x.rank() >= 1, "log_softmax: needs rank >= 1");
  Tensor out(x.shape());
  const int64_t cols = x.dim(-1);
  softmax_rows(x.data<float>(), out.data<float>(), x.num_elements() / std::max<int64_t>(cols, 1),
               cols, true);
  return out;
}

Tensor argmax(const Tensor& x) {
  check_float(x, "argmax");
  DTRAIN_CHECK(x.rank() >= 1 && x.dim(-1) > 0, "argmax: needs a non-empty last axis, got ",
               x.shape().to_string());
  const int64_t cols = x.dim(-1), rows = x.num_elements() / cols;
  Shape shape;
  for (int i = 0; i + 1 < x.rank(); ++i) shape.push_back(x.shape()[i]);
  Tensor out(DType::kInt64, shape);
  const float* px = x.data<float>();
  int64_t* po = out.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * cols;
    int64_t best = 0;
    for (int64_t c = 1; c < cols; ++c) {
      if (xr[c] > xr[best]) best = c;
    }
    po[r] = best;
  }
  return out;
}

namespace {
template <class F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      f(float{});
      return;
    case DType::kFloat64:
      f(double{});
      return;
    case DType::kInt32:
      f(int32_t{});
      return;
    case DType::kInt64:
      f(int64_t{});
      return;
    case DType::kUInt8:
      f(uint8_t{});
      return;
    case DType::kInt8:
      f(int8_t{});
      return;
    case DType::kInt16:
      f(int16_t{});
      return;
    case DType::kUInt16:
      f(uint16_t{});
      return;
    case DType::kUInt32:
      f(uint32_t{});
      return;
    case DType::kUInt64:
      f(uint64_t{});
      return;
    case DType::kBool:
      f(bool{});
      return;
    default:
      throw InvalidArgumentError(str_cat("unsupported dtype ", dtype_name(dtype)));
  }
}
}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  DTRAIN_CHECK(x.defined(), "cast: undefined tensor");
  if (x.dtype() == dtype) return x;
  Tensor out(dtype, x.shape());
  const int64_t n = x.num_elements();
  dispatch(x.dtype(), [&](auto src_zero) {
    using S = decltype(src_zero);
    dispatch(dtype, [&](auto dst_zero) {
      using D = decltype(dst_zero);
      const S* ps = static_cast<const S*>(x.raw_data());
      D* pd = static_cast<D*>(out.raw_data());
      for (int64_t i = 0; i < n; ++i) pd[i] = static_cast<D>(ps[i]);
    });
  });
  return out;
}

double value_at(const Tensor& x, int64_t i) {
  double v = 0;
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    v = static_cast<double>(static_cast<const T*>(x.raw_data())[i]);
  });
  return v;
}

int64_t label_at(const Tensor& labels, int64_t i) {
  switch (labels.dtype()) {
    case DType::kUInt8:
      return static_cast<const uint8_t*>(labels.raw_data())[i];
    case DType::kInt32:
      return static_cast<const int32_t*>(labels.raw_data())[i];
    case DType::kInt64:
      return static_cast<const int64_t*>(labels.raw_data())[i];
    case DType::kFloat32: {
      const float v = static_cast<const float*>(labels.raw_data())[i];
      return std::isfinite(v) && v == std::floor(v) ? static_cast<int64_t>(v) : -1;
    }
    case DType::kFloat64: {
      const double v = static_cast<const double*>(labels.raw_data())[i];
      return std::isfinite(v) && v == std::floor(v) ? static_cast<int64_t>(v) : -1;
    }
    case DType::kInt8:
      return static_cast<const int8_t*>(labels.raw_data())[i];
    case DType::kInt16:
      return static_cast<const int16_t*>(labels.raw_data())[i];
    case DType::kUInt16:
      return static_cast<const uint16_t*>(labels.raw_data())[i];
    case DType::kUInt32:
      return static_cast<const uint32_t*>(labels.raw_data())[i];
    default:
      throw InvalidArgumentError(str_cat("labels: unsupported dtype ", dtype_name(labels.dtype())));
  }
}

bool all_finite(const Tensor& x) {
  if (x.dtype() != DType::kFloat32) return true;
  const float* p = x.data<float>();
  bool ok = true;
  for (int64_t i = 0, n = x.num_elements(); i < n; ++i) ok &= std::isfinite(p[i]);
  return ok;
}

}  // namespace dtrain::ops
