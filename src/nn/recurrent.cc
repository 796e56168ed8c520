// LSTM, GRU, Bidirectional, TimeDistributed.
#include "dtrain/nn/recurrent.h"

#include "config.h"
#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/recurrent.h"
#include "layer_registry.h"
#include "masking.h"

namespace dtrain::nn {

using nlohmann::json;
using ops::RecurrentCell;

namespace {

ops::Activation recurrent_activation(const std::string& name, const std::string& where) {
  const ops::Activation a = ops::activation_from_name(name);
  DTRAIN_CHECK(a != ops::Activation::kSoftmax, where, ": activation '", name,
               "' is not supported in a recurrent cell");
  return a;
}

const char* cell_name(RecurrentCell c) {
  return c == RecurrentCell::kLstm ? "lstm_cell" : "gru_cell";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// RecurrentLayer.

RecurrentLayer::RecurrentLayer(RecurrentCell cell, int64_t units, RecurrentOptions options,
                               const char* default_name)
    : Layer(detail::name_or_default(options.name, default_name)),
      units_(units),
      options_(std::move(options)),
      kernel_init_(detail::make_initializer(options_.kernel_initializer, options_.seed)),
      recurrent_init_(detail::make_initializer(
          options_.recurrent_initializer,
          options_.seed ? std::optional<uint64_t>(*options_.seed + 1) : std::nullopt)),
      bias_init_(detail::make_initializer(options_.bias_initializer, std::nullopt)) {
  where_ = str_cat(cell == RecurrentCell::kLstm ? "LSTM" : "GRU", " '", name(), "'");
  DTRAIN_CHECK(units > 0, where_, ": units must be positive, got ", units);
  if (cell == RecurrentCell::kGru && !options_.reset_after) cell = RecurrentCell::kGruResetBefore;
  spec_ = {.cell = cell,
           .activation = recurrent_activation(options_.activation, where_),
           .recurrent_activation = recurrent_activation(options_.recurrent_activation, where_),
           .go_backwards = options_.go_backwards};
  if (options_.input_shape) {
    set_input_shape(*options_.input_shape);
    build(*options_.input_shape);
  }
}

void RecurrentLayer::build_impl(const Shape& input_shape) {
  DTRAIN_CHECK(input_shape.rank() == 2 && input_shape[1] > 0, where_,
               ": expected inputs [batch, time, features], got per-example shape ",
               input_shape.to_string());
  const int64_t G = is_lstm() ? 4 : 3, u = units_;
  const std::string cell = cell_name(spec_.cell);
  kernel_ = &add_weight(cell + "/kernel", Shape{input_shape[1], G * u}, *kernel_init_);
  recurrent_kernel_ = &add_weight(cell + "/recurrent_kernel", Shape{u, G * u}, *recurrent_init_);
  if (!options_.use_bias) return;
  if (spec_.cell == RecurrentCell::kGru) {
    bias_ = &add_weight(cell + "/bias", Shape{2, G * u}, *bias_init_);
  } else {
    bias_ = &add_weight(cell + "/bias", Shape{G * u}, *bias_init_);
  }
  if (is_lstm() && options_.unit_forget_bias) {
    // Keras: concat(init(u), ones(u), init(2u)).
    float* b = bias_->tensor().data<float>();
    for (int64_t j = 0; j < u; ++j) b[u + j] = 1.0f;
  }
}

std::vector<Tensor> RecurrentLayer::call_with_states(const Tensor& x, const Tensor& mask) {
  DTRAIN_CHECK(x.defined() && x.rank() == 3, where_,
               ": expected inputs [batch, time, features], got ",
               x.defined() ? x.shape().to_string() : "undefined");
  if (!built()) build(x.shape().without_first());
  const Tensor m = mask.defined() ? detail::sequence_mask(mask, x.dim(0), x.dim(1), *this) : mask;
  const Tensor states = recurrent_sequence(spec_, x, kernel_->value(), recurrent_kernel_->value(),
                                           bias_ ? bias_->value() : Tensor(), where_.c_str(), m);
  const int64_t B = x.dim(0), T = x.dim(1), u = units_;
  DTRAIN_CHECK(T > 0, where_, ": the input sequence is empty (", x.shape().to_string(), ")");
  const Tensor h = reshape(slice_sequence(states, T - 1, T, 0, u), Shape{B, u});
  const Tensor output = options_.return_sequences ? slice_sequence(states, 0, T, 0, u) : h;
  if (!is_lstm()) return {output, h};
  const Tensor c = reshape(slice_sequence(states, T - 1, T, u, 2 * u), Shape{B, u});
  return {output, h, c};
}

Tensor RecurrentLayer::call(const Tensor& x, bool) { return call_with_states(x)[0]; }

Tensor RecurrentLayer::call_with_mask(const Tensor& x, const Tensor& mask, bool) {
  return call_with_states(x, mask)[0];
}

Tensor RecurrentLayer::compute_mask(const Tensor&, const Tensor& mask) const {
  return options_.return_sequences ? mask : Tensor();
}

std::vector<Tensor> RecurrentLayer::call_list(std::span<const Tensor> inputs, bool training) {
  return call_list_masked(inputs, {}, training);
}

std::vector<Tensor> RecurrentLayer::call_list_masked(std::span<const Tensor> inputs,
                                                     std::span<const Tensor> masks, bool training) {
  DTRAIN_CHECK(inputs.size() == 1, where_,
               ": expects one input (initial states are not supported), got ", inputs.size());
  const Tensor mask = masks.empty() ? Tensor() : masks[0];
  if (!options_.return_state) return {call_masked(inputs[0], mask, training)};
  return call_with_states(inputs[0], mask);  // builds on the first call
}

Shape RecurrentLayer::compute_output_shape(const Shape& input_shape) const {
  if (options_.return_sequences) return Shape{input_shape[0], units_};
  return Shape{units_};
}

std::vector<Shape> RecurrentLayer::compute_output_shapes(
    std::span<const Shape> input_shapes) const {
  DTRAIN_CHECK(input_shapes.size() == 1, where_, ": expects one input, got ", input_shapes.size());
  std::vector<Shape> out{compute_output_shape(input_shapes[0])};
  if (options_.return_state) {
    for (int i = 0; i < (is_lstm() ? 2 : 1); ++i) out.push_back(Shape{units_});
  }
  return out;
}

std::string RecurrentLayer::config_json() const {
  json c = detail::base_config(*this);
  c["units"] = units_;
  c["activation"] = ops::activation_name(spec_.activation);
  c["recurrent_activation"] = ops::activation_name(spec_.recurrent_activation);
  c["use_bias"] = options_.use_bias;
  c["kernel_initializer"] = detail::initializer_config(*kernel_init_);
  c["recurrent_initializer"] = detail::initializer_config(*recurrent_init_);
  c["bias_initializer"] = detail::initializer_config(*bias_init_);
  if (is_lstm()) c["unit_forget_bias"] = options_.unit_forget_bias;
  for (const char* k :
       {"kernel_regularizer", "recurrent_regularizer", "bias_regularizer", "activity_regularizer",
        "kernel_constraint", "recurrent_constraint", "bias_constraint"}) {
    c[k] = nullptr;
  }
  c["dropout"] = 0.0;
  c["recurrent_dropout"] = 0.0;
  c["return_sequences"] = options_.return_sequences;
  c["return_state"] = options_.return_state;
  c["go_backwards"] = options_.go_backwards;
  c["stateful"] = false;
  c["unroll"] = false;
  c["time_major"] = false;
  c["implementation"] = 2;
  if (!is_lstm()) c["reset_after"] = options_.reset_after;
  return c.dump();
}

LSTM::LSTM(int64_t units, RecurrentOptions options)
    : RecurrentLayer(RecurrentCell::kLstm, units, std::move(options), "lstm") {}

std::shared_ptr<RecurrentLayer> LSTM::clone_as(const std::string& name, bool go_backwards) const {
  RecurrentOptions o = options();
  o.name = name;
  o.go_backwards = go_backwards;
  o.input_shape = std::nullopt;
  return std::make_shared<LSTM>(units(), o);
}

GRU::GRU(int64_t units, RecurrentOptions options)
    : RecurrentLayer(RecurrentCell::kGru, units, std::move(options), "gru") {}

std::shared_ptr<RecurrentLayer> GRU::clone_as(const std::string& name, bool go_backwards) const {
  RecurrentOptions o = options();
  o.name = name;
  o.go_backwards = go_backwards;
  o.input_shape = std::nullopt;
  return std::make_shared<GRU>(units(), o);
}

// ---------------------------------------------------------------------------------------------
// Bidirectional.

Bidirectional::Bidirectional(const RecurrentLayer& layer, BidirectionalOptions options)
    : Layer(detail::name_or_default(options.name, "bidirectional")),
      merge_mode_(options.merge_mode) {
  DTRAIN_CHECK(merge_mode_ == "concat" || merge_mode_ == "sum" || merge_mode_ == "mul" ||
                   merge_mode_ == "ave",
               "Bidirectional '", name(), "': merge_mode must be concat, sum, mul or ave, got '",
               merge_mode_, "'");
  // Keras 3 serializes the forward copy itself ("forward_lstm"): strip the prefix as Keras does.
  std::string base = layer.name();
  if (base.rfind("forward_", 0) == 0) base = base.substr(8);
  forward_ = layer.clone_as(name() + "/forward_" + base, layer.options().go_backwards);
  backward_ = layer.clone_as(name() + "/backward_" + base, !layer.options().go_backwards);
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
    build(*options.input_shape);
  }
}

void Bidirectional::build_impl(const Shape& input_shape) {
  forward_->build(input_shape);
  backward_->build(input_shape);
}

std::vector<Tensor> Bidirectional::run(const Tensor& x, const Tensor& mask) {
  std::vector<Tensor> f = forward_->call_with_states(x, mask);
  std::vector<Tensor> b = backward_->call_with_states(x, mask);
  Tensor yb = b[0];
  if (backward_->options().return_sequences) yb = reverse_sequence(yb);
  if (mask.defined() && forward_->options().return_sequences) {
    // Keras's Bidirectional sets zero_output_for_mask = return_sequences on both directions.
    const Tensor m = reshape(detail::sequence_mask(mask, x.dim(0), x.dim(1), *this),
                             Shape{x.dim(0), x.dim(1), 1});
    f[0] = multiply(f[0], m);
    yb = multiply(yb, m);
  }
  Tensor merged;
  if (merge_mode_ == "concat") {
    merged = concat_last_axis(f[0], yb);
  } else if (merge_mode_ == "sum") {
    merged = add(f[0], yb);
  } else if (merge_mode_ == "mul") {
    merged = multiply(f[0], yb);
  } else {
    merged = scale(add(f[0], yb), 0.5f);
  }
  std::vector<Tensor> out{merged};
  out.insert(out.end(), f.begin() + 1, f.end());
  out.insert(out.end(), b.begin() + 1, b.end());
  return out;
}

Tensor Bidirectional::call(const Tensor& x, bool) { return run(x, Tensor())[0]; }

Tensor Bidirectional::call_with_mask(const Tensor& x, const Tensor& mask, bool) {
  return run(x, mask)[0];
}

Tensor Bidirectional::compute_mask(const Tensor&, const Tensor& mask) const {
  return forward_->options().return_sequences ? mask : Tensor();
}

std::vector<Tensor> Bidirectional::call_list(std::span<const Tensor> inputs, bool training) {
  return call_list_masked(inputs, {}, training);
}

std::vector<Tensor> Bidirectional::call_list_masked(std::span<const Tensor> inputs,
                                                    std::span<const Tensor> masks, bool training) {
  DTRAIN_CHECK(inputs.size() == 1, "Bidirectional '", name(), "': expects one input, got ",
               inputs.size());
  const Tensor mask = masks.empty() ? Tensor() : masks[0];
  if (!forward_->options().return_state) return {call_masked(inputs[0], mask, training)};
  DTRAIN_CHECK(inputs[0].defined() && inputs[0].rank() == 3, "Bidirectional '", name(),
               "': expected inputs [batch, time, features]");
  if (!built()) build(inputs[0].shape().without_first());
  return run(inputs[0], mask);
}

Shape Bidirectional::compute_output_shape(const Shape& input_shape) const {
  Shape s = forward_->compute_output_shape(input_shape);
  if (merge_mode_ == "concat") s[s.rank() - 1] *= 2;
  return s;
}

std::vector<Shape> Bidirectional::compute_output_shapes(std::span<const Shape> input_shapes) const {
  std::vector<Shape> f = forward_->compute_output_shapes(input_shapes);
  std::vector<Shape> out{compute_output_shape(input_shapes[0])};
  for (int k = 0; k < 2; ++k) out.insert(out.end(), f.begin() + 1, f.end());
  return out;
}

std::vector<Variable*> Bidirectional::weights() {
  std::vector<Variable*> out = forward_->weights();
  for (Variable* v : backward_->weights()) out.push_back(v);
  return out;
}

std::string Bidirectional::config_json() const {
  json c = detail::base_config(*this);
  json inner = json::parse(forward_->config_json());
  // Keras stores the wrapped layer under its own name, not forward_<name>.
  const std::string prefix = name() + "/forward_";
  inner["name"] = forward_->name().substr(prefix.size());
  c["layer"] = {{"class_name", forward_->class_name()}, {"config", inner}};
  c["merge_mode"] = merge_mode_;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------
// TimeDistributed.

TimeDistributed::TimeDistributed(std::shared_ptr<Layer> layer, TimeDistributedOptions options)
    : Layer(detail::name_or_default(options.name, "time_distributed")), layer_(std::move(layer)) {
  DTRAIN_CHECK(layer_ != nullptr, "TimeDistributed '", name(), "': no layer given");
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
    build(*options.input_shape);
  }
}

void TimeDistributed::build_impl(const Shape& input_shape) {
  DTRAIN_CHECK(input_shape.rank() >= 1, "TimeDistributed '", name(),
               "': expected inputs [batch, time, ...], got per-example shape ",
               input_shape.to_string());
  layer_->build(input_shape.without_first());
}

Tensor TimeDistributed::call(const Tensor& x, bool training) {
  DTRAIN_CHECK(x.rank() >= 3, "TimeDistributed '", name(),
               "': expected inputs [batch, time, ...], got ", x.shape().to_string());
  const int64_t B = x.dim(0), T = x.dim(1);
  Shape folded = x.shape().without_first();
  folded[0] = B * T;
  const Tensor y = (*layer_)(reshape(x, folded), training);
  Shape out{B, T};
  for (int d = 1; d < y.rank(); ++d) out.push_back(y.dim(d));
  return reshape(y, out);
}

Shape TimeDistributed::compute_output_shape(const Shape& input_shape) const {
  const Shape inner = layer_->compute_output_shape(input_shape.without_first());
  Shape out{input_shape[0]};
  for (int d = 0; d < inner.rank(); ++d) out.push_back(inner[d]);
  return out;
}

std::vector<Variable*> TimeDistributed::weights() { return layer_->weights(); }

std::string TimeDistributed::config_json() const {
  json c = detail::base_config(*this);
  c["layer"] = {{"class_name", layer_->class_name()},
                {"config", json::parse(layer_->config_json())}};
  return c.dump();
}

// ---------------------------------------------------------------------------------------------
// Rebuilding from Keras configs.

namespace {

RecurrentOptions recurrent_options(const json& c, const std::string& where) {
  for (const char* k : {"dropout", "recurrent_dropout"}) {
    DTRAIN_CHECK(detail::number_field(c, k, where, 0.0) == 0.0, where, ".", k,
                 ": recurrent dropout is not supported");
  }
  DTRAIN_CHECK(!detail::bool_field(c, "stateful", where, false), where,
               ".stateful: stateful RNNs are not supported");
  return RecurrentOptions{
      .activation = detail::str_field(c, "activation", where, "tanh"),
      .recurrent_activation = detail::str_field(c, "recurrent_activation", where, "sigmoid"),
      .use_bias = detail::bool_field(c, "use_bias", where, true),
      .return_sequences = detail::bool_field(c, "return_sequences", where, false),
      .return_state = detail::bool_field(c, "return_state", where, false),
      .go_backwards = detail::bool_field(c, "go_backwards", where, false),
      .unit_forget_bias = detail::bool_field(c, "unit_forget_bias", where, true),
      .reset_after = detail::bool_field(c, "reset_after", where, true),
      .kernel_initializer = detail::initializer_json(c, "kernel_initializer", "glorot_uniform"),
      .recurrent_initializer = detail::initializer_json(c, "recurrent_initializer", "orthogonal"),
      .bias_initializer = detail::initializer_json(c, "bias_initializer", "zeros"),
      .input_shape = detail::declared_input_shape(c, where),
      .name = detail::str_field(c, "name", where)};
}

std::shared_ptr<Layer> lstm_from_config(const json& c, const std::string& where) {
  return std::make_shared<LSTM>(detail::int_field(c, "units", where), recurrent_options(c, where));
}

std::shared_ptr<Layer> gru_from_config(const json& c, const std::string& where) {
  return std::make_shared<GRU>(detail::int_field(c, "units", where), recurrent_options(c, where));
}

std::shared_ptr<Layer> bidirectional_from_config(const json& c, const std::string& where) {
  DTRAIN_CHECK(c.contains("layer") && c["layer"].is_object(), where,
               ": Bidirectional without a \"layer\"");
  auto inner = detail::layer_from_json(c["layer"], where + ".layer");
  auto* rnn = dynamic_cast<RecurrentLayer*>(inner.get());
  DTRAIN_CHECK(rnn != nullptr, where, ".layer: Bidirectional wraps LSTM or GRU, got ",
               inner->class_name());
  if (c.contains("backward_layer") && !c["backward_layer"].is_null()) {
    // Keras 3 always writes the backward copy; accept it when it mirrors the forward layer.
    auto back = detail::layer_from_json(c["backward_layer"], where + ".backward_layer");
    auto* b = dynamic_cast<RecurrentLayer*>(back.get());
    DTRAIN_CHECK(b != nullptr && b->class_name() == rnn->class_name() &&
                     b->units() == rnn->units() &&
                     b->options().return_sequences == rnn->options().return_sequences &&
                     b->options().return_state == rnn->options().return_state &&
                     b->options().go_backwards != rnn->options().go_backwards,
                 where, ".backward_layer: only the mirror of the forward layer is supported");
  }
  return std::make_shared<Bidirectional>(
      *rnn, BidirectionalOptions{.merge_mode = detail::str_field(c, "merge_mode", where, "concat"),
                                 .input_shape = detail::declared_input_shape(c, where),
                                 .name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> time_distributed_from_config(const json& c, const std::string& where) {
  DTRAIN_CHECK(c.contains("layer") && c["layer"].is_object(), where,
               ": TimeDistributed without a \"layer\"");
  return std::make_shared<TimeDistributed>(
      detail::layer_from_json(c["layer"], where + ".layer"),
      TimeDistributedOptions{.input_shape = detail::declared_input_shape(c, where),
                             .name = detail::str_field(c, "name", where)});
}

}  // namespace

namespace detail {
void register_recurrent_layers(LayerRegistry& registry) {
  registry.add("LSTM", lstm_from_config);
  registry.add("GRU", gru_from_config);
  registry.add("Bidirectional", bidirectional_from_config);
  registry.add("TimeDistributed", time_distributed_from_config);
}
}  // namespace detail

}  // namespace dtrain::nn
