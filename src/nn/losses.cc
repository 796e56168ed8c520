// Keras losses built from differentiable ops; see dtrain/nn/losses.h. Stateless: thread-safe.
#include "dtrain/nn/losses.h"

#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/core/error.h"
#include "dtrain/ops/tensor_ops.h"
#include "label_shapes.h"

namespace dtrain::nn {
namespace {

// Takes the loss, not its name, so the name is only built when a check fails (the training
// loop must not allocate).
void check_prediction(const Tensor& y_pred, const Loss& loss) {
  DTRAIN_CHECK(y_pred.defined(), loss.name(), ": y_pred is undefined");
  DTRAIN_CHECK(y_pred.dtype() == DType::kFloat32, loss.name(), ": y_pred must be float32, got ",
               dtype_name(y_pred.dtype()), " ", y_pred.shape().to_string());
  DTRAIN_CHECK(y_pred.num_elements() > 0, loss.name(), ": y_pred ", y_pred.shape().to_string(),
               " is empty");
}

using detail::differ_by_trailing_one;
using detail::drop_last;
using detail::throw_shape_mismatch;

// y_true as float32 with y_pred's shape, for elementwise losses. Never recorded: labels are not
// differentiated.
Tensor dense_labels(const Tensor& y_true, const Tensor& y_pred, const std::string& loss) {
  DTRAIN_CHECK(y_true.defined(), loss, ": y_true is undefined");
  if (y_true.shape() != y_pred.shape()) {
    if (!differ_by_trailing_one(y_true.shape(), y_pred.shape())) {
      throw_shape_mismatch(loss, y_true, y_pred, "expected the same shape");
    }
  }
  Tensor t = stop_gradient(y_true);
  if (t.dtype() != DType::kFloat32) t = ops::cast(t, DType::kFloat32);
  return t.reshape(y_pred.shape());
}

// y_true ← y_true·(1 − s) + s / k, as Keras's label smoothing (k = classes, or 2 for binary).
Tensor smooth_labels(const Tensor& y_true, float smoothing, float k) {
  if (smoothing == 0.0f) return y_true;
  return ops::affine(y_true, 1.0f - smoothing, smoothing / k);
}

// [..., C] viewed as [N, C] (differentiable).
Tensor as_rows(const Tensor& x) {
  const int64_t classes = x.dim(-1);
  return reshape(x, Shape{x.num_elements() / classes, classes});
}

// Reruns `f`, prefixing the message of an InvalidArgumentError from a lower-level op with the
// loss's name, so "label 7 of example 2 is outside [0, 3)" says which loss saw it.
template <class F>
Tensor with_loss_context(const Loss& loss, F&& f) {
  try {
    return f();
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(str_cat(loss.name(), ": ", e.what()));
  }
}

void check_smoothing(float s, const char* loss) {
  DTRAIN_CHECK(s >= 0.0f && s <= 1.0f, loss, ": label_smoothing must be in [0, 1], got ", s);
}

}  // namespace

std::string Loss::config_json() const {
  const LossConfig c = get_config();
  nlohmann::ordered_json j;
  j["reduction"] = c.reduction;
  j["name"] = c.name;
  if (c.from_logits) j["from_logits"] = *c.from_logits;
  if (c.ignore_class_null) j["ignore_class"] = nullptr;
  if (c.label_smoothing) j["label_smoothing"] = *c.label_smoothing;
  if (c.axis) j["axis"] = *c.axis;
  return j.dump();
}

Tensor Loss::per_sample(const Tensor& /*y_true*/, const Tensor& /*y_pred*/) const {
  throw UnimplementedError(str_cat(name(), ": this loss has no per-sample losses, so it cannot ",
                                   "weight by the output's mask"));
}

Tensor Loss::operator()(const Tensor& y_true, const Tensor& y_pred, const Tensor& mask) const {
  if (!mask.defined()) return (*this)(y_true, y_pred);
  const Tensor values = per_sample(y_true, y_pred);
  if (mask.shape() != values.shape()) {
    throw InvalidArgumentError(
        str_cat(name(), ": the output's mask must have the per-sample losses' shape ",
                values.shape().to_string(), " (y_pred ", y_pred.shape().to_string(),
                " without its last axis), got ", mask.shape().to_string()));
  }
  DTRAIN_CHECK(mask.dtype() != DType::kString && mask.dtype() != DType::kInvalid, name(),
               ": the output's mask must be numeric, got ", dtype_name(mask.dtype()));
  // Keras 3's apply_mask: the mask (0/1) times divide_no_nan(total, valid), in float32, as a
  // constant sample weight; then the mean over all `total` weighted values.
  const int64_t n = values.num_elements();
  Tensor weights(values.shape());
  float* w = weights.data<float>();
  float valid = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    w[i] = ops::value_at(mask, i) != 0.0 ? 1.0f : 0.0f;
    valid += w[i];
  }
  const float factor = valid == 0.0f ? 0.0f : static_cast<float>(n) / valid;
  for (int64_t i = 0; i < n; ++i) w[i] *= factor;
  return reduce_mean(multiply(values, weights));
}

