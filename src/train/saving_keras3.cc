// Keras 3 model files: the native .keras zip and the legacy .h5 as Keras 3 writes it, for
// Sequential and Functional models. Translates dtrain's Keras 2 dialect (config_json(),
// training_config) into Keras 3's (batch_shape, DTypePolicy objects, module/registered_name,
// build_config, compile_config; layer and Functional configs in saving_keras3_config.cc) and
// maps variables onto Keras 3's paths: "layers/<snake-case class>[_<n>]/vars/<i>" by attribute path
// in .keras archives (as keras/src/saving/saving_lib.py walks a model), "<model>/<layer>/<weight>"
// weight names in .h5 (a Functional's: "<layer>/<weight>"), and the optimizer's variables in Keras
// 3's order (iteration, learning_rate, then the slots interleaved per variable within each
// add_optimizer_variables call). docs/keras-files.md.
#include <ctime>
#include <map>
#include <set>

#include "dtrain/checkpoint/keras_v3.h"
#include "dtrain/core/error.h"
#include "dtrain/data/tokenizer.h"
#include "dtrain/nn/transformer.h"
#include "saving_internal.h"
#include "training_state.h"

namespace dtrain::train::detail {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

namespace ck = dtrain::checkpoint;

// The Keras 3 release whose layout dtrain writes (the .keras fixture's).
constexpr const char* kKeras3Version = "3.10.0";

// The scope Keras 3 puts before a variable's path ("sequential/dense/kernel"): a Sequential
// builds its layers under its own name scope; a Functional's layers are built when called on
// symbolic tensors, outside any model's scope ("dense/kernel").
std::string keras3_scope(const nn::Model& model) {
  return dynamic_cast<const nn::Sequential*>(&model) != nullptr ? model.name() + "/" : "";
}

// The model's config in the Keras 3 dialect: the .keras archive's (`archive`: module,
// registered_name and build_config on every object) or the .h5 model_config's.
ordered_json keras3_model_config(nn::Sequential& model, bool archive) {
  const Shape input = *model.input_shape();
  ordered_json layers = ordered_json::array();
  auto entry = [&](const std::string& cls, ordered_json config,
                   const std::optional<Shape>& built_for) {
    ordered_json e;
    if (archive) e["module"] = "keras.layers";
    e["class_name"] = cls;
    e["config"] = std::move(config);
    if (archive) {
      e["registered_name"] = nullptr;
      if (built_for && !built_at_construction(cls)) {
        e["build_config"] = {{"input_shape", batch_shape(*built_for)}};
      }
    }
    layers.push_back(std::move(e));
  };
  const auto& ls = model.layers();
  if (ls.empty() || ls.front()->class_name() != "InputLayer") {
    // Keras 3 turns a first layer's input_shape into an InputLayer named "input_layer".
    entry("InputLayer",
          {{"batch_shape", batch_shape(input)},
           {"dtype", "float32"},
           {"sparse", false},
           {"ragged", false},
           {"name", "input_layer"}},
          std::nullopt);
  }
  Shape s = input;
  for (const auto& l : ls) {
    entry(keras3_class_name(*l), keras3_layer_config(*l), s);
    s = l->compute_output_shape(s);
  }
  ordered_json config;
  config["name"] = model.name();
  config["trainable"] = model.trainable();
  config["dtype"] = dtype_policy("float32");
  config["layers"] = std::move(layers);
  config["build_input_shape"] = batch_shape(input);
  ordered_json j;
  if (archive) j["module"] = "keras";
  j["class_name"] = "Sequential";
  j["config"] = std::move(config);
  if (archive) {
    j["registered_name"] = nullptr;
    j["build_config"] = {{"input_shape", batch_shape(input)}};
  }
  return j;
}

// A dtrain subclassed model (GPT) as Keras 3 serializes a registered custom class: module
// "dtrain", registered_name "dtrain>GPT", its get_config() in the Keras 3 dialect.
ordered_json keras3_registered_config(nn::GPT& model) {
  ordered_json j;
  j["module"] = "dtrain";
  j["class_name"] = model.class_name();
  j["config"] = keras3_layer_config(model);
  j["registered_name"] = "dtrain>" + model.class_name();
  j["build_config"] = {{"input_shape", batch_shape(Shape{model.config().context})}};
  return j;
}

// The model's Keras 3 config (Sequential or Functional); UnimplementedError for a subclassed one.
ordered_json keras3_config(nn::Model& model, bool archive, const char* fn) {
  if (auto* gpt = dynamic_cast<nn::GPT*>(&model); gpt != nullptr) {
    return keras3_registered_config(*gpt);
  }
  (void)model.to_json();  // UnimplementedError for a subclassed model
  if (auto* f = dynamic_cast<nn::Functional*>(&model); f != nullptr) {
    return keras3_functional_config(*f, archive);
  }
  auto* seq = dynamic_cast<nn::Sequential*>(&model);
  if (seq == nullptr) {
    throw UnimplementedError(str_cat(fn, ": model '", model.name(), "' is a ", model.class_name(),
                                     "; dtrain writes Keras 3 files for Sequential and Functional "
                                     "models only"));
  }
  return keras3_model_config(*seq, archive);
}

// Keras 3's default optimizer names are the snake-case class ("adam"); dtrain's are the class.
std::string keras3_optimizer_name(const optim::Optimizer& opt) {
  const std::string cls = opt.get_config().class_name;
  return opt.name() == cls || opt.name().empty() ? snake_case(cls) : opt.name();
}

// {"class_name", "config"} of the optimizer as Keras 3 serializes it (`archive`: with module and
// registered_name).
ordered_json keras3_optimizer(optim::Optimizer& opt, bool archive) {
  const optim::OptimizerConfig cfg = opt.get_config();
  const ordered_json k2 = optimizer_config_to_keras(cfg)["config"];
  ordered_json c;
  c["name"] = keras3_optimizer_name(opt);
  c["learning_rate"] = cfg.learning_rate_schedule
                           ? keras3_object(schedule_to_keras(*cfg.learning_rate_schedule),
                                           "keras.optimizers.schedules")
                           : k2["learning_rate"];
  static const char* kBase[] = {
      "weight_decay", "clipnorm",     "global_clipnorm",        "clipvalue",
      "use_ema",      "ema_momentum", "ema_overwrite_frequency"};
  for (const char* key : kBase) c[key] = k2.contains(key) ? k2[key] : ordered_json();
  c["loss_scale_factor"] = nullptr;
  c["gradient_accumulation_steps"] = nullptr;
  for (auto it = k2.begin(); it != k2.end(); ++it) {
    if (c.contains(it.key()) || it.key() == "jit_compile" || it.key() == "is_legacy_optimizer") {
      continue;
    }
    c[it.key()] = it.value();
  }
  ordered_json j;
  if (archive) j["module"] = "keras.optimizers";
  j["class_name"] = cfg.class_name;
  j["config"] = std::move(c);
  if (archive) j["registered_name"] = nullptr;
  return j;
}

ordered_json keras3_loss(const nn::Loss& loss) {
  ordered_json j = keras3_object(loss_to_keras(loss), "keras.losses");
  if (j["config"].is_object() && j["config"].value("reduction", "") == "auto") {
    j["config"]["reduction"] = "sum_over_batch_size";  // Keras 3 has no "auto"
  }
  return j;
}

ordered_json keras3_metrics(TrainingState& s) {
  ordered_json m = ordered_json::array();
  for (const auto& metric : s.metrics) m.push_back(metric->name());
  return m;
}

// Keras 3's optimizer slots: the groups its build() creates with add_optimizer_variables (each
// interleaved per variable), as (dtrain slot, Keras 3 name).
std::vector<std::vector<std::pair<std::string, std::string>>> keras3_slot_groups(
    optim::Optimizer& opt) {
  const std::string cls = opt.get_config().class_name;
  std::vector<std::string> slots = opt.slot_names();
  std::vector<std::vector<std::pair<std::string, std::string>>> groups;
  std::set<std::string> used;
  auto has = [&](const std::string& s) {
    return std::find(slots.begin(), slots.end(), s) != slots.end();
  };
  auto group = [&](std::vector<std::pair<std::string, std::string>> g) {
    for (const auto& [d, k] : g) used.insert(d);
    groups.push_back(std::move(g));
  };
  if ((cls == "Adam" || cls == "AdamW") && has("m") && has("v")) {
    group({{"m", "momentum"}, {"v", "velocity"}});
    if (has("vhat")) group({{"vhat", "velocity_hat"}});
  } else if (cls == "SGD" && has("m")) {
    group({{"m", "momentum"}});
  }
  for (const std::string& s : slots) {
    if (!used.count(s)) group({{s, s}});  // RMSprop: velocity, momentum, average_gradient
  }
  return groups;
}

struct Keras3OptimizerVar {
  std::string name;              // "adam/iteration", "adam/sequential_dense_kernel_momentum"
  Variable* variable = nullptr;  // null for learning_rate
  Tensor value;
};

// The optimizer's variables in Keras 3's order; only iteration and learning_rate until every
// variable has its slots (as an optimizer Keras has not built yet).
std::vector<Keras3OptimizerVar> keras3_optimizer_vars(optim::Optimizer& opt,
                                                      const std::vector<Variable*>& vars,
                                                      const std::string& scope) {
  const std::string prefix = keras3_optimizer_name(opt) + "/";
  std::vector<Keras3OptimizerVar> out;
  out.push_back(
      {prefix + "iteration", &opt.iterations_variable(), opt.iterations_variable().tensor()});
  if (!opt.learning_rate_schedule()) {
    Tensor lr = Tensor::scalar(opt.learning_rate());
    out.push_back({prefix + "learning_rate", nullptr, lr});
  }
  for (Variable* v : vars) {
    for (const std::string& s : opt.slot_names()) {
      if (opt.slot(*v, s) == nullptr) return out;
    }
  }
  for (const auto& g : keras3_slot_groups(opt)) {
    for (Variable* v : vars) {
      std::string path = scope + v->name();
      std::replace(path.begin(), path.end(), '/', '_');
      for (const auto& [slot, keras] : g) {
        Variable* sv = opt.slot(*v, slot);
        out.push_back({prefix + path + "_" + keras, sv, sv->tensor()});
      }
    }
  }
  return out;
}

// Calls f(layer, its weights, its Keras 3 attribute path) for every layer, as saving_lib walks a
// Sequential: "layers/<snake-case class>" with "_1", "_2", ... for repeated classes; a nested
// model's layers under "<its path>/layers/...".
template <typename F>
void walk_layers(nn::Model& model, const std::string& prefix, F&& f) {
  std::map<std::string, int> used;
  for (nn::Layer* l : saved_layers(model)) {
    const std::string key = snake_case(keras3_class_name(*l));
    auto [it, fresh] = used.emplace(key, 0);
    if (!fresh) ++it->second;
    const std::string path =
        prefix + "layers/" + key + (it->second > 0 ? str_cat("_", it->second) : std::string());
    auto* sub = dynamic_cast<nn::Model*>(l);
    f(*l, sub != nullptr ? own_weights(*sub) : keras_ordered_weights(*l), path);
    if (sub != nullptr) walk_layers(*sub, path + "/", f);
  }
}

std::string date_saved() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d@%H:%M:%S", &tm);
  return buf;
}

