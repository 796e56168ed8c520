// Model saving in Keras's HDF5 format: the glue between models, compile() settings and optimizer
// state on one side and checkpoint::KerasH5Contents on the other. Keras's JSON spellings for
// optimizers, schedules, losses and metrics are translated here in both directions. Not
// thread-safe with respect to the model being saved or loaded.
#include "dtrain/train/saving.h"

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/checkpoint/keras_v3.h"
#include "dtrain/core/error.h"
#include "dtrain/data/tokenizer.h"
#include "dtrain/nn/functional.h"
#include "dtrain/train/training.h"
#include "saving_internal.h"
#include "training_state.h"

namespace dtrain::train {
namespace {

namespace ck = dtrain::checkpoint;
using nlohmann::json;
using nlohmann::ordered_json;

// What dtrain writes as keras_version: the Keras release whose layout it follows.
constexpr const char* kKerasVersion = "2.12.0";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Paths handled here: Keras's HDF5 suffixes, or an existing HDF5 file under any name (as Keras
// checks h5py.is_hdf5). Anything else is a TF checkpoint prefix.
bool is_h5(const std::string& path) { return ck::is_keras_h5_path(path) || ck::is_hdf5_file(path); }

}  // namespace

namespace detail {

void warn(const std::string& message) { std::cerr << "WARNING: " << message << "\n"; }

void check_built(nn::Model& model, const char* fn) {
  if (!model.built()) {
    throw FailedPreconditionError(str_cat(
        fn, ": model '", model.name(),
        "' has not been built yet, so it has no weights: build it (declare the input shape, call "
        "build(input_shape) or fit()) first"));
  }
}

// The layers that own weight groups in a file: Keras's model.layers, which for a Sequential
// does not list the InputLayer, and for a Functional does (its group holds no weights).
std::vector<nn::Layer*> saved_layers(nn::Model& model) {
  const bool functional = dynamic_cast<nn::Functional*>(&model) != nullptr;
  std::vector<nn::Layer*> out;
  for (const auto& l : model.layers()) {
    if (functional || l->class_name() != "InputLayer") out.push_back(l.get());
  }
  return out;
}

// Keras's order of a layer's weights in its group: trainable ones, then non-trainable ones.
std::vector<Variable*> keras_ordered_weights(nn::Layer& layer) {
  std::vector<Variable*> out = layer.trainable_weights();
  for (Variable* v : layer.non_trainable_weights()) out.push_back(v);
  return out;
}

// The weights the model owns itself (not through a sub-layer), trainable first.
std::vector<Variable*> own_weights(nn::Model& model) {
  std::vector<Variable*> trainable, frozen;
  for (Variable* v : model.nn::Layer::weights()) {
    (model.trainable() && v->trainable() ? trainable : frozen).push_back(v);
  }
  trainable.insert(trainable.end(), frozen.begin(), frozen.end());
  return trainable;
}

}  // namespace detail

namespace {

using namespace detail;

std::vector<ck::H5Weight> to_h5(const std::vector<Variable*>& vars) {
  std::vector<ck::H5Weight> out;
  out.reserve(vars.size());
  for (Variable* v : vars) out.push_back({ck::keras_weight_name(v->name()), v->tensor()});
  return out;
}

ck::KerasH5Contents weights_contents(nn::Model& model) {
  ck::KerasH5Contents c;
  c.keras_version = kKerasVersion;
  for (nn::Layer* l : saved_layers(model)) {
    c.layers.push_back({l->name(), to_h5(keras_ordered_weights(*l))});
  }
  c.top_level_weights = to_h5(own_weights(model));
  return c;
}

}  // namespace

namespace {

// --- Optimizer state ----------------------------------------------------------------------------

// The optimizer's variables in the order Keras 2.12 creates them (its set_weights is
// positional): iteration, then Adam/AdamW m and v interleaved per variable (vhat after), SGD m per
// variable (zeros when dtrain keeps none, as Keras always creates them), RMSprop and others slot by
// slot.
std::vector<ck::H5Weight> optimizer_weights_in_keras_order(optim::Optimizer& opt,
                                                           const std::vector<Variable*>& vars) {
  std::vector<ck::H5Weight> out;
  out.push_back({ck::keras_weight_name(opt.iterations_variable().name()),
                 opt.iterations_variable().tensor()});
  for (Variable* v : vars) {
    bool all = true;
    for (const std::string& s : opt.slot_names()) all = all && opt.slot(*v, s) != nullptr;
    if (!all) return out;  // not built yet: Keras writes only the iteration then too
  }
  const std::string cls = opt.get_config().class_name;
  const std::vector<std::string> slots = opt.slot_names();
  auto add = [&](Variable* v, const std::string& s) {
    Variable* slot = opt.slot(*v, s);
    out.push_back({ck::keras_weight_name(slot->name()), slot->tensor()});
  };
  auto has = [&](const std::string& s) {
    return std::find(slots.begin(), slots.end(), s) != slots.end();
  };
  if (cls == "Adam" || cls == "AdamW") {
    for (Variable* v : vars) {
      add(v, "m");
      add(v, "v");
    }
    if (has("vhat")) {
      for (Variable* v : vars) add(v, "vhat");
    }
  } else if (cls == "SGD") {
    for (Variable* v : vars) {
      if (has("m")) {
        add(v, "m");
      } else {
        out.push_back({str_cat(opt.name(), "/m/", v->name(), ":0"), Tensor::zeros(v->shape())});
      }
    }
  } else {
    for (const std::string& s : slots) {
      for (Variable* v : vars) add(v, s);
    }
  }
  return out;
}

// dtrain's slot name for a slot name found in a file, "" when this optimizer keeps no such slot.
std::string slot_alias(const std::string& file_slot, const std::string& cls,
                       const std::vector<std::string>& slots) {
  std::string s = file_slot;
  // Names of OptimizerV2 (TF 2.0-2.10) slots that Keras >= 2.11 renamed.
  if (cls == "SGD" && s == "momentum") s = "m";
  if (cls == "RMSprop" && s == "rms") s = "velocity";
  if (cls == "RMSprop" && s == "mg") s = "average_gradient";
  return std::find(slots.begin(), slots.end(), s) != slots.end() ? s : std::string();
}

struct Assignment {
  Variable* target;
  const Tensor* value;
  std::string file_name;
};

// Restores iteration and slots from the file's optimizer weights; returns "" on success, else why
// it could not (and then changes nothing beyond the zero slots build() creates).
std::string restore_optimizer_state(optim::Optimizer& opt, const std::vector<Variable*>& vars,
                                    const std::vector<ck::H5Weight>& weights) {
  opt.build(vars);
  std::map<std::string, Variable*> by_name;
  for (Variable* v : vars) by_name[v->name()] = v;
  const std::vector<std::string> slots = opt.slot_names();
  const std::string cls = opt.get_config().class_name;
  const Tensor* iteration = nullptr;
  std::vector<Assignment> plan;
  std::string unmatched;
  for (const ck::H5Weight& w : weights) {
    std::string n = ck::strip_weight_suffix(w.name);
    if (starts_with(n, "training/")) n = n.substr(9);  // TF1-graph-mode Keras name scope
    if (n == "iteration" || n == "iter" || n == "iterations" || ends_with(n, "/iter") ||
        ends_with(n, "/iterations")) {
      iteration = &w.value;
      continue;
    }
    const size_t first = n.find('/');
    Variable* var = nullptr;
    std::string file_slot;
    if (first != std::string::npos) {
      const std::string rest = n.substr(first + 1);
      // Keras >= 2.11: "<optimizer>/<slot>/<variable>".
      if (const size_t s = rest.find('/');
          s != std::string::npos && by_name.count(rest.substr(s + 1))) {
        var = by_name[rest.substr(s + 1)];
        file_slot = rest.substr(0, s);
      } else if (const size_t e = rest.rfind('/');
                 e != std::string::npos && by_name.count(rest.substr(0, e))) {
        // OptimizerV2: "<optimizer>/<variable>/<slot>".
        var = by_name[rest.substr(0, e)];
        file_slot = rest.substr(e + 1);
      }
    }
    if (var == nullptr) {
      unmatched = w.name;
      break;
    }
    const std::string slot = slot_alias(file_slot, cls, slots);
    if (slot.empty()) continue;  // e.g. Keras's SGD "m" slots when momentum is 0
    Variable* target = opt.slot(*var, slot);
    DTRAIN_INTERNAL_CHECK(target != nullptr);
    for (const Assignment& a : plan) {
      if (a.target == target)
        return str_cat("two optimizer weights fill slot '", target->name(), "'");
    }
    plan.push_back({target, &w.value, w.name});
  }
  if (!unmatched.empty()) {
    // Names that do not mention the model's variables (Keras 2.2's "training/Adam/Variable:0"):
    // Keras's own set_weights order, iteration first, then slot by slot. Trailing extras are
    // slots dtrain does not keep (Keras 2.2's Adam creates [1]-shaped vhats even without
    // amsgrad, its SGD creates moments even without momentum); shapes guard the alignment.
    const size_t expected = 1 + slots.size() * vars.size();
    if (weights.size() < expected) {
      return str_cat("optimizer weight '", unmatched,
                     "' names no variable of the model, and the file's ", weights.size(),
                     " optimizer weights are fewer than the ", expected, " this ", cls,
                     " keeps (iteration + ", slots.size(), " slots x ", vars.size(),
                     " variables) to match them by position");
    }
    plan.clear();
    iteration = &weights[0].value;
    size_t k = 1;
    for (const std::string& s : slots) {
      for (Variable* v : vars) {
        plan.push_back({opt.slot(*v, s), &weights[k].value, weights[k].name});
        ++k;
      }
    }
  }
  if (!plan.empty() && plan.size() != slots.size() * vars.size()) {
    return str_cat("the file has ", plan.size(), " of the ", slots.size() * vars.size(),
                   " slot variables this ", cls, " keeps");
  }
  for (const Assignment& a : plan) {
    if (a.value->dtype() != a.target->dtype() || a.value->shape() != a.target->shape()) {
      return str_cat("optimizer weight '", a.file_name, "' is ", dtype_name(a.value->dtype()), " ",
                     a.value->shape().to_string(), " but slot '", a.target->name(), "' is ",
                     dtype_name(a.target->dtype()), " ", a.target->shape().to_string());
    }
  }
  int64_t steps = 0;
  if (iteration != nullptr) {
    if (iteration->num_elements() != 1) {
      return str_cat("the iteration counter has shape ", iteration->shape().to_string());
    }
    steps = static_cast<int64_t>(iteration->item());
  }
  for (const Assignment& a : plan) a.target->assign(*a.value);
  opt.iterations_variable().tensor().data<int64_t>()[0] = steps;
  return {};
}

// --- Model weights ------------------------------------------------------------------------------

// Pairs `vars` with the file's weights of one layer, checking count, dtype and shape. Returns
// false (after a warning) when `skip` and they do not fit; throws InvalidArgumentError otherwise.
bool plan_layer(const char* fn, const std::string& path, const std::string& layer,
                const std::string& file_layer, const std::vector<Variable*>& vars,
                const std::vector<ck::H5Weight>& weights, bool skip,
                std::vector<Assignment>& plan) {
  std::string problem;
  if (vars.size() != weights.size()) {
    problem = str_cat("layer '", layer, "' has ", vars.size(), " weights but file layer '",
                      file_layer, "' has ", weights.size());
  } else {
    for (size_t i = 0; i < vars.size() && problem.empty(); ++i) {
      const Tensor& t = weights[i].value;
      if (t.shape() != vars[i]->shape() || t.dtype() != vars[i]->dtype()) {
        problem = str_cat("layer '", layer, "', weight '", weights[i].name, "': the file has ",
                          dtype_name(t.dtype()), " ", t.shape().to_string(), " but the model's '",
                          vars[i]->name(), "' is ", dtype_name(vars[i]->dtype()), " ",
                          vars[i]->shape().to_string());
      }
    }
  }
  if (problem.empty()) {
    for (size_t i = 0; i < vars.size(); ++i)
      plan.push_back({vars[i], &weights[i].value, weights[i].name});
    return true;
  }
  if (skip) {
    warn(str_cat(fn, ": ", path, ": skipping ", problem));
    return false;
  }
  throw InvalidArgumentError(str_cat(fn, ": ", path, ": ", problem));
}

std::string layer_list(const std::vector<std::string>& names) {
  std::string out = "[";
  for (size_t i = 0; i < names.size(); ++i) out += str_cat(i ? ", " : "", names[i]);
  return out + "]";
}

// Assigns the file's layer weights to the model: by position among the layers that have weights
// (Keras's default), or by name. `strict` (load_model) requires every layer on both sides to be
// matched. Checks everything before assigning anything.
void assign_model_weights(const char* fn, const std::string& path, nn::Model& model,
                          const ck::KerasH5Contents& c, bool by_name, bool skip_mismatch,
                          bool strict) {
  std::vector<Assignment> plan;
  const std::vector<nn::Layer*> layers = saved_layers(model);
  if (by_name) {
    std::set<std::string> seen;
    for (const ck::H5LayerWeights& fl : c.layers) {
      nn::Layer* match = nullptr;
      for (nn::Layer* l : layers) {
        if (l->name() == fl.name) match = l;
      }
      if (match == nullptr) {
        DTRAIN_CHECK(!strict || fl.weights.empty(), fn, ": ", path,
                     ": the file has weights for "
                     "layer '",
                     fl.name, "' but the model has no layer of that name");
        continue;
      }
      seen.insert(fl.name);
      plan_layer(fn, path, match->name(), fl.name, keras_ordered_weights(*match), fl.weights,
                 skip_mismatch, plan);
    }
    if (strict) {
      for (nn::Layer* l : layers) {
        DTRAIN_CHECK(seen.count(l->name()) || l->weights().empty(), fn, ": ", path,
                     ": the file has no weights for layer '", l->name(), "'");
      }
    }
  } else {
    std::vector<nn::Layer*> model_with;
    std::vector<std::string> model_names, file_names;
    for (nn::Layer* l : layers) {
      if (!l->weights().empty()) {
        model_with.push_back(l);
        model_names.push_back(l->name());
      }
    }
    std::vector<const ck::H5LayerWeights*> file_with;
    for (const ck::H5LayerWeights& fl : c.layers) {
      if (!fl.weights.empty()) {
        file_with.push_back(&fl);
        file_names.push_back(fl.name);
      }
    }
    DTRAIN_CHECK(model_with.size() == file_with.size(), fn, ": ", path, ": the file has ",
                 file_with.size(), " layers with weights ", layer_list(file_names),
                 " but the model has ", model_with.size(), " ", layer_list(model_names));
    for (size_t i = 0; i < model_with.size(); ++i) {
      plan_layer(fn, path, model_with[i]->name(), file_with[i]->name,
                 keras_ordered_weights(*model_with[i]), file_with[i]->weights, false, plan);
    }
  }
  const std::vector<Variable*> own = own_weights(model);
  if (!own.empty() || !c.top_level_weights.empty()) {
    plan_layer(fn, path, model.name() + " (top level)", "top_level_model_weights", own,
               c.top_level_weights, skip_mismatch, plan);
  }
  for (const Assignment& a : plan) a.target->assign(*a.value);
}

}  // namespace

namespace detail {

// Builds every layer of a Sequential whose input shape is known (model_from_json builds the
// model, but a first layer after an InputLayer may still be unbuilt).
void build_all_layers(nn::Model& model) {
  auto* seq = dynamic_cast<nn::Sequential*>(&model);
  if (seq == nullptr || !model.input_shape()) return;
  Shape s = *model.input_shape();
  for (const auto& l : seq->layers()) {
    l->build(s);
    s = l->compute_output_shape(s);
  }
}

}  // namespace detail

void save_model(nn::Model& model, const std::string& path, const SaveModelOptions& options) {
  if (!ck::is_keras_h5_path(path)) {
    throw UnimplementedError(str_cat(
        "save: '", path,
        "' does not end in .h5, .hdf5 or .keras; dtrain saves whole models in Keras's HDF5 format "
        "only (no SavedModel directories). Use an .h5 path"));
  }
  SaveFormat format = options.format;
  if (format == SaveFormat::kAuto) {
    format = ck::is_keras_v3_path(path) ? SaveFormat::kKeras3Zip : SaveFormat::kKeras2H5;
  }
  if (format == SaveFormat::kKeras3Zip) {
    DTRAIN_CHECK(ck::is_keras_v3_path(path), "save: '", path,
                 "': the .keras zip format needs a path ending in .keras (as Keras 3 requires)");
    save_keras3_archive(model, path, options);
    return;
  }
  if (format == SaveFormat::kKeras3H5) {
    save_keras3_h5(model, path, options);
    return;
  }
  check_built(model, "save");
  json config = json::parse(model.to_json());  // UnimplementedError for subclassed models
  config.erase("keras_version");  // model.to_json() has them; an .h5 model_config does not
  config.erase("backend");
  if (options.tokenizer != nullptr) {
    try {
      config["dtrain_tokenizer"] = json::parse(options.tokenizer->to_bytes());
    } catch (const json::exception& e) {
      throw InvalidArgumentError(str_cat("save: '", path,
                                         "': the tokenizer does not serialize to "
                                         "JSON: ",
                                         e.what()));
    }
  }
  ck::KerasH5Contents c = weights_contents(model);
  c.weights_only = false;
  c.model_config = config.dump();
  if (options.include_optimizer && model.compiled() && model.optimizer() != nullptr) {
    c.training_config = training_config_json(model);
    c.optimizer_weights =
        optimizer_weights_in_keras_order(*model.optimizer(), model.trainable_variables());
  }
  ck::write_keras_h5(path, c, {.fixed_length_strings = options.fixed_length_strings});
}

std::unique_ptr<nn::Model> load_model(const std::string& path, const LoadModelOptions& options) {
  // By content, as Keras 3 decides: a zip is a .keras archive whatever its name; a .keras name
  // that is neither zip nor HDF5 gets the archive reader's error (truncated, not a zip).
  if (ck::is_zip_file(path) || (ck::is_keras_v3_path(path) && !ck::is_hdf5_file(path))) {
    return load_keras3_archive(path, options);
  }
  if (!is_h5(path)) {
    ck::read_keras_h5(path);  // NotFoundError for a missing path
    throw UnimplementedError(str_cat("load_model: '", path,
                                     "' is not a Keras HDF5 file; dtrain loads whole models from "
                                     ".h5 files only"));
  }
  const ck::KerasH5Contents c = ck::read_keras_h5(path);
  DTRAIN_CHECK(!c.weights_only && !c.model_config.empty(), "load_model: ", path,
               " has no model_config: it holds weights only (written by save_weights). Build "
               "the model in code and call load_weights");
  std::unique_ptr<nn::Model> model;
  try {
    model = nn::model_from_json(c.model_config);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(str_cat("load_model: ", path, ": model_config: ", e.what()));
  }
  build_all_layers(*model);
  DTRAIN_CHECK(model->built(), "load_model: ", path,
               ": the model_config declares no input shape, so its weights cannot be created");
  assign_model_weights("load_model", path, *model, c, /*by_name=*/true, /*skip_mismatch=*/false,
                       /*strict=*/true);
  if (!options.compile) return model;
  if (c.training_config.empty()) {
    warn(str_cat("load_model: ", path,
                 ": no training configuration found in the file, so the model was not compiled. "
                 "Compile it manually."));
    return model;
  }
  try {
    compile_from_training_config(*model, c.training_config);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(str_cat("load_model: ", path, ": ", e.what()));
  }
  if (!c.optimizer_weights.empty()) {
    std::string problem;
    if (is_keras3_h5(c)) {
      std::vector<const Tensor*> values;
      for (const ck::H5Weight& w : c.optimizer_weights) values.push_back(&w.value);
      problem =
          restore_keras3_optimizer_state(*model->optimizer(), model->trainable_variables(), values);
    } else {
      problem = restore_optimizer_state(*model->optimizer(), model->trainable_variables(),
                                        c.optimizer_weights);
    }
    if (!problem.empty()) {
      warn(str_cat("load_model: ", path, ": could not restore the optimizer state: ", problem,
                   ". The model starts with a freshly initialized optimizer."));
    }
  }
  return model;
}

std::unique_ptr<data::Tokenizer> load_tokenizer(const std::string& path) {
  if (ck::is_zip_file(path) || (ck::is_keras_v3_path(path) && !ck::is_hdf5_file(path))) {
    const ck::KerasV3Contents c = ck::read_keras_v3(path);
    for (const ck::KerasV3Asset& a : c.assets) {
      if (a.path == kTokenizerAsset) return data::tokenizer_from_bytes(a.bytes);
    }
    throw NotFoundError(str_cat("load_tokenizer: ", path, ": the archive has no assets/",
                                kTokenizerAsset, " (the model was saved without a tokenizer)"));
  }
  const ck::KerasH5Contents c = ck::read_keras_h5(path);  // NotFoundError, DataLossError
  json config;
  if (!c.model_config.empty()) {
    try {
      config = json::parse(c.model_config);
    } catch (const json::exception& e) {
      throw DataLossError(
          str_cat("load_tokenizer: ", path, ": model_config is not JSON: ", e.what()));
    }
  }
  if (!config.is_object() || !config.contains("dtrain_tokenizer")) {
    throw NotFoundError(str_cat("load_tokenizer: ", path,
                                ": model_config has no dtrain_tokenizer (the model was saved "
                                "without a tokenizer)"));
  }
  return data::tokenizer_from_bytes(config["dtrain_tokenizer"].dump());
}

void save_weights(nn::Model& model, const std::string& path) {
  check_built(model, "save_weights");
  if (!ck::is_keras_h5_path(path)) {
    // TensorFlow format (Keras's save_format="tf"): the model is the checkpoint's root object,
    // so keys read "layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE".
    ck::Checkpoint(ck::Trackable(model)).write(path);
    return;
  }
  ck::KerasH5Contents c = weights_contents(model);
  c.weights_only = true;
  ck::write_keras_h5(path, c);
}

void load_weights(nn::Model& model, const std::string& path, const LoadWeightsOptions& options) {
  check_built(model, "load_weights");
  // Keras 3: a .keras archive or a .weights.h5 in its layout, matched by attribute path.
  if (ck::is_zip_file(path) || (ck::is_keras_v3_path(path) && !ck::is_hdf5_file(path))) {
    load_keras3_weights(model, path, ck::read_keras_v3(path).vars);
    return;
  }
  if (ck::is_keras_v3_weights_file(path)) {
    load_keras3_weights(model, path, ck::read_keras_v3_weights(path));
    return;
  }
  if (!is_h5(path)) {
    // A TF-format prefix (ours, or Keras's save_weights in TF format): match by object path;
    // values for objects this model lacks (an optimizer, say) are ignored, as in Keras.
    ck::Checkpoint(ck::Trackable(model)).restore(path).expect_partial();
    return;
  }
  const ck::KerasH5Contents c = ck::read_keras_h5(path);
  DTRAIN_CHECK(options.by_name || !options.skip_mismatch,
               "load_weights: skip_mismatch requires by_name (as in Keras)");
  assign_model_weights("load_weights", path, model, c, options.by_name, options.skip_mismatch,
                       /*strict=*/false);
}

}  // namespace dtrain::train

namespace dtrain::nn {

void Model::save(const std::string& path) { train::save_model(*this, path); }
void Model::save_weights(const std::string& path) { train::save_weights(*this, path); }
void Model::load_weights(const std::string& path) { train::load_weights(*this, path); }

}  // namespace dtrain::nn