// ---------------------------------------------------------------------------------------------
// MeanSquaredError: mean((y_pred − y_true)²) over all elements.

namespace {

// (y_pred − y_true)² elementwise.
Tensor squared_errors(const Tensor& y_true, const Tensor& y_pred, const Loss& loss) {
  check_prediction(y_pred, loss);
  const Tensor y = dense_labels(y_true, y_pred, loss.name());
  return square(subtract(y_pred, y));
}

// Keras's per-sample value of an elementwise loss: the mean over the last axis.
Tensor mean_over_last_axis(const Tensor& e) { return e.rank() >= 2 ? reduce_mean(e, -1) : e; }

}  // namespace

Tensor MeanSquaredError::operator()(const Tensor& y_true, const Tensor& y_pred) const {
  return reduce_mean(squared_errors(y_true, y_pred, *this));
}

Tensor MeanSquaredError::per_sample(const Tensor& y_true, const Tensor& y_pred) const {
  return mean_over_last_axis(squared_errors(y_true, y_pred, *this));
}

LossConfig MeanSquaredError::get_config() const {
  return {.class_name = "MeanSquaredError", .name = name()};
}

// ---------------------------------------------------------------------------------------------
// SparseCategoricalCrossentropy.

namespace {

// One loss per row of class scores, [rows] (rows: y_pred's elements over its last axis).
Tensor sparse_row_losses(const Tensor& y_true, const Tensor& y_pred,
                         const SparseCategoricalCrossentropy& loss) {
  check_prediction(y_pred, loss);
  DTRAIN_CHECK(y_true.defined(), loss.name(), ": y_true is undefined");
  DTRAIN_CHECK(y_pred.rank() >= 2, loss.name(), ": y_pred must be [batch, classes], got ",
               y_pred.shape().to_string());
  // y_true has y_pred's shape without the class axis, or with a class axis of 1.
  const Shape outer = drop_last(y_pred.shape());
  Shape outer_one = outer;
  outer_one.push_back(1);
  if (y_true.shape() != outer && y_true.shape() != outer_one) {
    throw_shape_mismatch(
        loss.name(), y_true, y_pred,
        str_cat("expected labels of shape ", outer.to_string(), " or ", outer_one.to_string())
            .c_str());
  }
  const Tensor labels = stop_gradient(y_true).reshape(Shape{outer.num_elements()});
  return with_loss_context(loss, [&] {
    const Tensor scores = as_rows(y_pred);
    if (loss.options().from_logits) {
      return sparse_softmax_cross_entropy_with_logits(labels, scores);
    }
    // Keras: log of the clipped probabilities, used as logits (which renormalizes them).
    const Tensor log_p = log(clip_by_value(scores, kEpsilon, 1.0f - kEpsilon));
    return sparse_softmax_cross_entropy_with_logits(labels, log_p);
  });
}

}  // namespace

Tensor SparseCategoricalCrossentropy::operator()(const Tensor& y_true, const Tensor& y_pred) const {
  return reduce_mean(sparse_row_losses(y_true, y_pred, *this));
}

Tensor SparseCategoricalCrossentropy::per_sample(const Tensor& y_true, const Tensor& y_pred) const {
  return reshape(sparse_row_losses(y_true, y_pred, *this), drop_last(y_pred.shape()));
}

