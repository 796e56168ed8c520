// Model, Sequential, summary() and Keras model JSON.
#include "dtrain/nn/model.h"

#include <iomanip>
#include <iostream>
#include <sstream>

#include "config.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/transformer.h"
#include "functional_config.h"
#include "json_text.h"
#include "layer_registry.h"
#include "masking.h"

namespace dtrain::nn {

using nlohmann::json;

Model::Model(std::string name) : Layer(std::move(name)) {}
Model::~Model() = default;

void Model::track(std::shared_ptr<Layer> layer, std::string attribute) {
  DTRAIN_CHECK(layer != nullptr, "Model '", this->name(), "': cannot track a null layer");
  for (const auto& l : layers_) {
    DTRAIN_CHECK(l->name() != layer->name(), "Model '", this->name(), "': two layers are named '",
                 layer->name(), "'; layer names must be unique");
  }
  attributes_.push_back(attribute.empty() ? layer->name() : std::move(attribute));
  layers_.push_back(std::move(layer));
}

Layer& Model::get_layer(const std::string& name) {
  for (auto& l : layers_) {
    if (l->name() == name) return *l;
  }
  throw NotFoundError(str_cat("Model '", this->name(), "': no layer named '", name, "'"));
}

std::vector<Variable*> Model::weights() {
  std::vector<Variable*> out = Layer::weights();
  for (auto& l : layers_) {
    for (Variable* v : l->weights()) out.push_back(v);
  }
  return out;
}

std::vector<Variable*> Model::trainable_weights() {
  std::vector<Variable*> out;
  if (!trainable()) return out;
  // Layer::weights() is the model's own weights; each sub-layer answers for its part.
  for (Variable* v : Layer::weights()) {
    if (v->trainable()) out.push_back(v);
  }
  for (auto& l : layers_) {
    for (Variable* v : l->trainable_weights()) out.push_back(v);
  }
  return out;
}

std::vector<Variable*> Model::non_trainable_weights() {
  if (!trainable()) return weights();
  std::vector<Variable*> out;
  for (Variable* v : Layer::weights()) {
    if (!v->trainable()) out.push_back(v);
  }
  for (auto& l : layers_) {
    for (Variable* v : l->non_trainable_weights()) out.push_back(v);
  }
  return out;
}

void Model::build_impl(const Shape& input_shape) {
  NoGradGuard no_grad;
  call(Tensor::zeros(input_shape.with_first(1)), false);
}

namespace {

std::string group_thousands(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

void summary_table(std::ostream& os, const std::string& model_name,
                   const std::vector<std::shared_ptr<Layer>>& layers,
                   const std::vector<std::string>& output_shapes, int64_t total,
                   int64_t trainable) {
  const int w1 = 29, w2 = 26, w3 = 10;
  const std::string rule(w1 + w2 + w3, '_'), dbl(w1 + w2 + w3, '=');
  os << "Model: \"" << model_name << "\"\n" << rule << "\n";
  os << std::left << std::setw(w1) << " Layer (type)" << std::setw(w2) << "Output Shape"
     << std::setw(w3) << "Param #"
     << "\n"
     << dbl << "\n";
  for (size_t i = 0; i < layers.size(); ++i) {
    Layer& l = *layers[i];
    os << std::left << std::setw(w1) << (" " + l.name() + " (" + l.class_name() + ")")
       << std::setw(w2) << output_shapes[i] << std::setw(w3) << l.count_params() << "\n";
    os << std::string(w1 + w2 + w3, ' ') << "\n";
  }
  os << dbl << "\n";
  os << "Total params: " << group_thousands(total) << "\n";
  os << "Trainable params: " << group_thousands(trainable) << "\n";
  os << "Non-trainable params: " << group_thousands(total - trainable) << "\n" << rule << "\n";
}

int64_t count(const std::vector<Variable*>& vars) {
  int64_t n = 0;
  for (const Variable* v : vars) n += v->shape().num_elements();
  return n;
}

}  // namespace

void Model::summary(std::ostream& os) const {
  auto& self = const_cast<Model&>(*this);
  std::vector<std::string> shapes(layers_.size(), "multiple");
  summary_table(os, name(), layers_, shapes, count(self.weights()),
                count(self.trainable_weights()));
}

void Model::summary() const { summary(std::cout); }

std::string Model::to_json() const {
  throw UnimplementedError(str_cat("Model '", name(),
                                   "': a subclassed model has no JSON config (its architecture "
                                   "is C++ code); save its weights instead"));
}

// ---------------------------------------------------------------------------------------------

Sequential::Sequential(std::initializer_list<LayerRef> layers, SequentialOptions options)
    : Model(options.name.empty() ? unique_layer_name("sequential") : options.name) {
  for (const LayerRef& l : layers) add_layer(l);
}

void Sequential::add_layer(LayerRef ref) {
  std::shared_ptr<Layer> layer = ref.get();
  DTRAIN_CHECK(layer != nullptr, "Sequential '", name(), "': cannot add a null layer");
  const bool first = layers().empty();
  track(layer);
  if (first && !built()) {
    // A first layer that knows its input shape fixes the model's (Keras builds eagerly then).
    if (layer->input_shape()) build(*layer->input_shape());
    return;
  }
  if (built()) {
    // Build the new layer for the output shape of the stack so far.
    Shape s = *input_shape();
    for (size_t i = 0; i + 1 < layers().size(); ++i) s = layers()[i]->compute_output_shape(s);
    layer->build(s);
  }
}

void Sequential::build_impl(const Shape& input_shape) {
  Shape s = input_shape;
  for (const auto& l : layers()) {
    l->build(s);
    s = l->compute_output_shape(s);
  }
}

Tensor Sequential::call(const Tensor& x, bool training) {
  DTRAIN_CHECK(!layers().empty(), "Sequential '", name(), "': the model has no layers");
  Tensor h = x, mask;  // the Keras mask travels beside the value (Layer::call_masked)
  for (const auto& l : layers()) {
    Tensor y = l->call_masked(h, mask, training);
    mask = l->compute_mask(h, mask);
    h = std::move(y);
  }
  detail::report_output_mask(this, mask);
  return h;
}

Shape Sequential::compute_output_shape(const Shape& input_shape) const {
  Shape s = input_shape;
  for (const auto& l : layers()) s = l->compute_output_shape(s);
  return s;
}

void Sequential::summary(std::ostream& os) const {
  auto& self = const_cast<Sequential&>(*this);
  std::vector<std::shared_ptr<Layer>> shown;
  std::vector<std::string> shapes;
  std::optional<Shape> s = input_shape();
  for (const auto& l : layers()) {
    if (s) s = l->compute_output_shape(*s);
    if (l->class_name() == "InputLayer") continue;  // Keras does not list it
    shown.push_back(l);
    shapes.push_back(s ? detail::batch_shape_string(*s) : "multiple");
  }
  summary_table(os, name(), shown, shapes, count(self.weights()), count(self.trainable_weights()));
}

std::string Sequential::to_json() const {
  json layers_json = json::array();
  const auto& ls = layers();
  // Keras ≥ 2.4 writes an explicit InputLayer first when the input shape is known.
  if (input_shape() && (ls.empty() || ls.front()->class_name() != "InputLayer")) {
    json in;
    json shape = json::array({nullptr});
    for (int64_t d : *input_shape()) shape.push_back(d);
    in["batch_input_shape"] = shape;
    in["dtype"] = "float32";
    in["sparse"] = false;
    in["ragged"] = false;
    in["name"] = (ls.empty() ? std::string("input") : ls.front()->name()) + "_input";
    layers_json.push_back({{"class_name", "InputLayer"}, {"config", in}});
  }
  for (const auto& l : ls) {
    layers_json.push_back(
        {{"class_name", l->class_name()}, {"config", json::parse(l->config_json())}});
  }
  json j;
  j["class_name"] = "Sequential";
  j["config"] = {{"name", name()}, {"layers", layers_json}};
  j["keras_version"] = "2.12.0";
  j["backend"] = "tensorflow";
  return j.dump();
}

// ---------------------------------------------------------------------------------------------

namespace {

// model_from_json after the parse.
std::unique_ptr<Model> model_from_parsed(const json& j) {
  DTRAIN_CHECK(j.is_object() && j.contains("class_name") && j["class_name"].is_string(),
               "model_from_json: expected {\"class_name\": \"Sequential\", \"config\": ...}");
  const std::string cls = j["class_name"].get<std::string>();
  DTRAIN_CHECK(j.contains("config"), "model_from_json: missing \"config\"");
  const json& config = j["config"];
  // Keras 2 writes "Functional" (and before TF 2.4 "Model") for functional models.
  if (cls == "Functional" || cls == "Model") {
    return detail::functional_from_config(config, "model_from_json");
  }
  // dtrain's subclassed models (Keras 3 writes them as {"module": "dtrain", "class_name": "GPT",
  // "registered_name": "dtrain>GPT"}).
  if (cls == "GPT" || j.value("registered_name", json()) == json("dtrain>GPT")) {
    return GPT::from_config(config.dump(), "model_from_json: GPT config");
  }
  DTRAIN_CHECK(cls == "Sequential", "model_from_json: model class '", cls,
               "' is not supported (Sequential and Functional models can be rebuilt from JSON)");
  // Keras < 2.3 wrote the layer list itself as the config.
  const json& layers = config.is_array() ? config : config.value("layers", json());
  DTRAIN_CHECK(layers.is_array(), "model_from_json: config.layers must be a list");
  const std::string name = config.is_object() ? config.value("name", std::string()) : std::string();
  auto model = std::make_unique<Sequential>(std::initializer_list<LayerRef>{},
                                            SequentialOptions{.name = name});
  for (size_t i = 0; i < layers.size(); ++i) {
    auto layer = detail::layer_from_json(layers[i], str_cat("model_from_json: layers[", i, "]"));
    if (layer->class_name() == "InputLayer") {
      // The input layer only declares the shape; the model keeps it.
      DTRAIN_CHECK(model->layers().empty(), "model_from_json: layers[", i,
                   "]: InputLayer must come first");
      model->build(*layer->input_shape());
      continue;
    }
    model->add_layer(layer);
  }
  // Keras 3 records the input shape of a Sequential without an InputLayer in build_config
  // (and in config.build_input_shape).
  if (!model->built() && j.contains("build_config") && j["build_config"].is_object()) {
    const json& input_shape = j["build_config"].value("input_shape", json());
    if (!input_shape.is_null()) {
      model->build(
          detail::batch_shape_from_json(input_shape, "model_from_json: build_config.input_shape"));
    }
  }
  if (!model->built() && config.is_object() && config.contains("build_input_shape") &&
      !config["build_input_shape"].is_null()) {
    model->build(detail::batch_shape_from_json(config["build_input_shape"],
                                               "model_from_json: config.build_input_shape"));
  }
  return model;
}

}  // namespace

std::unique_ptr<Model> model_from_json(const std::string& text) {
  return detail::from_json_text(text, "model_from_json", model_from_parsed);
}

}  // namespace dtrain::nn
