// Private to the train layer: the pieces of model saving (saving.cc, Keras 2 .h5) that the Keras 3
// formats (saving_keras3.cc: .keras archives and the Keras 3 .h5 dialect) share.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/checkpoint/keras_v3.h"
#include "dtrain/nn/functional.h"
#include "dtrain/nn/losses.h"
#include "dtrain/nn/model.h"
#include "dtrain/optim/optimizer.h"
#include "dtrain/train/saving.h"

namespace dtrain::train::detail {

// Where a tokenizer saved with the model lives in a .keras archive (under assets/).
inline constexpr const char* kTokenizerAsset = "tokenizer/tokenizer.json";

void warn(const std::string& message);
// FailedPreconditionError naming `fn` unless the model is built.
void check_built(nn::Model& model, const char* fn);
// model.layers() without InputLayer (Keras's model.layers does not list it).
std::vector<nn::Layer*> saved_layers(nn::Model& model);
// Trainable weights, then non-trainable ones (Keras's order within a layer).
std::vector<Variable*> keras_ordered_weights(nn::Layer& layer);
// The weights the model owns itself (not through a sub-layer), trainable first.
std::vector<Variable*> own_weights(nn::Model& model);
// Builds every layer of a Sequential whose input shape is known.
void build_all_layers(nn::Model& model);
// Keras 2.12's {"class_name", "config"} of an optimizer, a schedule, a loss.
nlohmann::ordered_json optimizer_config_to_keras(const optim::OptimizerConfig& c);
nlohmann::ordered_json schedule_to_keras(const optim::ScheduleConfig& s);
nlohmann::ordered_json loss_to_keras(const nn::Loss& loss);

// --- Keras 3 (saving_keras3.cc) ----------------------------------------------------------------

// saving_keras3_config.cc:
// keras.src.utils.naming.to_snake_case: "MaxPooling2D" -> "max_pooling2d".
std::string snake_case(const std::string& name);
// [null, d0, d1, ...]: a per-example shape with the batch dimension, as Keras 3 writes shapes.
nlohmann::ordered_json batch_shape(const Shape& s);
// Keras 3's DTypePolicy object for `name` ("float32").
nlohmann::ordered_json dtype_policy(const std::string& name);
// {"class_name", "config"} -> Keras 3's {"module", "class_name", "config", "registered_name"}.
nlohmann::ordered_json keras3_object(const nlohmann::ordered_json& j, const char* module);
// Whether Keras 3.10 builds the class in its constructor (then it writes no build_config).
bool built_at_construction(const std::string& cls);
// The layer's Keras 3 class: its class_name(), but BatchNormalization for SyncBatchNormalization
// (Keras 3's synchronized=True), which also names its weights path.
std::string keras3_class_name(const nn::Layer& layer);
// A layer's config_json() (Keras 2 dialect) in the Keras 3 dialect.
nlohmann::ordered_json keras3_layer_config(const nn::Layer& layer);
// A Functional model's config in the Keras 3 dialect (saving_keras3_config.cc): the .keras
// archive's (`archive`: module, registered_name and build_config on every object) or the .h5
// model_config's.
nlohmann::ordered_json keras3_functional_config(const nn::Functional& model, bool archive);

// model.save to ".keras" (the native zip) and to ".h5" with SaveFormat::kKeras3H5.
void save_keras3_archive(nn::Model& model, const std::string& path, const SaveModelOptions& o);
void save_keras3_h5(nn::Model& model, const std::string& path, const SaveModelOptions& o);
// load_model of a .keras zip.
std::unique_ptr<nn::Model> load_keras3_archive(const std::string& path,
                                               const LoadModelOptions& options);
// load_weights of a .keras archive or a Keras 3 .weights.h5 (`vars`): by attribute path, every
// layer's variables checked before any is assigned.
void load_keras3_weights(nn::Model& model, const std::string& path,
                         const std::vector<checkpoint::KerasV3Vars>& vars);
// Whether an .h5 file was written by Keras 3 (keras_version "3.x").
bool is_keras3_h5(const checkpoint::KerasH5Contents& c);
// Restores iteration and slots from Keras 3's optimizer variables, in Keras 3's order: iteration,
// learning_rate (when the file has it), then the slots (Adam: momentum and velocity interleaved
// per variable, then velocity_hat). Returns "" on success, else why not (changing nothing).
std::string restore_keras3_optimizer_state(optim::Optimizer& opt,
                                           const std::vector<Variable*>& vars,
                                           const std::vector<const Tensor*>& values);

}  // namespace dtrain::train::detail
