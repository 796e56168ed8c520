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

}  // namespace

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

// ---------------------------------------------------------------------------------------------
// Accuracies.

void SparseCategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred) {
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
  double matches = 0;
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
      matches += ops::label_at(y_true, r) == best ? 1 : 0;
    }
  } else {
    check_numeric(y_pred, name());
    for (int64_t r = 0; r < rows; ++r) {
      matches += ops::label_at(y_true, r) == row_argmax(y_pred, r, classes) ? 1 : 0;
    }
  }
  add(matches, static_cast<double>(rows));
}

void CategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred) {
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
  double matches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    matches += row_argmax(y_true, r, classes) == row_argmax(y_pred, r, classes) ? 1 : 0;
  }
  add(matches, static_cast<double>(rows));
}

void BinaryAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred) {
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
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t hits = 0;
    for (int64_t k = 0; k < per_row; ++k) {
      const int64_t i = r * per_row + k;
      const double predicted = ops::value_at(y_pred, i) > options_.threshold ? 1.0 : 0.0;
      hits += predicted == ops::value_at(y_true, i) ? 1 : 0;
    }
    total += per_row == 1 ? static_cast<double>(hits)
                          : static_cast<double>(hits) / static_cast<double>(per_row);
  }
  add(total, static_cast<double>(rows));
}

void Accuracy::update_state(const Tensor& y_true, const Tensor& y_pred) {
  check_defined(y_true, name(), "y_true");
  check_defined(y_pred, name(), "y_pred");
  if (!same_up_to_trailing_one(y_true.shape(), y_pred.shape())) {
    throw_shape_mismatch(name(), y_true, y_pred, "expected the same shape");
  }
  check_numeric(y_true, name());
  check_numeric(y_pred, name());
  const int64_t n = y_pred.num_elements();
  double matches = 0;
  for (int64_t i = 0; i < n; ++i)
    matches += ops::value_at(y_true, i) == ops::value_at(y_pred, i) ? 1 : 0;
  add(matches, static_cast<double>(n));
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
    inner_->update_state(y_true, y_pred);
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
