// Keras metrics; see dtrain/nn/metrics.h. Raw loops over the values, never recorded on a tape.
#include "dtrain/nn/metrics.h"

#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/nn/losses.h"
#include "dtrain/ops/tensor_ops.h"
#include "label_shapes.h"

namespace dtrain::nn {
namespace {

void check_defined(const Tensor& t, const std::string& metric, const char* what) {
  DTRAIN_CHECK(t.defined(), metric, ": ", what, " is undefined");
}

using detail::drop_last;
using detail::throw_shape_mismatch;

Shape with_last_one(const Shape& s) {
  Shape out = s;
  out.push_back(1);
  return out;
}

// Same shape, or [B] against [B, 1] (Keras's squeeze_or_expand_dimensions).
bool same_up_to_trailing_one(const Shape& a, const Shape& b) {
  return a == b || detail::differ_by_trailing_one(a, b);
}

// Labels and predictions are read with ops::value_at (compared exactly, as Keras compares after
// casting to floatx), element by element: updates in the training loop allocate nothing.
void check_numeric(const Tensor& t, const std::string& metric) {
  DTRAIN_CHECK(t.dtype() != DType::kString && t.dtype() != DType::kInvalid, metric,
               ": expected a numeric tensor, got ", dtype_name(t.dtype()));
}

// Index of the largest element of row r of x [rows, cols]; the first index wins ties (tf.argmax).
int64_t row_argmax(const Tensor& x, int64_t r, int64_t cols) {
  const int64_t base = r * cols;
  int64_t best = 0;
  double best_value = ops::value_at(x, base);
  for (int64_t c = 1; c < cols; ++c) {
    const double v = ops::value_at(x, base + c);
    if (v > best_value) {
      best = c;
      best_value = v;
    }
  }
  return best;
}

// Checks per-sample weights (undefined: none) against the shape of the metric's values (or,
// `alt`, a second accepted shape) and returns them readable by weight_at.
const Tensor* sample_weights(const Tensor& w, const Shape& values, const std::string& metric,
                             const Shape* alt = nullptr) {
  if (!w.defined()) return nullptr;
  if (w.shape() != values && (alt == nullptr || w.shape() != *alt)) {
    throw InvalidArgumentError(str_cat(metric, ": sample weights (the output's mask) must have ",
                                       "the per-sample values' shape ", values.to_string(),
                                       ", got ", w.shape().to_string()));
  }
  check_numeric(w, metric);
  return &w;
}

double weight_at(const Tensor* w, int64_t i) { return w == nullptr ? 1.0 : ops::value_at(*w, i); }

}  // namespace

void Metric::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  if (sample_weight.defined()) {
    throw InvalidArgumentError(str_cat(name(), ": this metric does not take sample weights"));
  }
  update_state(y_true, y_pred);
}

// ---------------------------------------------------------------------------------------------
// Mean.

void Mean::update_state(const Tensor& values) {
  check_defined(values, name(), "values");
  check_numeric(values, name());
  double total = 0;
  for (int64_t i = 0, n = values.num_elements(); i < n; ++i) total += ops::value_at(values, i);
  add(total, static_cast<double>(values.num_elements()));
}

void Mean::update_state(const Tensor& /*y_true*/, const Tensor& y_pred) { update_state(y_pred); }

void Mean::update_state(const Tensor& /*y_true*/, const Tensor& y_pred,
                        const Tensor& sample_weight) {
  if (!sample_weight.defined()) return update_state(y_pred);
  check_defined(y_pred, name(), "values");
  check_numeric(y_pred, name());
  const Tensor* w = sample_weights(sample_weight, y_pred.shape(), name());
  double total = 0, count = 0;
  for (int64_t i = 0, n = y_pred.num_elements(); i < n; ++i) {
    total += ops::value_at(y_pred, i) * weight_at(w, i);
    count += weight_at(w, i);
  }
  add(total, count);
}

// ---------------------------------------------------------------------------------------------
// Accuracies.

void SparseCategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred,
                                             const Tensor& sample_weight) {
  check_defined(y_true, name(), "y_true");
  check_defined(y_pred, name(), "y_pred");
  DTRAIN_CHECK(y_pred.rank() >= 1 && y_pred.dim(-1) > 0, name(),
               ": y_pred must be [batch, classes], got ", y_pred.shape().to_string());
  const Shape outer = drop_last(y_pred.shape());
  if (y_true.shape() != outer && y_true.shape() != with_last_one(outer)) {
    throw_shape_mismatch(name(), y_true, y_pred,
                         str_cat("expected labels of shape ", outer.to_string(), " or ",
                                 with_last_one(outer).to_string()));
  }
  const int64_t classes = y_pred.dim(-1), rows = outer.num_elements();
  const Tensor* w = sample_weights(sample_weight, outer, name());
  double matches = 0, count = w == nullptr ? static_cast<double>(rows) : 0.0;
  if (y_pred.dtype() == DType::kFloat32) {
    // The training loop's case: read the floats in place (no conversion, no allocation).
    const float* p = y_pred.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = p + r * classes;
      int64_t best = 0;
      for (int64_t c = 1; c < classes; ++c) {
        if (row[c] > row[best]) best = c;
      }
      // label_at gives −1 for a non-integral float label, which never matches.
      if (w == nullptr) {
        matches += ops::label_at(y_true, r) == best ? 1 : 0;
      } else {
        const double wr = weight_at(w, r);
        matches += ops::label_at(y_true, r) == best ? wr : 0.0;
        count += wr;
      }
    }
  } else {
    check_numeric(y_pred, name());
    for (int64_t r = 0; r < rows; ++r) {
      const double wr = weight_at(w, r);
      matches += ops::label_at(y_true, r) == row_argmax(y_pred, r, classes) ? wr : 0.0;
      if (w != nullptr) count += wr;
    }
  }
  add(matches, count);
}

void CategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred,
                                       const Tensor& sample_weight) {
  check_defined(y_true, name(), "y_true");
  check_defined(y_pred, name(), "y_pred");
  if (y_true.shape() != y_pred.shape()) {
    throw_shape_mismatch(name(), y_true, y_pred, "expected the same shape [batch, classes]");
  }
  DTRAIN_CHECK(y_pred.rank() >= 1 && y_pred.dim(-1) > 0, name(),
               ": y_pred must be [batch, classes], got ", y_pred.shape().to_string());
  const int64_t classes = y_pred.dim(-1), rows = y_pred.num_elements() / classes;
  check_numeric(y_true, name());
  check_numeric(y_pred, name());
  const Tensor* w = sample_weight.defined()
                        ? sample_weights(sample_weight, drop_last(y_pred.shape()), name())
                        : nullptr;
  double matches = 0, count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double wr = weight_at(w, r);
    matches += row_argmax(y_true, r, classes) == row_argmax(y_pred, r, classes) ? wr : 0.0;
    count += wr;
  }
  add(matches, count);
}

void BinaryAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred,
                                  const Tensor& sample_weight) {
  check_defined(y_true, name(), "y_true");
  check_defined(y_pred, name(), "y_pred");
  if (!same_up_to_trailing_one(y_true.shape(), y_pred.shape())) {
    throw_shape_mismatch(name(), y_true, y_pred, "expected the same shape");
  }
  check_numeric(y_true, name());
  check_numeric(y_pred, name());
  // A rank-1 y_pred is B examples of one value; otherwise each row of the last axis is one.
  const int64_t n = y_pred.num_elements();
  const int64_t per_row = y_pred.rank() >= 2 ? y_pred.dim(-1) : 1;
  if (n == 0 || per_row == 0) return;
  const int64_t rows = n / per_row;
  const Tensor* w = nullptr;
  if (sample_weight.defined()) {
    w = sample_weights(sample_weight,
                       y_pred.rank() >= 2 ? drop_last(y_pred.shape()) : y_pred.shape(), name());
  }
  double total = 0, count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t hits = 0;
    for (int64_t k = 0; k < per_row; ++k) {
      const int64_t i = r * per_row + k;
      const double predicted = ops::value_at(y_pred, i) > options_.threshold ? 1.0 : 0.0;
      hits += predicted == ops::value_at(y_true, i) ? 1 : 0;
    }
    const double wr = weight_at(w, r);
    total += (per_row == 1 ? static_cast<double>(hits)
                           : static_cast<double>(hits) / static_cast<double>(per_row)) *
             wr;
    count += wr;
  }
  add(total, count);
}

