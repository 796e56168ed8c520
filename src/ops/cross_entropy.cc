// The softmax cross-entropy kernels from logits (sparse and dense labels) and `pick`, declared in
// dtrain/ops/tensor_ops.h. Rows are independent: the log-softmax and the probabilities split
// over rows and elements on parallel_for's threads; labels are checked before anything splits.
#include <cmath>

#include "dtrain/core/error.h"
#include "dtrain/core/parallel_for.h"
#include "dtrain/ops/activations.h"
#include "dtrain/ops/tensor_ops.h"

namespace dtrain::ops {

namespace {

// As tensor_ops.cc's: a defined float32 tensor.
void check_float(const Tensor& t, const char* fn) {
  DTRAIN_CHECK(t.defined(), fn, ": undefined tensor");
  DTRAIN_CHECK(t.dtype() == DType::kFloat32, fn, ": expected float32, got ", dtype_name(t.dtype()),
               " of shape ", t.shape().to_string());
}

void check_sparse_labels(const Tensor& x, const Tensor& labels, const char* fn) {
  DTRAIN_CHECK(x.rank() == 2, fn, ": expected predictions of rank 2 [batch, classes], got ",
               x.shape().to_string());
  DTRAIN_CHECK(labels.defined(), fn, ": undefined labels");
  DTRAIN_CHECK(labels.num_elements() == x.dim(0), fn, ": ", labels.num_elements(),
               " labels (shape ", labels.shape().to_string(), ") for a batch of ", x.dim(0),
               " predictions");
}
int64_t checked_label(const Tensor& labels, int64_t b, int64_t classes, const char* fn) {
  const int64_t y = label_at(labels, b);
  DTRAIN_CHECK(y >= 0 && y < classes, fn, ": label ", y, " of example ", b,
               " is outside the valid range [0, ", classes, ")");
  return y;
}
}  // namespace

Tensor sparse_softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Tensor* probs) {
  check_float(logits, "sparse_softmax_cross_entropy");
  check_sparse_labels(logits, labels, "sparse_softmax_cross_entropy");
  const int64_t batch = logits.dim(0), classes = logits.dim(1);
  Tensor lsm(logits.shape());
  softmax_rows(logits.data<float>(), lsm.data<float>(), batch, classes, true);
  Tensor loss(Shape{batch});
  float* pl = loss.data<float>();
  const float* ps = lsm.data<float>();
  for (int64_t b = 0; b < batch; ++b) {
    pl[b] = -ps[b * classes + checked_label(labels, b, classes, "sparse_softmax_cross_entropy")];
  }
  if (probs) {
    float* pp = lsm.data<float>();
    parallel_for(lsm.num_elements(), kParallelGrainElements / 8, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) pp[i] = std::exp(pp[i]);
    });
    *probs = std::move(lsm);
  }
  return loss;
}

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Tensor* probs) {
  check_float(logits, "softmax_cross_entropy");
  check_float(labels, "softmax_cross_entropy");
  DTRAIN_CHECK(logits.rank() == 2 && labels.shape() == logits.shape(),
               "softmax_cross_entropy: labels ", labels.shape().to_string(), " and logits ",
               logits.shape().to_string(), " must both be [batch, classes]");
  const int64_t batch = logits.dim(0), classes = logits.dim(1);
  Tensor lsm(logits.shape());
  softmax_rows(logits.data<float>(), lsm.data<float>(), batch, classes, true);
  Tensor loss(Shape{batch});
  const float* ps = lsm.data<float>();
  const float* py = labels.data<float>();
  float* pl = loss.data<float>();
  for (int64_t b = 0; b < batch; ++b) {
    float s = 0;
    for (int64_t c = 0; c < classes; ++c) s -= py[b * classes + c] * ps[b * classes + c];
    pl[b] = s;
  }
  if (probs) {
    float* pp = lsm.data<float>();
    parallel_for(lsm.num_elements(), kParallelGrainElements / 8, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) pp[i] = std::exp(pp[i]);
    });
    *probs = std::move(lsm);
  }
  return loss;
}

Tensor pick(const Tensor& x, const Tensor& labels) {
  check_float(x, "pick");
  check_sparse_labels(x, labels, "pick");
  const int64_t batch = x.dim(0), classes = x.dim(1);
  Tensor out(Shape{batch});
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t b = 0; b < batch; ++b) {
    po[b] = px[b * classes + checked_label(labels, b, classes, "sparse categorical loss")];
  }
  return out;
}

}  // namespace dtrain::ops