LossConfig SparseCategoricalCrossentropy::get_config() const {
  return {.class_name = "SparseCategoricalCrossentropy",
          .name = name(),
          .from_logits = options_.from_logits,
          .ignore_class_null = true};
}

// ---------------------------------------------------------------------------------------------
// CategoricalCrossentropy.

CategoricalCrossentropy::CategoricalCrossentropy(CategoricalCrossentropyOptions options)
    : options_(options) {
  check_smoothing(options_.label_smoothing, "categorical_crossentropy");
}

namespace {

// One loss per row of class scores, [rows].
Tensor categorical_row_losses(const Tensor& y_true, const Tensor& y_pred,
                              const CategoricalCrossentropy& loss) {
  check_prediction(y_pred, loss);
  DTRAIN_CHECK(y_true.defined(), loss.name(), ": y_true is undefined");
  if (y_true.shape() != y_pred.shape()) {
    throw_shape_mismatch(loss.name(), y_true, y_pred, "expected the same shape [batch, classes]");
  }
  Tensor y = stop_gradient(y_true);
  if (y.dtype() != DType::kFloat32) y = ops::cast(y, DType::kFloat32);
  const float classes = static_cast<float>(y_pred.dim(-1));
  y = smooth_labels(y.reshape(Shape{y.num_elements() / y_pred.dim(-1), y_pred.dim(-1)}),
                    loss.options().label_smoothing, classes);
  const Tensor scores = as_rows(y_pred);
  if (loss.options().from_logits) {
    return with_loss_context(loss, [&] { return softmax_cross_entropy_with_logits(y, scores); });
  }
  // Keras: scale each row to sum 1, clip, −Σ y log p.
  Tensor p = divide(scores, reduce_sum(scores, -1, /*keepdims=*/true));
  p = clip_by_value(p, kEpsilon, 1.0f - kEpsilon);
  return negative(reduce_sum(multiply(y, log(p)), -1));
}

}  // namespace

Tensor CategoricalCrossentropy::operator()(const Tensor& y_true, const Tensor& y_pred) const {
  return reduce_mean(categorical_row_losses(y_true, y_pred, *this));
}

Tensor CategoricalCrossentropy::per_sample(const Tensor& y_true, const Tensor& y_pred) const {
  return reshape(categorical_row_losses(y_true, y_pred, *this), drop_last(y_pred.shape()));
}

LossConfig CategoricalCrossentropy::get_config() const {
  return {.class_name = "CategoricalCrossentropy",
          .name = name(),
          .from_logits = options_.from_logits,
          .label_smoothing = options_.label_smoothing,
          .axis = -1};
}

// ---------------------------------------------------------------------------------------------
// BinaryCrossentropy.

BinaryCrossentropy::BinaryCrossentropy(BinaryCrossentropyOptions options) : options_(options) {
  check_smoothing(options_.label_smoothing, "binary_crossentropy");
}

namespace {

// The elementwise binary crossentropy, y_pred's shape.
Tensor binary_elementwise(const Tensor& y_true, const Tensor& y_pred,
                          const BinaryCrossentropy& loss) {
  check_prediction(y_pred, loss);
  const Tensor y = smooth_labels(dense_labels(y_true, y_pred, loss.name()),
                                 loss.options().label_smoothing, 2.0f);
  if (loss.options().from_logits) return sigmoid_cross_entropy_with_logits(y, y_pred);
  // Keras: clip, then −(y log(p + ε) + (1 − y) log(1 − p + ε)), each step rounded as TF does.
  const Tensor p = clip_by_value(y_pred, kEpsilon, 1.0f - kEpsilon);
  const Tensor log_p = log(scale(p, 1.0f, kEpsilon));
  const Tensor log_not_p = log(scale(scale(p, -1.0f, 1.0f), 1.0f, kEpsilon));
  const Tensor not_y = ops::affine(y, -1.0f, 1.0f);
  return negative(add(multiply(y, log_p), multiply(not_y, log_not_p)));
}

}  // namespace

Tensor BinaryCrossentropy::operator()(const Tensor& y_true, const Tensor& y_pred) const {
  return reduce_mean(binary_elementwise(y_true, y_pred, *this));
}

