// ReLU, LeakyReLU, Softmax, ELU.
#include "dtrain/nn/activations.h"

#include "config.h"
#include "dtrain/autograd/activations.h"
#include "dtrain/autograd/functions.h"
#include "layer_registry.h"

namespace dtrain::nn {

using detail::name_or_default;
using nlohmann::json;

ReLU::ReLU(ReLUOptions options)
    : Layer(name_or_default(options.name, "re_lu")), options_(std::move(options)) {
  DTRAIN_CHECK(!options_.max_value || *options_.max_value >= 0.0f, "ReLU '", name(),
               "': max_value must be >= 0, got ", *options_.max_value);
  DTRAIN_CHECK(options_.negative_slope >= 0.0f, "ReLU '", name(),
               "': negative_slope must be >= 0, got ", options_.negative_slope);
}

Tensor ReLU::call(const Tensor& x, bool) {
  return relu(x, options_.negative_slope, options_.max_value.value_or(-1.0f), options_.threshold);
}

std::string ReLU::config_json() const {
  json c = detail::base_config(*this);
  c["max_value"] = options_.max_value ? json(*options_.max_value) : json(nullptr);
  c["negative_slope"] = options_.negative_slope;
  c["threshold"] = options_.threshold;
  return c.dump();
}

LeakyReLU::LeakyReLU(LeakyReLUOptions options)
    : Layer(name_or_default(options.name, "leaky_re_lu")), negative_slope_(options.negative_slope) {
  DTRAIN_CHECK(negative_slope_ >= 0.0f, "LeakyReLU '", name(),
               "': negative_slope must be >= 0, got ", negative_slope_);
}

Tensor LeakyReLU::call(const Tensor& x, bool) { return leaky_relu(x, negative_slope_); }

std::string LeakyReLU::config_json() const {
  json c = detail::base_config(*this);
  c["alpha"] = negative_slope_;  // Keras 2's key (Keras 3: negative_slope; both are read)
  return c.dump();
}

Softmax::Softmax(SoftmaxOptions options)
    : Layer(name_or_default(options.name, "softmax")), axis_(options.axis) {}

void Softmax::build_impl(const Shape& input_shape) {
  // Shapes here exclude the batch: axis -1 or the last positive index (counting the batch).
  DTRAIN_CHECK(axis_ == -1 || axis_ == input_shape.rank(), "Softmax '", name(), "': axis ", axis_,
               " is not supported for input shape ", input_shape.to_string(),
               " (only the last axis)");
}

Tensor Softmax::call(const Tensor& x, bool) {
  DTRAIN_CHECK(axis_ == -1 || axis_ == x.rank() - 1, "Softmax '", name(), "': axis ", axis_,
               " is not supported for an input of rank ", x.rank(), " (only the last axis)");
  return softmax(x);
}

std::string Softmax::config_json() const {
  json c = detail::base_config(*this);
  c["axis"] = axis_;
  return c.dump();
}

ELU::ELU(ELUOptions options) : Layer(name_or_default(options.name, "elu")), alpha_(options.alpha) {}

Tensor ELU::call(const Tensor& x, bool) { return elu(x, alpha_); }

std::string ELU::config_json() const {
  json c = detail::base_config(*this);
  c["alpha"] = alpha_;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

namespace {

float float_field(const json& c, const char* key, const std::string& where, float fallback) {
  return static_cast<float>(detail::number_field(c, key, where, fallback));
}

std::shared_ptr<Layer> relu_from_config(const json& c, const std::string& where) {
  ReLUOptions o{.negative_slope = float_field(c, "negative_slope", where, 0.0f),
                .threshold = float_field(c, "threshold", where, 0.0f),
                .name = detail::str_field(c, "name", where)};
  if (c.contains("max_value") && !c["max_value"].is_null()) {
    o.max_value = float_field(c, "max_value", where, 0.0f);
  }
  return std::make_shared<ReLU>(o);
}

std::shared_ptr<Layer> leaky_relu_from_config(const json& c, const std::string& where) {
  // Keras 3 writes negative_slope, Keras 2 alpha.
  const char* key = c.contains("negative_slope") ? "negative_slope" : "alpha";
  return std::make_shared<LeakyReLU>(
      LeakyReLUOptions{.negative_slope = float_field(c, key, where, 0.3f),
                       .name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> softmax_from_config(const json& c, const std::string& where) {
  int axis = -1;
  if (c.contains("axis") && c["axis"].is_array()) {
    DTRAIN_CHECK(c["axis"].size() == 1 && c["axis"][0].is_number_integer(), where,
                 ".axis: expected an integer or a list of one integer");
    axis = c["axis"][0].get<int>();
  } else {
    axis = static_cast<int>(detail::int_field(c, "axis", where, -1));
  }
  return std::make_shared<Softmax>(
      SoftmaxOptions{.axis = axis, .name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> elu_from_config(const json& c, const std::string& where) {
  return std::make_shared<ELU>(ELUOptions{.alpha = float_field(c, "alpha", where, 1.0f),
                                          .name = detail::str_field(c, "name", where)});
}

}  // namespace

namespace detail {
void register_activation_layers(LayerRegistry& registry) {
  registry.add("ReLU", relu_from_config);
  registry.add("LeakyReLU", leaky_relu_from_config);
  registry.add("Softmax", softmax_from_config);
  registry.add("ELU", elu_from_config);
}
}  // namespace detail

}  // namespace dtrain::nn