struct Planned {
  Variable* target;
  const Tensor* value;
};

// Pairs `vars` with the file's variables of one object, naming the file, the layer and the
// variable on any difference.
void plan_vars(const char* fn, const std::string& path, const std::string& who,
               const std::string& where, const std::vector<Variable*>& vars,
               const ck::KerasV3Vars* file, std::vector<Planned>& plan) {
  const size_t have = file != nullptr ? file->values.size() : 0;
  if (have != vars.size()) {
    std::string names;
    for (Variable* v : vars) names += (names.empty() ? "" : ", ") + v->name();
    throw InvalidArgumentError(str_cat(fn, ": ", path, ": ", who, " has ", vars.size(),
                                       " variables [", names, "] but model.weights.h5 has ", have,
                                       " at ", where, "/vars"));
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    const Tensor& t = file->values[i];
    if (t.shape() != vars[i]->shape() || t.dtype() != vars[i]->dtype()) {
      throw InvalidArgumentError(str_cat(
          "load_model: ", path, ": ", who, ", variable ", where, "/vars/", i, " ('",
          vars[i]->name(), "'): the file has ", dtype_name(t.dtype()), " ", t.shape().to_string(),
          " but the model's is ", dtype_name(vars[i]->dtype()), " ", vars[i]->shape().to_string()));
    }
    plan.push_back({vars[i], &t});
  }
}

