// Whole-model saving in Keras's HDF5 format, as keras.models.save_model / load_model and
// Model.save_weights / load_weights with an ".h5" path (docs/keras-h5.md):
//
//   model.save("mnist.h5");                                  // architecture, weights, optimizer
//   std::unique_ptr<nn::Model> m = train::load_model("mnist.h5");
//   m->fit(x, y, {.epochs = 3, .initial_epoch = 2});         // continues where it stopped
//
// A saved model records its architecture (model_config), its compile() settings
// (training_config: loss, metrics, optimizer config) and the optimizer's state (iteration counter
// and slots), so the first step after load_model() is the step the original model would have
// taken. Files written by Keras 2.x (h5py 2 or 3 strings, old and new optimizer layouts) load,
// and Keras 2.12 loads what dtrain writes. For save_weights / load_weights, paths that do not
// end in ".h5", ".hdf5" or ".keras" are TensorFlow checkpoint prefixes (the model is the
// checkpoint's root object, as Keras's save_format="tf"). Not
// thread-safe with respect to the model: do not train it while saving or loading.
#pragma once

#include <memory>
#include <string>

#include "dtrain/nn/model.h"

namespace dtrain::data {
class Tokenizer;
}

namespace dtrain::train {

// Which Keras writes the file (docs/keras-files.md).
enum class SaveFormat {
  kAuto,       // ".keras": Keras 3's native zip; ".h5"/".hdf5": kKeras2H5
  kKeras2H5,   // the HDF5 layout of Keras 2.12's model.save (dtrain's default .h5)
  kKeras3H5,   // the legacy HDF5 layout as Keras 3 writes it (model.save("x.h5") in Keras 3)
  kKeras3Zip,  // Keras 3's native .keras zip (metadata.json, config.json, model.weights.h5)
};

struct SaveModelOptions {
  SaveFormat format = SaveFormat::kAuto;
  bool include_optimizer = true;  // write training_config and the optimizer state when compiled
  // Write h5py 2.x's fixed-length strings instead of h5py 3's variable-length ones (for tools
  // built on old h5py; Keras reads both).
  bool fixed_length_strings = false;
  // A tokenizer saved with the model (not owned; must outlive the call): in a .keras archive as
  // assets/tokenizer/tokenizer.json (Keras 3 keeps tokenizer vocabularies under assets/), in a
  // Keras 2 .h5 as the key "dtrain_tokenizer" of the root model_config JSON (Keras ignores
  // keys it does not know). Either holds Tokenizer::to_bytes(). load_tokenizer reads it back.
  const data::Tokenizer* tokenizer = nullptr;
};

// Writes `model` to `path` (".h5", ".hdf5" or ".keras"). ".h5"/".hdf5" get the layout of Keras
// 2.12's model.save (root attributes keras_version, backend, model_config and, when compiled,
// training_config; /model_weights, /optimizer_weights), or Keras 3's with SaveFormat::kKeras3H5;
// ".keras" gets Keras 3's native zip (config.json in the Keras 3 dialect with compile_config,
// metadata.json, model.weights.h5 with the optimizer's variables). The write is atomic (built in
// memory, then temp file, fsync, rename):
// an existing file is replaced whole or left untouched. Blocks until the file is on disk.
// Throws UnimplementedError for a subclassed model (its architecture is C++ code: use
// save_weights) or a path that is not an HDF5 path, FailedPreconditionError when the model has
// not been built, InvalidArgumentError for kKeras3Zip with a path not ending in ".keras", and
// what checkpoint::write_keras_h5 / write_keras_v3 throw for I/O failures.
void save_model(nn::Model& model, const std::string& path, const SaveModelOptions& options = {});

// The tokenizer saved with the model at `path` (SaveModelOptions::tokenizer), a .keras archive or
// an .h5 file. Throws NotFoundError naming the path when the file is missing or holds no
// tokenizer, DataLossError for a corrupt file or tokenizer.
std::unique_ptr<data::Tokenizer> load_tokenizer(const std::string& path);

struct LoadModelOptions {
  // Recompile with the saved loss, metrics and optimizer and restore the optimizer's state. When
  // false, or when the file has no training_config, the model comes back uncompiled.
  bool compile = true;
};

// Rebuilds the model saved at `path`, a Keras 2 or Keras 3 .h5 or a Keras 3 .keras zip (told apart
// by content, not name): architecture from model_config or config.json (nn::model_from_json;
// Sequential models only for .keras until Functional configs land),
// weights matched by layer name and checked shape by shape, and, with options.compile, compile()
// with the saved settings (training_config, or compile_config in a .keras) followed by the
// optimizer state (iteration and slots, from Keras >= 2.11 names such as "Adam/m/dense/kernel:0",
// older ones such as "Adam/dense/kernel/m:0", or Keras 3's "adam/iteration",
// "adam/sequential_dense_kernel_momentum" and .keras "optimizer/vars/<i>" by position). An
// optimizer state that does not fit the model is skipped with a warning on stderr, as Keras
// does, and the optimizer starts fresh. Throws NotFoundError (naming the path) for a missing
// file, DataLossError for a truncated or corrupt one (HDF5 or zip), InvalidArgumentError for a
// file without model_config (a weights file) or a .keras without config.json or with malformed
// JSON, an unknown layer class, a layer or weight the file and the
// architecture disagree on (naming the layer, the weight and both shapes), or a training_config
// dtrain cannot honour (an unknown loss, metric or optimizer; gradient clipping; legacy decay).
std::unique_ptr<nn::Model> load_model(const std::string& path,
                                      const LoadModelOptions& options = {});

// Writes the weights of `model` to `path` in the layout of Keras's save_weights to ".h5":
// root attributes layer_names, backend, keras_version and one group per layer (InputLayer
// excluded). Atomic like save_model. Throws FailedPreconditionError when the model has not been
// built, and what checkpoint::write_keras_h5 (or, for a TF checkpoint prefix — a path without
// ".h5", ".hdf5" or ".keras" — checkpoint::Checkpoint::write) throws for I/O failures.
void save_weights(nn::Model& model, const std::string& path);

struct LoadWeightsOptions {
  // Match file layers to model layers by name (Keras's by_name=True) instead of by position
  // among the layers that have weights.
  bool by_name = false;
  // With by_name: skip, with a warning, layers whose weight count or shapes differ.
  bool skip_mismatch = false;
};

// Loads weights written by save_weights or save_model (from /model_weights) into `model`, which
// must be built. Every shape is checked before anything is assigned, so a failed load leaves the
// model unchanged. Throws NotFoundError / DataLossError as load_model, FailedPreconditionError
// for an unbuilt model, InvalidArgumentError when the number of layers with weights differs
// (naming both lists) or a layer's weight count or a weight's shape differs (naming the layer,
// the weight and both shapes). A TF checkpoint prefix is restored by object path
// (checkpoint::Checkpoint::restore, with expect_partial) and throws as that does.
void load_weights(nn::Model& model, const std::string& path,
                  const LoadWeightsOptions& options = {});

// --- Building blocks (also used by the CLI and by checkpoint conversion) ----------------------

// The training_config JSON Keras 2.12 writes for a compiled model: {"loss", "metrics",
// "weighted_metrics", "loss_weights", "optimizer_config"}. Throws FailedPreconditionError when
// the model is not compiled.
std::string training_config_json(nn::Model& model);

// Compiles `model` as a saved training_config describes (Keras 2.x spellings: "Custom>Adam",
// "lr", legacy optimizer keys, loss as a name or {"class_name", "config"}, metrics as names or
// serialized metric objects, nested per output). Creates no optimizer slots. Throws
// InvalidArgumentError for what dtrain cannot honour, naming it.
void compile_from_training_config(nn::Model& model, const std::string& training_config);

}  // namespace dtrain::train
