// Embedding lookup and its gradient.
#include "dtrain/ops/embedding.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/core/parallel_for.h"
#include "dtrain/ops/tensor_ops.h"

namespace dtrain::ops {
namespace {

// "[1, 3]": the multi-index of flat position p in `shape`.
std::string position(const Shape& shape, int64_t p) {
  std::vector<int64_t> idx(shape.rank());
  for (int d = shape.rank() - 1; d >= 0; --d) {
    idx[d] = shape[d] == 0 ? 0 : p % shape[d];
    p = shape[d] == 0 ? 0 : p / shape[d];
  }
  std::string out = "[";
  for (size_t d = 0; d < idx.size(); ++d) out += (d ? ", " : "") + std::to_string(idx[d]);
  return out + "]";
}

}  // namespace

namespace {

[[noreturn]] void throw_bad_id(const Tensor& ids, int64_t p, int64_t vocab,
                               const std::string& who) {
  const bool is_float = ids.dtype() == DType::kFloat32 || ids.dtype() == DType::kFloat64;
  const double v = value_at(ids, p);
  if (is_float && !(std::isfinite(v) && v == std::floor(v))) {
    throw InvalidArgumentError(str_cat(who, ": id ", v, " at position ", position(ids.shape(), p),
                                       " of the ids ", ids.shape().to_string(),
                                       " is not an integer"));
  }
  throw InvalidArgumentError(str_cat(who, ": id ", static_cast<int64_t>(v), " at position ",
                                     position(ids.shape(), p), " of the ids ",
                                     ids.shape().to_string(), " is outside [0, ", vocab, ")"));
}

}  // namespace

Tensor embedding_lookup(const Tensor& table, const Tensor& ids, const std::string& who) {
  DTRAIN_CHECK(table.defined() && table.dtype() == DType::kFloat32 && table.rank() == 2, who,
               ": expected a float32 table [vocab, dim], got ",
               table.defined() ? table.shape().to_string() : "undefined");
  DTRAIN_CHECK(ids.defined(), who, ": ids are undefined");
  const int64_t vocab = table.dim(0), dim = table.dim(1), n = ids.num_elements();
  Shape out_shape = ids.shape();
  out_shape.push_back(dim);
  Tensor out(out_shape);
  const float* pt = table.data<float>();
  float* po = out.data<float>();
  // Every id is checked before the copies split over positions (a range must not throw).
  for (int64_t p = 0; p < n; ++p) {
    const int64_t id = label_at(ids, p);
    if (id < 0 || id >= vocab) throw_bad_id(ids, p, vocab, who);
  }
  parallel_for(n, grain_for(dim), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      std::copy_n(pt + label_at(ids, p) * dim, dim, po + p * dim);
  });
  return out;
}

Tensor embedding_gradient(const Tensor& g, const Tensor& ids, int64_t vocab) {
  const int64_t dim = g.dim(-1), n = ids.num_elements();
  Tensor dt = Tensor::zeros(Shape{vocab, dim});
  float* pd = dt.data<float>();
  const float* pg = g.data<float>();
  // Split over columns: each thread adds its columns of every position, in position order (an
  // id's row sums its positions in the order one thread would).
  parallel_for(dim, std::max<int64_t>(16, grain_for(n)), [&](int64_t j0, int64_t j1) {
    for (int64_t p = 0; p < n; ++p) {
      float* row = pd + label_at(ids, p) * dim;
      const float* gr = pg + p * dim;
      for (int64_t j = j0; j < j1; ++j) row[j] += gr[j];
    }
  });
  return dt;
}

}  // namespace dtrain::ops