// Assigns the file's vars groups to the model's variables by attribute path (the model's own
// in "vars", each layer's at walk_layers' path), checking all of them first; vars under
// "layers/" that no layer of the model takes are an error.
void assign_vars(const char* fn, const std::string& path, nn::Model& model,
                 const std::vector<ck::KerasV3Vars>& groups) {
  auto find = [&](const std::string& p) -> const ck::KerasV3Vars* {
    for (const ck::KerasV3Vars& v : groups) {
      if (v.path == p) return &v;
    }
    return nullptr;
  };
  std::vector<Planned> plan;
  std::set<std::string> consumed = {""};
  plan_vars(fn, path, str_cat("model '", model.name(), "'"), "", own_weights(model), find(""),
            plan);
  walk_layers(model, "",
              [&](nn::Layer& l, const std::vector<Variable*>& vars, const std::string& p) {
                consumed.insert(p);
                plan_vars(fn, path, str_cat("layer '", l.name(), "' (", l.class_name(), ")"), p,
                          vars, find(p), plan);
              });
  for (const ck::KerasV3Vars& v : groups) {
    if (v.path.rfind("layers/", 0) == 0 && !consumed.count(v.path) && !v.values.empty()) {
      throw InvalidArgumentError(str_cat(fn, ": ", path, ": the file has ", v.values.size(),
                                         " variables at ", v.path, "/vars (layer '", v.name,
                                         "') but the model has no such layer"));
    }
  }
  for (const Planned& p : plan) p.target->assign(*p.value);
}

}  // namespace

