// Layer base: lazy build, weight ownership, default names.
#include "dtrain/nn/layer.h"

#include <cctype>
#include <map>
#include <mutex>

#include "config.h"
#include "masking.h"

namespace dtrain::nn {
namespace {
std::mutex g_names_mu;
std::map<std::string, int>& name_counters() {
  static std::map<std::string, int> m;
  return m;
}
}  // namespace

std::string unique_layer_name(const std::string& base) {
  std::lock_guard<std::mutex> lock(g_names_mu);
  int& n = name_counters()[base];
  const std::string name = n == 0 ? base : base + "_" + std::to_string(n);
  ++n;
  return name;
}

void clear_session() {
  std::lock_guard<std::mutex> lock(g_names_mu);
  name_counters().clear();
}

std::string to_snake_case(const std::string& class_name) {
  std::string out;
  for (size_t i = 0; i < class_name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(class_name[i]);
    if (std::isupper(c)) {
      if (i > 0 && class_name[i - 1] != '_') out += '_';
      out += static_cast<char>(std::tolower(c));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

Layer::Layer(std::string name) : name_(std::move(name)) {}
Layer::~Layer() = default;

void Layer::build_or_check_for(const Tensor& x) {
  DTRAIN_CHECK(x.defined(), class_name(), " '", name_, "': input is undefined");
  DTRAIN_CHECK(x.rank() >= 1, class_name(), " '", name_,
               "': input must have a batch dimension, got shape ", x.shape().to_string());
  const Shape per_example = x.shape().without_first();
  if (!built_) {
    build(per_example);
  } else if (input_shape_ && !accepts_input_shape(*input_shape_, per_example)) {
    throw InvalidArgumentError(
        str_cat(class_name(), " '", name_, "': expected inputs of shape [batch",
                input_shape_->rank() ? ", " : "", input_shape_->to_string().substr(1), ", got ",
                x.shape().to_string()));
  }
}

Tensor Layer::operator()(const Tensor& x, bool training) {
  build_or_check_for(x);
  return call(x, training);
}

Tensor Layer::call_masked(const Tensor& x, const Tensor& mask, bool training) {
  build_or_check_for(x);
  return mask.defined() ? call_with_mask(x, mask, training) : call(x, training);
}

Tensor Layer::compute_mask(const Tensor& /*x*/, const Tensor& mask) const {
  return supports_masking() ? mask : Tensor();
}

std::vector<Tensor> Layer::call_list_masked(std::span<const Tensor> inputs,
                                            std::span<const Tensor> /*masks*/, bool training) {
  return call_list(inputs, training);
}

std::vector<Tensor> Layer::compute_masks(std::span<const Tensor> inputs,
                                         std::span<const Tensor> masks, size_t num_outputs) const {
  std::vector<Tensor> out(num_outputs);
  if (num_outputs == 0) return out;
  if (inputs.size() == 1) {
    out[0] = compute_mask(inputs[0], masks.empty() ? Tensor() : masks[0]);
    return out;
  }
  if (!supports_masking()) return out;
  for (const Tensor& m : masks) {
    if (m.defined()) out[0] = out[0].defined() ? detail::mask_and(out[0], m, *this) : m;
  }
  return out;
}

void Layer::build(const Shape& input_shape) {
  if (built_) {
    DTRAIN_CHECK(!input_shape_ || accepts_input_shape(*input_shape_, input_shape), class_name(),
                 " '", name_, "': already built for input shape ", input_shape_->to_string(),
                 ", cannot rebuild for ", input_shape.to_string());
    return;
  }
  if (input_shape_) {
    DTRAIN_CHECK(*input_shape_ == input_shape, class_name(), " '", name_,
                 "': declared input shape ", input_shape_->to_string(), " but got ",
                 input_shape.to_string());
  }
  input_shape_ = input_shape;
  build_impl(input_shape);
  built_ = true;
}

bool Layer::accepts_input_shape(const Shape& built_for, const Shape& input_shape) const {
  return built_for == input_shape;
}

bool Layer::same_rank_and_trailing(const Shape& built_for, const Shape& input_shape, int trailing) {
  if (built_for.rank() != input_shape.rank() || trailing > built_for.rank()) return false;
  for (int i = 1; i <= trailing; ++i) {
    if (built_for.dim(-i) != input_shape.dim(-i)) return false;
  }
  return true;
}

std::vector<Tensor> Layer::call_list(std::span<const Tensor> inputs, bool training) {
  DTRAIN_CHECK(inputs.size() == 1, class_name(), " '", name_, "': expects one input, got ",
               inputs.size());
  return {(*this)(inputs[0], training)};
}

void Layer::build_list(std::span<const Shape> input_shapes) {
  DTRAIN_CHECK(input_shapes.size() == 1, class_name(), " '", name_, "': expects one input, got ",
               input_shapes.size());
  build(input_shapes[0]);
}

std::vector<Shape> Layer::compute_output_shapes(std::span<const Shape> input_shapes) const {
  DTRAIN_CHECK(input_shapes.size() == 1, class_name(), " '", name_, "': expects one input, got ",
               input_shapes.size());
  return {compute_output_shape(input_shapes[0])};
}

void Layer::mark_built(std::optional<Shape> input_shape) {
  if (input_shape) input_shape_ = std::move(input_shape);
  built_ = true;
}

std::vector<Variable*> Layer::weights() {
  std::vector<Variable*> out;
  out.reserve(weights_.size());
  for (auto& w : weights_) out.push_back(w.get());
  return out;
}

std::vector<Variable*> Layer::trainable_weights() {
  std::vector<Variable*> out;
  if (!trainable_) return out;
  for (Variable* v : weights()) {
    if (v->trainable()) out.push_back(v);
  }
  return out;
}

std::vector<Variable*> Layer::non_trainable_weights() {
  std::vector<Variable*> out;
  for (Variable* v : weights()) {
    if (!trainable_ || !v->trainable()) out.push_back(v);
  }
  return out;
}

int64_t Layer::count_params() {
  int64_t n = 0;
  for (Variable* v : weights()) n += v->shape().num_elements();
  return n;
}

void Layer::set_trainable(bool t) { trainable_ = t; }

std::string Layer::config_json() const { return detail::base_config(*this).dump(); }

Variable& Layer::add_weight(const std::string& weight_name, const Shape& shape, Initializer& init,
                            bool trainable) {
  weights_.push_back(std::make_unique<Variable>(name_ + "/" + weight_name, init(shape), trainable));
  return *weights_.back();
}

}  // namespace dtrain::nn