void Accuracy::update_state(const Tensor& y_true, const Tensor& y_pred,
                            const Tensor& sample_weight) {
  check_defined(y_true, name(), "y_true");
  check_defined(y_pred, name(), "y_pred");
  if (!same_up_to_trailing_one(y_true.shape(), y_pred.shape())) {
    throw_shape_mismatch(name(), y_true, y_pred, "expected the same shape");
  }
  check_numeric(y_true, name());
  check_numeric(y_pred, name());
  const int64_t n = y_pred.num_elements();
  const Tensor* w = nullptr;
  if (sample_weight.defined()) {
    // [B, T, 1] predictions count per [B, T] step.
    const Shape squeezed =
        y_pred.rank() >= 1 && y_pred.dim(-1) == 1 ? drop_last(y_pred.shape()) : y_pred.shape();
    w = sample_weights(sample_weight, y_pred.shape(), name(), &squeezed);
  }
  double matches = 0, count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double wi = weight_at(w, i);
    matches += ops::value_at(y_true, i) == ops::value_at(y_pred, i) ? wi : 0.0;
    count += wi;
  }
  add(matches, count);
}

// ---------------------------------------------------------------------------------------------
// Resolution by name.

namespace {

// "accuracy" with no crossentropy loss to go by: resolved on the first batch by the rule of
// Keras's compile_utils.MetricsContainer._get_metric_object, then fixed (reset keeps it).
class ShapeResolvedAccuracy : public Metric {
 public:
  using Metric::Metric;
  void update_state(const Tensor& y_true, const Tensor& y_pred) override {
    update_state(y_true, y_pred, Tensor());
  }
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight) override {
    if (!inner_) {
      check_defined(y_true, name(), "y_true");
      check_defined(y_pred, name(), "y_pred");
      DTRAIN_CHECK(y_pred.rank() >= 1, name(), ": y_pred must have a rank of at least 1, got ",
                   y_pred.shape().to_string());
      const int64_t p_last = y_pred.dim(-1);
      const int64_t t_last = y_true.rank() >= 1 ? y_true.dim(-1) : 1;
      const bool is_binary = p_last == 1;
      const bool is_sparse = y_true.rank() < y_pred.rank() || (t_last == 1 && p_last > 1);
      if (is_binary) {
        inner_ = std::make_unique<BinaryAccuracy>(name());
      } else if (is_sparse) {
        inner_ = std::make_unique<SparseCategoricalAccuracy>(name());
      } else {
        inner_ = std::make_unique<CategoricalAccuracy>(name());
      }
    }
    inner_->update_state(y_true, y_pred, sample_weight);
  }
  double result() const override { return inner_ ? inner_->result() : 0.0; }
  void reset_state() override {
    if (inner_) inner_->reset_state();
  }
  std::pair<double, double> state() const override {
    return inner_ ? inner_->state() : std::pair<double, double>{0, 0};
  }
  void set_state(double total, double count) override {
    // A worker that saw no batch yet has no inner metric; the state is a plain mean either way.
    if (!inner_) inner_ = std::make_unique<SparseCategoricalAccuracy>(name());
    inner_->set_state(total, count);
  }

 private:
  std::unique_ptr<Metric> inner_;
};

constexpr const char* kKnownMetrics =
    "\"accuracy\", \"acc\", \"sparse_categorical_accuracy\", \"categorical_accuracy\", "
    "\"binary_accuracy\" (or the Keras class names SparseCategoricalAccuracy, "
    "CategoricalAccuracy, BinaryAccuracy, Accuracy, Mean)";

}  // namespace

std::shared_ptr<Metric> metric_from_name(const std::string& name, const Loss* loss) {
  if (name == "accuracy" || name == "acc") {
    if (dynamic_cast<const SparseCategoricalCrossentropy*>(loss) != nullptr) {
      return std::make_shared<SparseCategoricalAccuracy>(name);
    }
    if (dynamic_cast<const CategoricalCrossentropy*>(loss) != nullptr) {
      return std::make_shared<CategoricalAccuracy>(name);
    }
    if (dynamic_cast<const BinaryCrossentropy*>(loss) != nullptr) {
      return std::make_shared<BinaryAccuracy>(name);
    }
    return std::make_shared<ShapeResolvedAccuracy>(name);
  }
  if (name == "sparse_categorical_accuracy" || name == "SparseCategoricalAccuracy") {
    return std::make_shared<SparseCategoricalAccuracy>();
  }
  if (name == "categorical_accuracy" || name == "CategoricalAccuracy") {
    return std::make_shared<CategoricalAccuracy>();
  }
  if (name == "binary_accuracy" || name == "BinaryAccuracy") {
    return std::make_shared<BinaryAccuracy>();
  }
  if (name == "Accuracy") return std::make_shared<Accuracy>();
  if (name == "Mean") return std::make_shared<Mean>();
  throw InvalidArgumentError(
      str_cat("metric_from_name: unknown metric \"", name, "\"; known metrics: ", kKnownMetrics));
}

}  // namespace dtrain::nn
