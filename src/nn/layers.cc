// InputLayer, Dense, Flatten, Dropout, Activation, Masking.
#include "dtrain/nn/layers.h"

#include <algorithm>

#include "config.h"
#include "dtrain/autograd/functions.h"
#include "layer_registry.h"

namespace dtrain::nn {

using nlohmann::json;

using detail::add_batch_input_shape;
using detail::batch_shape_json;
using detail::make_initializer;
using detail::name_or_default;

// ---------------------------------------------------------------------------------------------

InputLayer::InputLayer(const Shape& shape, InputLayerOptions options)
    : Layer(name_or_default(options.name, "input")) {
  set_input_shape(shape);
  build(shape);
}

Tensor InputLayer::call(const Tensor& x, bool) { return x; }

std::string InputLayer::config_json() const {
  json c;
  c["batch_input_shape"] = batch_shape_json(*input_shape());
  c["dtype"] = "float32";
  c["sparse"] = false;
  c["ragged"] = false;
  c["name"] = name();
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

Dense::Dense(int64_t units, DenseOptions options)
    : Layer(name_or_default(options.name, "dense")),
      units_(units),
      activation_(ops::activation_from_name(options.activation)),
      use_bias_(options.use_bias),
      kernel_init_(make_initializer(options.kernel_initializer, options.seed)),
      bias_init_(make_initializer(options.bias_initializer, std::nullopt)) {
  DTRAIN_CHECK(units > 0, "Dense: units must be positive, got ", units);
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
    build(*options.input_shape);
  }
}

void Dense::build_impl(const Shape& input_shape) {
  DTRAIN_CHECK(input_shape.rank() >= 1 && input_shape.dim(-1) > 0, "Dense '", name(),
               "': cannot build for input shape ", input_shape.to_string(),
               "; the last dimension must be known and positive");
  kernel_ = &add_weight("kernel", Shape{input_shape.dim(-1), units_}, *kernel_init_);
  if (use_bias_) bias_ = &add_weight("bias", Shape{units_}, *bias_init_);
}

Tensor Dense::call(const Tensor& x, bool) {
  DTRAIN_CHECK(x.dim(-1) == kernel_->shape()[0], "Dense '", name(), "': input has ", x.dim(-1),
               " features, kernel expects ", kernel_->shape()[0]);
  const Tensor bias = bias_ ? bias_->value() : Tensor();
  if (x.rank() == 2) return dense(x, kernel_->value(), bias, activation_);
  // Rank > 2: fold the leading dimensions into the batch, as Keras's tensordot does.
  const int64_t features = x.dim(-1);
  const Tensor flat = reshape(x, Shape{x.num_elements() / features, features});
  const Tensor y = dense(flat, kernel_->value(), bias, activation_);
  Shape out = x.shape();
  out[out.rank() - 1] = units_;
  return reshape(y, out);
}

Shape Dense::compute_output_shape(const Shape& input_shape) const {
  Shape out = input_shape;
  if (out.rank() == 0) return Shape{units_};
  out[out.rank() - 1] = units_;
  return out;
}

std::string Dense::config_json() const {
  json c = detail::base_config(*this);
  add_batch_input_shape(*this, c);
  c["units"] = units_;
  c["activation"] = ops::activation_name(activation_);
  c["use_bias"] = use_bias_;
  c["kernel_initializer"] = detail::initializer_config(*kernel_init_);
  c["bias_initializer"] = detail::initializer_config(*bias_init_);
  c["kernel_regularizer"] = nullptr;
  c["bias_regularizer"] = nullptr;
  c["activity_regularizer"] = nullptr;
  c["kernel_constraint"] = nullptr;
  c["bias_constraint"] = nullptr;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

Flatten::Flatten(FlattenOptions options) : Layer(name_or_default(options.name, "flatten")) {
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
    build(*options.input_shape);
  }
}

Tensor Flatten::call(const Tensor& x, bool) {
  const int64_t batch = x.dim(0);
  return reshape(x, Shape{batch, batch == 0 ? 0 : x.num_elements() / batch});
}

Shape Flatten::compute_output_shape(const Shape& input_shape) const {
  return Shape{input_shape.num_elements()};
}

std::string Flatten::config_json() const {
  json c = detail::base_config(*this);
  add_batch_input_shape(*this, c);
  c["data_format"] = "channels_last";
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

Dropout::Dropout(float rate, DropoutOptions options)
    : Layer(name_or_default(options.name, "dropout")),
      rate_(rate),
      seed_(options.seed),
      seed_value_(options.seed ? *options.seed : next_seed()) {
  DTRAIN_CHECK(rate >= 0.0f && rate < 1.0f, "Dropout: rate must be in [0, 1), got ", rate);
}

Dropout::Dropout(Dropout&& other) noexcept
    : Layer(std::move(other)),
      rate_(other.rate_),
      seed_(other.seed_),
      seed_value_(other.seed_value_) {
  for (int r = 0; r < kMaxLocalReplicas; ++r) {
    calls_[r].store(other.calls_[r].load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
}

void Dropout::set_rng_state(RngState s) {
  seed_value_ = s.seed;
  for (auto& c : calls_) c.store(s.counter, std::memory_order_relaxed);
}

Tensor Dropout::call(const Tensor& x, bool training) {
  if (!training || rate_ == 0.0f) return x;
  Tensor mask(x.shape());
  float* pm = mask.data<float>();
  const ReplicaStream stream = current_replica_stream();
  const bool own = stream.replica >= 0 && stream.local < kMaxLocalReplicas;
  const uint64_t key = stream.replica >= 0
                           ? mix_seed(seed_value_, static_cast<uint64_t>(stream.replica) + 1)
                           : seed_value_;
  const uint64_t call =
      calls_[own ? static_cast<size_t>(stream.local) : 0].fetch_add(1, std::memory_order_relaxed);
  // Each call owns 2^32 values of the stream (a mask of up to 4 billion elements).
  DTRAIN_CHECK(mask.num_elements() <= (int64_t{1} << 32), "Dropout: input of ", mask.num_elements(),
               " elements is larger than 2^32");
  Philox rng(key, call << 32);
  const float keep_scale = 1.0f / (1.0f - rate_);
  for (int64_t i = 0, n = mask.num_elements(); i < n; ++i) {
    pm[i] = rng.uniform() >= rate_ ? keep_scale : 0.0f;
  }
  return multiply(x, mask);
}

std::string Dropout::config_json() const {
  json c = detail::base_config(*this);
  c["rate"] = rate_;
  c["noise_shape"] = nullptr;
  c["seed"] = seed_ ? json(*seed_) : json(nullptr);
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

Activation::Activation(const std::string& activation, ActivationOptions options)
    : Layer(name_or_default(options.name, "activation")),
      activation_(ops::activation_from_name(activation)) {}

Tensor Activation::call(const Tensor& x, bool) { return dtrain::activation(x, activation_); }

std::string Activation::config_json() const {
  json c = detail::base_config(*this);
  c["activation"] = ops::activation_name(activation_);
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

Masking::Masking(float mask_value, MaskingOptions options)
    : Layer(name_or_default(options.name, "masking")), mask_value_(mask_value) {
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
    build(*options.input_shape);
  }
}

void Masking::build_impl(const Shape& input_shape) {
  DTRAIN_CHECK(input_shape.rank() == 2, "Masking '", name(),
               "': expected inputs of rank 3 [batch, time, features] (dtrain's masks are [batch, "
               "time]), got [batch, ",
               input_shape.to_string().substr(1));
}

Tensor Masking::step_mask(const Tensor& x) const {
  DTRAIN_CHECK(x.rank() == 3 && x.dtype() == DType::kFloat32, "Masking '", name(),
               "': expected float32 inputs of rank 3 [batch, time, features], got ",
               dtype_name(x.dtype()), " ", x.shape().to_string());
  const int64_t steps = x.dim(0) * x.dim(1), features = x.dim(2);
  Tensor m = Tensor::zeros(Shape{x.dim(0), x.dim(1)});
  const float* in = x.data<float>();
  float* out = m.data<float>();
  for (int64_t s = 0; s < steps; ++s) {
    const float* f = in + s * features;
    // not_equal, as Keras: NaN differs from everything, a NaN mask_value from every feature.
    out[s] = std::any_of(f, f + features, [v = mask_value_](float e) { return e != v; });
  }
  return m;
}

Tensor Masking::call(const Tensor& x, bool) {
  const Tensor m = step_mask(x);
  return multiply(x, reshape(m, Shape{x.dim(0), x.dim(1), 1}));  // dx = dy on unmasked steps
}

Tensor Masking::compute_mask(const Tensor& x, const Tensor&) const { return step_mask(x); }

std::string Masking::config_json() const {
  json c = detail::base_config(*this);
  add_batch_input_shape(*this, c);
  c["mask_value"] = mask_value_;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------
// Rebuilding from Keras configs.

namespace {

std::shared_ptr<Layer> input_layer_from_config(const json& c, const std::string& where) {
  const std::optional<Shape> shape = detail::declared_input_shape(c, where);
  DTRAIN_CHECK(shape.has_value(), where, ": InputLayer without batch_input_shape or batch_shape");
  return std::make_shared<InputLayer>(
      *shape, InputLayerOptions{.name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> dense_from_config(const json& c, const std::string& where) {
  auto dense = std::make_shared<Dense>(
      detail::int_field(c, "units", where),
      DenseOptions{
          .activation = detail::str_field(c, "activation", where, "linear"),
          .use_bias = detail::bool_field(c, "use_bias", where, true),
          .kernel_initializer = detail::initializer_json(c, "kernel_initializer", "glorot_uniform"),
          .bias_initializer = detail::initializer_json(c, "bias_initializer", "zeros"),
          .input_shape = detail::declared_input_shape(c, where),
          .name = detail::str_field(c, "name", where)});
  return dense;
}

std::shared_ptr<Layer> flatten_from_config(const json& c, const std::string& where) {
  return std::make_shared<Flatten>(
      FlattenOptions{.input_shape = detail::declared_input_shape(c, where),
                     .name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> dropout_from_config(const json& c, const std::string& where) {
  std::optional<uint64_t> seed;
  if (c.contains("seed") && c["seed"].is_number_integer()) seed = c["seed"].get<uint64_t>();
  return std::make_shared<Dropout>(
      static_cast<float>(detail::number_field(c, "rate", where)),
      DropoutOptions{.seed = seed, .name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> activation_from_config(const json& c, const std::string& where) {
  return std::make_shared<Activation>(
      detail::str_field(c, "activation", where, "linear"),
      ActivationOptions{.name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> masking_from_config(const json& c, const std::string& where) {
  return std::make_shared<Masking>(
      static_cast<float>(detail::number_field(c, "mask_value", where, 0.0)),
      MaskingOptions{.input_shape = detail::declared_input_shape(c, where),
                     .name = detail::str_field(c, "name", where)});
}

}  // namespace

namespace detail {
void register_core_layers(LayerRegistry& registry) {
  registry.add("InputLayer", input_layer_from_config);
  registry.add("Dense", dense_from_config);
  registry.add("Flatten", flatten_from_config);
  registry.add("Dropout", dropout_from_config);
  registry.add("Activation", activation_from_config);
  registry.add("Masking", masking_from_config);
}
}  // namespace detail

}  // namespace dtrain::nn