Tensor BinaryCrossentropy::per_sample(const Tensor& y_true, const Tensor& y_pred) const {
  return mean_over_last_axis(binary_elementwise(y_true, y_pred, *this));
}

LossConfig BinaryCrossentropy::get_config() const {
  return {.class_name = "BinaryCrossentropy",
          .name = name(),
          .from_logits = options_.from_logits,
          .label_smoothing = options_.label_smoothing,
          .axis = -1};
}

// ---------------------------------------------------------------------------------------------
// Lookup by name and config.

namespace {
constexpr const char* kKnownLosses =
    "\"mse\", \"mean_squared_error\", \"sparse_categorical_crossentropy\", "
    "\"categorical_crossentropy\", \"binary_crossentropy\" (or the Keras class names "
    "MeanSquaredError, SparseCategoricalCrossentropy, CategoricalCrossentropy, "
    "BinaryCrossentropy)";
}  // namespace

std::shared_ptr<Loss> loss_from_name(const std::string& name) {
  if (name == "mse" || name == "MSE" || name == "mean_squared_error" ||
      name == "MeanSquaredError") {
    return std::make_shared<MeanSquaredError>();
  }
  if (name == "sparse_categorical_crossentropy" || name == "SparseCategoricalCrossentropy") {
    return std::make_shared<SparseCategoricalCrossentropy>();
  }
  if (name == "categorical_crossentropy" || name == "CategoricalCrossentropy") {
    return std::make_shared<CategoricalCrossentropy>();
  }
  if (name == "binary_crossentropy" || name == "BinaryCrossentropy") {
    return std::make_shared<BinaryCrossentropy>();
  }
  throw InvalidArgumentError(
      str_cat("loss_from_name: unknown loss \"", name, "\"; known losses: ", kKnownLosses));
}

std::shared_ptr<Loss> loss_from_config(const LossConfig& config) {
  DTRAIN_CHECK(config.reduction == "auto" || config.reduction == "sum_over_batch_size",
               "loss_from_config: reduction \"", config.reduction,
               "\" is not supported (only \"auto\" / \"sum_over_batch_size\")");
  const std::string& c = config.class_name;
  const bool from_logits = config.from_logits.value_or(false);
  const float smoothing = config.label_smoothing.value_or(0.0f);
  if (c == "MeanSquaredError") return std::make_shared<MeanSquaredError>();
  if (c == "SparseCategoricalCrossentropy") {
    return std::make_shared<SparseCategoricalCrossentropy>(
        SparseCategoricalCrossentropyOptions{.from_logits = from_logits});
  }
  if (c == "CategoricalCrossentropy") {
    return std::make_shared<CategoricalCrossentropy>(
        CategoricalCrossentropyOptions{.from_logits = from_logits, .label_smoothing = smoothing});
  }
  if (c == "BinaryCrossentropy") {
    return std::make_shared<BinaryCrossentropy>(
        BinaryCrossentropyOptions{.from_logits = from_logits, .label_smoothing = smoothing});
  }
  throw InvalidArgumentError(
      str_cat("loss_from_config: unknown loss class \"", c, "\"; known losses: ", kKnownLosses));
}

std::shared_ptr<Loss> loss_from_json(const std::string& json) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(str_cat("loss_from_json: malformed JSON: ", e.what()));
  }
  if (j.is_string()) return loss_from_name(j.get<std::string>());
  DTRAIN_CHECK(j.is_object() && j.contains("class_name") && j["class_name"].is_string(),
               "loss_from_json: expected a loss name or {\"class_name\": ..., \"config\": ...}, "
               "got ",
               json);
  LossConfig config{.class_name = j["class_name"].get<std::string>()};
  if (j.contains("config") && j["config"].is_object()) {
    const nlohmann::json& c = j["config"];
    try {
      if (c.contains("reduction") && c["reduction"].is_string()) {
        config.reduction = c["reduction"].get<std::string>();
      }
      if (c.contains("from_logits")) config.from_logits = c["from_logits"].get<bool>();
      if (c.contains("label_smoothing")) {
        config.label_smoothing = c["label_smoothing"].get<float>();
      }
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgumentError(str_cat("loss_from_json: bad config in ", json, ": ", e.what()));
    }
  }
  return loss_from_config(config);
}

}  // namespace dtrain::nn
