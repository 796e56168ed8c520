// Model: a layer made of tracked sub-layers, with Keras's training API. Subclass it and
// override call(), creating sub-layers with add(), as the Keras subclassing tutorial does:
//
//   class MyModel : public dtrain::nn::Model {
//    public:
//     Tensor call(const Tensor& x, bool training) override { return d2_(d1_(x)); }
//    private:
//     dtrain::nn::Dense& d1_ = add("dense1", dtrain::nn::Dense(10, {.activation = "relu"}));
//     dtrain::nn::Dense& d2_ = add("dense2", dtrain::nn::Dense(1));
//   };
//
// compile/fit/evaluate/predict are declared here and implemented by the train layer
// (src/train/), so programs that use them link the umbrella target `dtrain`. Not thread-safe.
#pragma once

#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/nn/layer.h"

namespace dtrain::data {
class Dataset;
}
namespace dtrain::optim {
class Optimizer;
}
namespace dtrain::train {
struct CompileOptions;
struct FitOptions;
struct EvaluateOptions;
struct PredictOptions;
class History;
class TrainingState;
class TrainingAccess;
}  // namespace dtrain::train

namespace dtrain::nn {
class Loss;
class Metric;
}  // namespace dtrain::nn

namespace dtrain::nn {

// Metric name → value, e.g. {"loss": 0.41, "accuracy": 0.85} (Keras's logs dict).
using Logs = std::map<std::string, double>;

class Model : public Layer {
 public:
  explicit Model(std::string name = {});
  ~Model() override;
  Model(Model&&) = default;
  Model& operator=(Model&&) = default;

  std::string class_name() const override { return "Model"; }

  // Takes ownership of `layer` and tracks it; returns a reference that lives as long as the
  // model. `attribute` is the name it is tracked under in checkpoints (TF uses the Python
  // attribute name); empty means the layer's name.
  template <class L>
  L& add(L layer) {
    return add(std::string(), std::move(layer));
  }
  template <class L>
  L& add(std::string attribute, L layer) {
    auto p = std::make_shared<L>(std::move(layer));
    L& ref = *p;
    track(std::move(p), std::move(attribute));
    return ref;
  }
  void track(std::shared_ptr<Layer> layer, std::string attribute = {});

  // Tracked sub-layers in order, and the names they are tracked under.
  const std::vector<std::shared_ptr<Layer>>& layers() const { return layers_; }
  const std::vector<std::string>& layer_attributes() const { return attributes_; }
  // The sub-layer called `name`; throws NotFoundError.
  Layer& get_layer(const std::string& name);

  std::vector<Variable*> weights() override;
  std::vector<Variable*> trainable_weights() override;
  std::vector<Variable*> non_trainable_weights() override;
  // TF's names for the same lists.
  std::vector<Variable*> variables() { return weights(); }
  std::vector<Variable*> trainable_variables() { return trainable_weights(); }
  std::vector<Variable*> non_trainable_variables() { return non_trainable_weights(); }

  // Prints Keras's model.summary() table.
  virtual void summary(std::ostream& os) const;
  void summary() const;

  // Keras's model JSON ({"class_name": ..., "config": ..., "keras_version": ..., ...}).
  // Throws UnimplementedError for subclassed models (Keras cannot serialize them either).
  virtual std::string to_json() const;

  // --- Training (implemented in src/train/) -------------------------------------------------
  // Keras's model.save / save_weights / load_weights for ".h5", ".hdf5" and ".keras" paths
  // (dtrain/train/saving.h has the details, the options and load_model); save_weights and
  // load_weights also take TensorFlow checkpoint prefixes (other paths).
  void save(const std::string& path);
  void save_weights(const std::string& path);
  void load_weights(const std::string& path);
  // Configures loss, optimizer and metrics (keras Model.compile).
  void compile(const train::CompileOptions& options);
  bool compiled() const;
  // Trains on a batched dataset of (x, y) elements, or on tensors split into batches of
  // options.batch_size. Returns the per-epoch history. Blocks until done.
  train::History fit(const data::Dataset& dataset, const train::FitOptions& options);
  train::History fit(const Tensor& x, const Tensor& y, const train::FitOptions& options);
  // Loss and metrics over a batched dataset or tensors.
  Logs evaluate(const data::Dataset& dataset, const train::EvaluateOptions& options);
  Logs evaluate(const Tensor& x, const Tensor& y, const train::EvaluateOptions& options);
  // Model outputs for every example, concatenated along the batch dimension.
  Tensor predict(const Tensor& x, const train::PredictOptions& options);
  Tensor predict(const data::Dataset& dataset, const train::PredictOptions& options);
  // The compiled optimizer, loss and metrics (null / empty before compile()). metrics() is
  // Keras's model.metrics: the loss tracker ("loss") first, then the compiled metrics.
  optim::Optimizer* optimizer();
  Loss* loss();
  std::vector<Metric*> metrics();

 protected:
  // Builds a subclassed model by running call() on a zero batch of one example.
  void build_impl(const Shape& input_shape) override;
  // Any shape of the built rank: each sub-layer checks its own axes when called (a wrong feature
  // size throws naming that layer), so a model built on 128 tokens runs on 37.
  bool accepts_input_shape(const Shape& built_for, const Shape& input_shape) const override {
    return same_rank_and_trailing(built_for, input_shape, 0);
  }

 private:
  std::vector<std::shared_ptr<Layer>> layers_;
  std::vector<std::string> attributes_;
  // What compile() set up, owned here and used only by the train layer (src/train/).
  friend class train::TrainingAccess;
  std::shared_ptr<train::TrainingState> training_;
};

// A layer handed to Sequential: any Layer subclass by value, or a shared_ptr to one.
class LayerRef {
 public:
  template <class L, class = std::enable_if_t<std::is_base_of_v<Layer, std::decay_t<L>>>>
  LayerRef(L&& layer) : ptr_(std::make_shared<std::decay_t<L>>(std::forward<L>(layer))) {}
  LayerRef(std::shared_ptr<Layer> layer) : ptr_(std::move(layer)) {}
  const std::shared_ptr<Layer>& get() const { return ptr_; }

 private:
  std::shared_ptr<Layer> ptr_;
};

struct SequentialOptions {
  std::string name = {};  // default "sequential", "sequential_1", ...
};

// A linear stack of layers (keras.Sequential):
//   nn::Sequential model({nn::Dense(128, {.activation = "relu", .input_shape = Shape{784}}),
//                         nn::Dense(10)});
class Sequential : public Model {
 public:
  explicit Sequential(std::initializer_list<LayerRef> layers = {}, SequentialOptions options = {});
  std::string class_name() const override { return "Sequential"; }
  // Appends a layer; builds it when the model's input shape is known.
  void add_layer(LayerRef layer);
  Tensor call(const Tensor& x, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  using Model::summary;
  void summary(std::ostream& os) const override;
  std::string to_json() const override;

 protected:
  void build_impl(const Shape& input_shape) override;
};

// Rebuilds a model from Keras's model JSON: a Sequential, or a Functional (class "Functional"
// or "Model"; dtrain/nn/functional.h), of any registered layer classes, or dtrain's GPT
// (dtrain/nn/transformer.h), as written by Keras 2.x
// or Keras 3 `model.to_json()` or found in an .h5 model_config. Throws InvalidArgumentError
// naming the problem and the JSON path (e.g. "layers[2]").
std::unique_ptr<Model> model_from_json(const std::string& json);

}  // namespace dtrain::nn