void load_keras3_weights(nn::Model& model, const std::string& path,
                         const std::vector<ck::KerasV3Vars>& vars) {
  check_built(model, "load_weights");
  assign_vars("load_weights", path, model, vars);
}

bool is_keras3_h5(const ck::KerasH5Contents& c) {
  return c.keras_version.size() >= 2 && c.keras_version.compare(0, 2, "3.") == 0;
}

std::string restore_keras3_optimizer_state(optim::Optimizer& opt,
                                           const std::vector<Variable*>& vars,
                                           const std::vector<const Tensor*>& values) {
  opt.build(vars);
  size_t slots = 0;
  const auto groups = keras3_slot_groups(opt);
  for (const auto& g : groups) slots += g.size() * vars.size();
  if (values.empty()) return "the file has no optimizer variables";
  const Tensor* iteration = values[0];
  if (iteration->num_elements() != 1) {
    return str_cat("the iteration counter has shape ", iteration->shape().to_string());
  }
  // learning_rate is a variable unless the optimizer follows a schedule.
  const Tensor* lr = nullptr;
  size_t k = 1;
  const bool with_lr = values.size() == 2 + slots || (values.size() == 2 && slots > 0);
  if (with_lr) {
    lr = values[1];
    k = 2;
    if (lr->num_elements() != 1) {
      return str_cat("the learning rate has shape ", lr->shape().to_string());
    }
  }
  const bool unbuilt = values.size() == k;  // Keras had not built its optimizer yet
  if (!unbuilt && values.size() != k + slots) {
    return str_cat("the file has ", values.size(), " optimizer variables; this ",
                   opt.get_config().class_name, " keeps iteration, ",
                   opt.learning_rate_schedule() ? "" : "learning_rate (optional), ", slots,
                   " slots (", slots / std::max<size_t>(vars.size(), 1), " per variable x ",
                   vars.size(), " variables)");
  }
  std::vector<Planned> plan;
  if (!unbuilt) {
    for (const auto& g : groups) {
      for (Variable* v : vars) {
        for (const auto& [slot, keras] : g) {
          Variable* target = opt.slot(*v, slot);
          DTRAIN_INTERNAL_CHECK(target != nullptr);
          const Tensor* t = values[k++];
          if (t->dtype() != target->dtype() || t->shape() != target->shape()) {
            return str_cat("optimizer variable ", k - 1, " (", keras, " of '", v->name(), "') is ",
                           dtype_name(t->dtype()), " ", t->shape().to_string(), " but slot '",
                           target->name(), "' is ", dtype_name(target->dtype()), " ",
                           target->shape().to_string());
          }
          plan.push_back({target, t});
        }
      }
    }
  }
  for (const Planned& p : plan) p.target->assign(*p.value);
  opt.iterations_variable().tensor().data<int64_t>()[0] = static_cast<int64_t>(iteration->item());
  // The variable is float32; keep the config's (double) rate unless a callback changed it.
  if (lr != nullptr && !opt.learning_rate_schedule() &&
      static_cast<float>(lr->item()) != static_cast<float>(opt.learning_rate())) {
    opt.set_learning_rate(static_cast<float>(lr->item()));
  }
  return {};
}

