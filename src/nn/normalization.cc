// BatchNormalization (SyncBatchNormalization) and LayerNormalization.
#include "dtrain/nn/normalization.h"

#include <algorithm>

#include "config.h"
#include "dtrain/core/random.h"
#include "layer_registry.h"

namespace dtrain::nn {

using detail::add_batch_input_shape;
using detail::batch_shape_string;
using detail::make_initializer;
using detail::name_or_default;
using nlohmann::json;

BatchNormalization::BatchNormalization(BatchNormalizationOptions options)
    : Layer(name_or_default(options.name, "batch_normalization")),
      options_(std::move(options)),
      beta_init_(make_initializer(options_.beta_initializer, std::nullopt)),
      gamma_init_(make_initializer(options_.gamma_initializer, std::nullopt)),
      moving_mean_init_(make_initializer(options_.moving_mean_initializer, std::nullopt)),
      moving_variance_init_(make_initializer(options_.moving_variance_initializer, std::nullopt)) {
  DTRAIN_CHECK(options_.momentum >= 0.0f && options_.momentum <= 1.0f, class_name(), " '", name(),
               "': momentum must be in [0, 1], got ", options_.momentum);
  DTRAIN_CHECK(options_.epsilon > 0.0f, class_name(), " '", name(),
               "': epsilon must be positive, got ", options_.epsilon);
  if (options_.input_shape) {
    set_input_shape(*options_.input_shape);
    build(*options_.input_shape);
  }
}

void BatchNormalization::build_impl(const Shape& input_shape) {
  // input_shape excludes the batch; axis counts it.
  const int rank = input_shape.rank() + 1;
  const int a = options_.axis < 0 ? options_.axis + rank : options_.axis;
  DTRAIN_CHECK(a >= 1 && a < rank, class_name(), " '", name(), "': axis ", options_.axis,
               " is out of range for inputs of shape ", batch_shape_string(input_shape),
               a == 0 ? " (the batch axis cannot be normalized)" : "");
  axis_ = a;
  channels_ = input_shape[a - 1];
  DTRAIN_CHECK(channels_ > 0, class_name(), " '", name(), "': axis ", options_.axis,
               " of input shape ", batch_shape_string(input_shape), " must have a known size");
  const Shape param{channels_};
  if (options_.scale) gamma_ = &add_weight("gamma", param, *gamma_init_);
  if (options_.center) beta_ = &add_weight("beta", param, *beta_init_);
  moving_mean_ = &add_weight("moving_mean", param, *moving_mean_init_, /*trainable=*/false);
  moving_variance_ =
      &add_weight("moving_variance", param, *moving_variance_init_, /*trainable=*/false);
  pending_.assign(kMaxLocalReplicas, {});
  immediate_.assign(static_cast<size_t>(pending_update_size()), 0.0f);
}

Tensor BatchNormalization::call(const Tensor& x, bool training) {
  DTRAIN_CHECK(x.rank() > axis_ && x.dim(axis_) == channels_, class_name(), " '", name(),
               "': expected inputs with ", channels_, " channels on axis ", axis_, ", got shape ",
               x.shape().to_string());
  const Tensor gamma = gamma_ ? gamma_->value() : Tensor();
  const Tensor beta = beta_ ? beta_->value() : Tensor();
  // A frozen layer runs in inference mode (Keras ≥ 2), so fine-tuning keeps its statistics.
  if (!training || !trainable()) {
    return batch_norm_inference(x, gamma, beta, moving_mean_->tensor(), moving_variance_->tensor(),
                                axis_, options_.epsilon);
  }
  BatchNormMoments m;
  const ReplicaStream stream = current_replica_stream();
  static const std::shared_ptr<const BatchNormSync> kNoSync;
  Tensor y = batch_norm_training(x, gamma, beta, axis_, options_.epsilon, &m,
                                 stream.local >= 0 ? sync_ : kNoSync);
  if (stream.local < 0) {
    // Outside replicas: assign now, as Keras does.
    std::fill(immediate_.begin(), immediate_.end(), 0.0f);
    immediate_[0] = 1.0f;
    fold(immediate_, m);
    apply_update(immediate_);
    return y;
  }
  DTRAIN_CHECK(stream.local < kMaxLocalReplicas, class_name(), " '", name(), "': more than ",
               kMaxLocalReplicas, " local replicas");
  // On a replica thread: only this replica touches its slot.
  std::vector<float>& p = pending_[static_cast<size_t>(stream.local)];
  if (p.empty()) {
    p.assign(static_cast<size_t>(pending_update_size()), 0.0f);
    p[0] = 1.0f;
  }
  fold(p, m);
  return y;
}

void BatchNormalization::fold(std::vector<float>& p, const BatchNormMoments& m) const {
  // moving ← moving·f + a; one more call: moving·f·μ + a·μ + batch·(1 − μ).
  const float mom = options_.momentum, rest = 1.0f - options_.momentum;
  p[0] *= mom;
  const float* mean = m.mean.data<float>();
  const float* var = m.variance.data<float>();
  float* am = p.data() + 1;
  float* av = am + channels_;
  for (int64_t j = 0; j < channels_; ++j) {
    am[j] = am[j] * mom + mean[j] * rest;
    av[j] = av[j] * mom + var[j] * rest;
  }
}

void BatchNormalization::take_pending_update(int local, std::span<float> out) {
  DTRAIN_INTERNAL_CHECK(static_cast<int64_t>(out.size()) == pending_update_size(),
                        "take_pending_update: wrong size");
  std::vector<float>* p =
      local >= 0 && local < kMaxLocalReplicas ? &pending_[static_cast<size_t>(local)] : nullptr;
  if (p == nullptr || p->empty()) {
    std::fill(out.begin(), out.end(), 0.0f);
    out[0] = 1.0f;  // identity
    return;
  }
  std::copy(p->begin(), p->end(), out.begin());
  std::fill(p->begin(), p->end(), 0.0f);
  (*p)[0] = 1.0f;
}

void BatchNormalization::apply_update(std::span<const float> u) {
  const float f = u[0];
  const float* am = u.data() + 1;
  const float* av = am + channels_;
  float* mm = moving_mean_->tensor().data<float>();
  float* mv = moving_variance_->tensor().data<float>();
  for (int64_t j = 0; j < channels_; ++j) {
    mm[j] = mm[j] * f + am[j];
    mv[j] = mv[j] * f + av[j];
  }
}

std::string BatchNormalization::config_json() const {
  json c = detail::base_config(*this);
  add_batch_input_shape(*this, c);
  // Keras writes the axis as given before building and as a list of positive axes after.
  c["axis"] = built() ? json::array({axis_}) : json(options_.axis);
  c["momentum"] = options_.momentum;
  c["epsilon"] = options_.epsilon;
  c["center"] = options_.center;
  c["scale"] = options_.scale;
  c["beta_initializer"] = detail::initializer_config(*beta_init_);
  c["gamma_initializer"] = detail::initializer_config(*gamma_init_);
  c["moving_mean_initializer"] = detail::initializer_config(*moving_mean_init_);
  c["moving_variance_initializer"] = detail::initializer_config(*moving_variance_init_);
  c["beta_regularizer"] = nullptr;
  c["gamma_regularizer"] = nullptr;
  c["beta_constraint"] = nullptr;
  c["gamma_constraint"] = nullptr;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

LayerNormalization::LayerNormalization(LayerNormalizationOptions options)
    : Layer(name_or_default(options.name, "layer_normalization")),
      options_(std::move(options)),
      beta_init_(make_initializer(options_.beta_initializer, std::nullopt)),
      gamma_init_(make_initializer(options_.gamma_initializer, std::nullopt)) {
  DTRAIN_CHECK(!options_.axis.empty(), "LayerNormalization '", name(), "': axis is empty");
  DTRAIN_CHECK(options_.epsilon > 0.0f, "LayerNormalization '", name(),
               "': epsilon must be positive, got ", options_.epsilon);
  if (options_.input_shape) {
    set_input_shape(*options_.input_shape);
    build(*options_.input_shape);
  }
}

void LayerNormalization::build_impl(const Shape& input_shape) {
  const int rank = input_shape.rank() + 1;
  std::vector<int> axes;
  for (int a : options_.axis) {
    const int p = a < 0 ? a + rank : a;
    DTRAIN_CHECK(p >= 1 && p < rank, "LayerNormalization '", name(), "': axis ", a,
                 " is out of range for inputs of shape ", batch_shape_string(input_shape));
    axes.push_back(p);
  }
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  for (size_t i = 0; i < axes.size(); ++i) {
    DTRAIN_CHECK(axes[i] == rank - static_cast<int>(axes.size()) + static_cast<int>(i),
                 "LayerNormalization '", name(), "': only trailing axes can be normalized, got ",
                 json(options_.axis).dump(), " for inputs of shape ",
                 batch_shape_string(input_shape));
  }
  built_axes_ = axes;
  begin_axis_ = axes.front();
  Shape param;
  for (int a : axes) param.push_back(input_shape[a - 1]);
  if (options_.scale) gamma_ = &add_weight("gamma", param, *gamma_init_);
  if (options_.center) beta_ = &add_weight("beta", param, *beta_init_);
}

Tensor LayerNormalization::call(const Tensor& x, bool) {
  DTRAIN_CHECK(x.rank() == static_cast<int>(input_shape()->rank()) + 1, "LayerNormalization '",
               name(), "': expected inputs of rank ", input_shape()->rank() + 1, ", got shape ",
               x.shape().to_string());
  return layer_norm(x, gamma_ ? gamma_->value() : Tensor(), beta_ ? beta_->value() : Tensor(),
                    begin_axis_, options_.epsilon);
}

std::string LayerNormalization::config_json() const {
  json c = detail::base_config(*this);
  add_batch_input_shape(*this, c);
  c["axis"] = built() ? json(built_axes_)
                      : (options_.axis.size() == 1 ? json(options_.axis[0]) : json(options_.axis));
  c["epsilon"] = options_.epsilon;
  c["center"] = options_.center;
  c["scale"] = options_.scale;
  c["beta_initializer"] = detail::initializer_config(*beta_init_);
  c["gamma_initializer"] = detail::initializer_config(*gamma_init_);
  c["beta_regularizer"] = nullptr;
  c["gamma_regularizer"] = nullptr;
  c["beta_constraint"] = nullptr;
  c["gamma_constraint"] = nullptr;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

namespace {

// Keras's axis: an integer or a list of integers.
std::vector<int> axes_field(const json& c, const std::string& where, int fallback) {
  if (!c.contains("axis") || c["axis"].is_null()) return {fallback};
  const json& a = c["axis"];
  if (a.is_number_integer()) return {a.get<int>()};
  DTRAIN_CHECK(a.is_array() && !a.empty(), where, ".axis: expected an integer or a list of them");
  std::vector<int> out;
  for (const json& v : a) {
    DTRAIN_CHECK(v.is_number_integer(), where, ".axis: expected integers, got ", v.dump());
    out.push_back(v.get<int>());
  }
  return out;
}

BatchNormalizationOptions bn_options(const json& c, const std::string& where, bool sync) {
  // TF-Keras 2 options dtrain does not implement: refuse rather than train differently.
  DTRAIN_CHECK(!detail::bool_field(c, "renorm", where, false), where,
               ": BatchNormalization with renorm=True is not supported");
  DTRAIN_CHECK(!c.contains("virtual_batch_size") || c["virtual_batch_size"].is_null(), where,
               ": BatchNormalization with virtual_batch_size is not supported");
  const std::vector<int> axes = axes_field(c, where, -1);
  DTRAIN_CHECK(axes.size() == 1, where, ".axis: BatchNormalization over several axes (",
               json(axes).dump(), ") is not supported");
  return BatchNormalizationOptions{
      .axis = axes[0],
      .momentum = static_cast<float>(detail::number_field(c, "momentum", where, 0.99)),
      .epsilon = static_cast<float>(detail::number_field(c, "epsilon", where, 1e-3)),
      .center = detail::bool_field(c, "center", where, true),
      .scale = detail::bool_field(c, "scale", where, true),
      .beta_initializer = detail::initializer_json(c, "beta_initializer", "zeros"),
      .gamma_initializer = detail::initializer_json(c, "gamma_initializer", "ones"),
      .moving_mean_initializer = detail::initializer_json(c, "moving_mean_initializer", "zeros"),
      .moving_variance_initializer =
          detail::initializer_json(c, "moving_variance_initializer", "ones"),
      .synchronized = sync || detail::bool_field(c, "synchronized", where, false),
      .input_shape = detail::declared_input_shape(c, where),
      .name = detail::str_field(c, "name", where)};
}

std::shared_ptr<Layer> batch_norm_from_config(const json& c, const std::string& where) {
  return std::make_shared<BatchNormalization>(bn_options(c, where, false));
}

std::shared_ptr<Layer> sync_batch_norm_from_config(const json& c, const std::string& where) {
  return std::make_shared<BatchNormalization>(bn_options(c, where, true));
}

std::shared_ptr<Layer> layer_norm_from_config(const json& c, const std::string& where) {
  DTRAIN_CHECK(!detail::bool_field(c, "rms_scaling", where, false), where,
               ": LayerNormalization with rms_scaling=True is not supported");
  return std::make_shared<LayerNormalization>(LayerNormalizationOptions{
      .axis = axes_field(c, where, -1),
      .epsilon = static_cast<float>(detail::number_field(c, "epsilon", where, 1e-3)),
      .center = detail::bool_field(c, "center", where, true),
      .scale = detail::bool_field(c, "scale", where, true),
      .beta_initializer = detail::initializer_json(c, "beta_initializer", "zeros"),
      .gamma_initializer = detail::initializer_json(c, "gamma_initializer", "ones"),
      .input_shape = detail::declared_input_shape(c, where),
      .name = detail::str_field(c, "name", where)});
}

}  // namespace

namespace detail {
void register_normalization_layers(LayerRegistry& registry) {
  registry.add("BatchNormalization", batch_norm_from_config);
  registry.add("SyncBatchNormalization", sync_batch_norm_from_config);
  registry.add("LayerNormalization", layer_norm_from_config);
}
}  // namespace detail

}  // namespace dtrain::nn