void save_keras3_archive(nn::Model& model, const std::string& path, const SaveModelOptions& o) {
  check_built(model, "save");
  ordered_json config = keras3_config(model, /*archive=*/true, "save");
  TrainingState* state = find_state(model);
  const bool with_optimizer =
      o.include_optimizer && state != nullptr && state->optimizer && state->loss;
  if (with_optimizer) {
    ordered_json cc;
    cc["optimizer"] = keras3_optimizer(*state->optimizer, /*archive=*/true);
    cc["loss"] = keras3_loss(*state->loss);
    cc["loss_weights"] = nullptr;
    cc["metrics"] = keras3_metrics(*state);
    cc["weighted_metrics"] = nullptr;
    cc["run_eagerly"] = false;
    cc["steps_per_execution"] = 1;
    cc["jit_compile"] = false;
    config["compile_config"] = std::move(cc);
  }
  ck::KerasV3Contents c;
  ordered_json metadata;
  metadata["keras_version"] = kKeras3Version;
  metadata["date_saved"] = date_saved();
  c.metadata_json = metadata.dump();
  c.config_json = config.dump();
  auto values = [](const std::vector<Variable*>& vars) {
    std::vector<Tensor> out;
    for (Variable* v : vars) out.push_back(v->tensor());
    return out;
  };
  c.vars.push_back({"", model.name(), values(own_weights(model))});
  walk_layers(model, "",
              [&](nn::Layer& l, const std::vector<Variable*>& vars, const std::string& p) {
                c.vars.push_back({p, l.name(), values(vars)});
              });
  if (with_optimizer) {
    ck::KerasV3Vars ov{"optimizer", keras3_optimizer_name(*state->optimizer), {}};
    for (const Keras3OptimizerVar& v : keras3_optimizer_vars(
             *state->optimizer, model.trainable_variables(), keras3_scope(model))) {
      ov.values.push_back(v.value);
    }
    c.vars.push_back(std::move(ov));
  }
  if (o.tokenizer != nullptr) c.assets.push_back({kTokenizerAsset, o.tokenizer->to_bytes()});
  ck::write_keras_v3(path, c);
}

void save_keras3_h5(nn::Model& model, const std::string& path, const SaveModelOptions& o) {
  DTRAIN_CHECK(ck::is_keras_h5_path(path) && !ck::is_keras_v3_path(path), "save: '", path,
               "': the Keras 3 HDF5 layout needs a path ending in .h5 or .hdf5");
  check_built(model, "save");
  ck::KerasH5Contents c;
  c.weights_only = false;
  c.keras_version = kKeras3Version;
  c.model_config = keras3_config(model, /*archive=*/false, "save").dump();
  auto named = [&](const std::vector<Variable*>& vars) {
    std::vector<ck::H5Weight> out;
    for (Variable* v : vars) out.push_back({keras3_scope(model) + v->name(), v->tensor()});
    return out;
  };
  for (nn::Layer* l : saved_layers(model)) {
    c.layers.push_back({l->name(), named(keras_ordered_weights(*l))});
  }
  c.top_level_weights = named(own_weights(model));
  TrainingState* state = find_state(model);
  if (o.include_optimizer && state != nullptr && state->optimizer && state->loss) {
    ordered_json tc;
    tc["loss"] = keras3_loss(*state->loss);
    tc["loss"].erase("module");
    tc["loss"].erase("registered_name");
    tc["loss_weights"] = nullptr;
    tc["metrics"] = keras3_metrics(*state);
    tc["weighted_metrics"] = nullptr;
    tc["run_eagerly"] = false;
    tc["steps_per_execution"] = 1;
    tc["jit_compile"] = false;
    tc["optimizer_config"] = keras3_optimizer(*state->optimizer, /*archive=*/false);
    c.training_config = tc.dump();
    for (const Keras3OptimizerVar& v : keras3_optimizer_vars(
             *state->optimizer, model.trainable_variables(), keras3_scope(model))) {
      c.optimizer_weights.push_back({v.name, v.value});
    }
  }
  ck::write_keras_h5(path, c, {.fixed_length_strings = o.fixed_length_strings});
}

std::unique_ptr<nn::Model> load_keras3_archive(const std::string& path,
                                               const LoadModelOptions& options) {
  const ck::KerasV3Contents c = ck::read_keras_v3(path);
  json config;
  try {
    config = json::parse(c.config_json);
  } catch (const json::exception& e) {
    throw InvalidArgumentError(
        str_cat("load_model: ", path, ": config.json is not valid JSON: ", e.what()));
  }
  DTRAIN_CHECK(config.is_object() && config.contains("class_name") &&
                   config["class_name"].is_string() && config.contains("config"),
               "load_model: ", path,
               ": config.json is not a serialized Keras model ({\"class_name\", \"config\", ...})");
  const std::string cls = config["class_name"].get<std::string>();
  if (cls != "Sequential" && cls != "Functional" && cls != "GPT") {
    throw UnimplementedError(
        str_cat("load_model: ", path, ": config.json holds a ", cls,
                " model; dtrain loads Sequential, Functional and GPT models from "
                ".keras files (other subclassed models are not supported)"));
  }
  std::unique_ptr<nn::Model> model;
  try {
    model = nn::model_from_json(config.dump());
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(str_cat("load_model: ", path, ": config.json: ", e.what()));
  }
  build_all_layers(*model);
  DTRAIN_CHECK(model->built(), "load_model: ", path,
               ": config.json declares no input shape, so the model's variables cannot be created");
  assign_vars("load_model", path, *model, c.vars);
  if (!options.compile) return model;
  if (!config.contains("compile_config") || config["compile_config"].is_null()) {
    warn(str_cat("load_model: ", path,
                 ": config.json has no compile_config, so the model was not compiled. Compile it "
                 "manually."));
    return model;
  }
  const json& cc = config["compile_config"];
  DTRAIN_CHECK(cc.is_object() && cc.contains("optimizer"), "load_model: ", path,
               ": compile_config must be an object with an optimizer, got ", cc.dump());
  json tc;
  tc["loss"] = cc.value("loss", json());
  tc["metrics"] = cc.value("metrics", json());
  tc["optimizer_config"] = cc["optimizer"];
  try {
    compile_from_training_config(*model, tc.dump());
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(str_cat("load_model: ", path, ": compile_config: ", e.what()));
  }
  if (const ck::KerasV3Vars* ov = c.find("optimizer"); ov != nullptr && !ov->values.empty()) {
    std::vector<const Tensor*> values;
    for (const Tensor& t : ov->values) values.push_back(&t);
    const std::string problem =
        restore_keras3_optimizer_state(*model->optimizer(), model->trainable_variables(), values);
    if (!problem.empty()) {
      warn(str_cat("load_model: ", path, ": could not restore the optimizer state: ", problem,
                   ". The model starts with a freshly initialized optimizer."));
    }
  }
  return model;
}

}  // namespace dtrain::train::detail
