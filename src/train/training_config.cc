// Keras's training_config: the JSON spellings of optimizers, schedules, losses and metrics,
// translated in both directions, and compile() from a saved training_config.
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"
#include "dtrain/nn/losses.h"
#include "dtrain/nn/metrics.h"
#include "dtrain/optim/optimizer.h"
#include "dtrain/optim/schedules.h"
#include "dtrain/train/saving.h"
#include "dtrain/train/training.h"
#include "saving_internal.h"
#include "training_state.h"

namespace dtrain::train {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// --- Optimizer configs --------------------------------------------------------------------------

// Hyperparameters Keras serializes as booleans.
bool is_bool_key(const std::string& key) {
  return key == "amsgrad" || key == "nesterov" || key == "centered" || key == "staircase";
}

}  // namespace

namespace detail {

ordered_json schedule_to_keras(const optim::ScheduleConfig& s) {
  ordered_json config;
  for (const auto& [key, value] : s.scalars) {
    if (is_bool_key(key)) {
      config[key] = value != 0.0;
    } else if (key == "decay_steps" || key == "warmup_steps") {
      config[key] = static_cast<int64_t>(value);
    } else {
      config[key] = value;
    }
  }
  for (const auto& [key, values] : s.lists) {
    ordered_json list = ordered_json::array();
    for (double v : values) {
      if (key == "boundaries") {
        list.push_back(static_cast<int64_t>(v));
      } else {
        list.push_back(v);
      }
    }
    config[key] = list;
  }
  for (const auto& [key, nested] : s.schedules) config[key] = schedule_to_keras(nested);
  config["name"] = nullptr;
  ordered_json j;
  j["class_name"] = s.class_name;
  j["config"] = config;
  return j;
}

}  // namespace detail

namespace {

std::shared_ptr<const optim::ScheduleConfig> schedule_from_keras(const json& j,
                                                                 const std::string& where) {
  DTRAIN_CHECK(j.is_object() && j.contains("class_name") && j["class_name"].is_string(), where,
               ": a learning-rate schedule must be {\"class_name\": ..., \"config\": ...}, got ",
               j.dump());
  auto s = std::make_shared<optim::ScheduleConfig>();
  s->class_name = j["class_name"].get<std::string>();
  const json config = j.value("config", json::object());
  for (const auto& [key, value] : config.items()) {
    if (key == "name" || value.is_null()) continue;
    if (value.is_boolean()) {
      s->scalars.emplace_back(key, value.get<bool>() ? 1.0 : 0.0);
    } else if (value.is_number()) {
      s->scalars.emplace_back(key, value.get<double>());
    } else if (value.is_array()) {
      std::vector<double> list;
      for (const json& v : value) {
        DTRAIN_CHECK(v.is_number(), where, ": schedule argument '", key,
                     "' must be a list of numbers, got ", value.dump());
        list.push_back(v.get<double>());
      }
      s->lists.emplace_back(key, std::move(list));
    } else if (value.is_object()) {
      s->schedules.emplace_back(key, *schedule_from_keras(value, str_cat(where, ".", key)));
    } else {
      throw InvalidArgumentError(
          str_cat(where, ": unsupported schedule argument '", key, "': ", value.dump()));
    }
  }
  return s;
}

}  // namespace

namespace detail {

// Keras 2.12's optimizer_config for a new-style (>= 2.11) optimizer.
ordered_json optimizer_config_to_keras(const optim::OptimizerConfig& c) {
  ordered_json config;
  config["name"] = c.name.empty() ? c.class_name : c.name;
  const double* wd = c.find("weight_decay");
  config["weight_decay"] = wd != nullptr && *wd != 0.0 ? ordered_json(*wd) : ordered_json(nullptr);
  for (const char* key : {"clipnorm", "global_clipnorm", "clipvalue"}) {
    const double* v = c.find(key);
    config[key] = v != nullptr && *v > 0.0 ? ordered_json(*v) : ordered_json(nullptr);
  }
  config["use_ema"] = false;
  config["ema_momentum"] = 0.99;
  config["ema_overwrite_frequency"] = nullptr;
  config["jit_compile"] = false;
  config["is_legacy_optimizer"] = false;
  if (c.learning_rate_schedule) {
    config["learning_rate"] = schedule_to_keras(*c.learning_rate_schedule);
  }
  for (const auto& [key, value] : c.hyperparameters) {
    if (key == "weight_decay" || key == "clipnorm" || key == "global_clipnorm" ||
        key == "clipvalue") {
      continue;
    }
    if (is_bool_key(key)) {
      config[key] = value != 0.0;
    } else {
      config[key] = value;
    }
  }
  ordered_json j;
  j["class_name"] = c.class_name;
  j["config"] = config;
  return j;
}

}  // namespace detail

namespace {

// Reads Keras's optimizer_config of any 2.x version into dtrain's config.
optim::OptimizerConfig optimizer_config_from_keras(const json& j) {
  const char* where = "training_config.optimizer_config";
  DTRAIN_CHECK(j.is_object() && j.contains("class_name") && j["class_name"].is_string(), where,
               ": expected {\"class_name\": ..., \"config\": ...}, got ", j.dump());
  optim::OptimizerConfig out;
  out.class_name = j["class_name"].get<std::string>();
  // Keras 2.11-2.12 write registered names such as "Custom>Adam".
  if (const size_t gt = out.class_name.rfind('>'); gt != std::string::npos) {
    out.class_name = out.class_name.substr(gt + 1);
  }
  const json config = j.value("config", json::object());
  DTRAIN_CHECK(config.is_object(), where, ".config: expected an object");
  for (const auto& [key, value] : config.items()) {
    if (key == "name") {
      if (value.is_string()) out.name = value.get<std::string>();
    } else if (key == "is_legacy_optimizer" || key == "jit_compile" || key == "ema_momentum" ||
               key == "ema_overwrite_frequency") {
      // No effect on the update dtrain computes.
    } else if (key == "clipnorm" || key == "clipvalue" || key == "global_clipnorm") {
      DTRAIN_CHECK(value.is_null() || value.is_number(), where, ".", key,
                   ": expected a number or null, got ", value.dump());
      if (value.is_number()) out.hyperparameters.emplace_back(key, value.get<double>());
    } else if (key == "use_ema") {
      DTRAIN_CHECK(value.is_null() || (value.is_boolean() && !value.get<bool>()), where,
                   ": use_ema (weight averaging) is not supported by dtrain; load with "
                   "{.compile = false}");
    } else if (key == "decay") {
      // Legacy (OptimizerV2 / Keras 2.2) inverse-time decay of the learning rate.
      DTRAIN_CHECK(value.is_null() || (value.is_number() && value.get<double>() == 0.0), where,
                   ": the legacy learning-rate decay (decay = ", value.dump(),
                   ") is not supported by dtrain; load with {.compile = false} and use a "
                   "learning-rate schedule");
    } else if (key == "lr" || key == "learning_rate") {
      if (value.is_object()) {
        out.learning_rate_schedule = schedule_from_keras(value, str_cat(where, ".", key));
      } else {
        DTRAIN_CHECK(value.is_number(), where, ".", key, ": expected a number or a schedule, got ",
                     value.dump());
        out.hyperparameters.emplace_back("learning_rate", value.get<double>());
      }
    } else if (value.is_null()) {
      // None means the default (weight_decay, epsilon in old Keras).
    } else if (value.is_boolean()) {
      out.hyperparameters.emplace_back(key, value.get<bool>() ? 1.0 : 0.0);
    } else if (value.is_number()) {
      out.hyperparameters.emplace_back(key, value.get<double>());
    } else {
      throw InvalidArgumentError(
          str_cat(where, ": unsupported value for '", key, "': ", value.dump()));
    }
  }
  return out;
}

// --- Losses and metrics -------------------------------------------------------------------------

}  // namespace

namespace detail {

ordered_json loss_to_keras(const nn::Loss& loss) {
  ordered_json j;
  j["class_name"] = loss.get_config().class_name;
  j["config"] = ordered_json::parse(loss.config_json());
  return j;
}

}  // namespace detail

namespace {

std::shared_ptr<nn::Loss> loss_from_keras(const json& j) {
  const json* loss = &j;
  // Per-output forms of a single-output model: {"dense_1": loss} or [loss].
  if (loss->is_array() && loss->size() == 1) loss = &(*loss)[0];
  if (loss->is_object() && !loss->contains("class_name") && loss->size() == 1) {
    loss = &loss->begin().value();
  }
  DTRAIN_CHECK(loss->is_string() || loss->is_object(), "training_config.loss: expected a loss ",
               "name or {\"class_name\": ..., \"config\": ...}, got ", j.dump(),
               " (multi-output models are not supported)");
  return nn::loss_from_json(loss->dump());
}

void collect_metric_entries(const json& j, std::vector<const json*>& out) {
  if (j.is_array()) {
    for (const json& e : j) collect_metric_entries(e, out);
  } else if (j.is_object() && !j.contains("class_name")) {
    for (const auto& [key, e] : j.items()) collect_metric_entries(e, out);  // per output
  } else if (!j.is_null()) {
    out.push_back(&j);
  }
}

// The metric names to compile() with: each entry is a name or a serialized metric, whose
// config name ("accuracy"), function ("sparse_categorical_accuracy") or class is tried in turn.
std::vector<std::string> metric_names_from_keras(const json& j, const nn::Loss* loss) {
  std::vector<const json*> entries;
  collect_metric_entries(j, entries);
  std::vector<std::string> names;
  for (const json* e : entries) {
    std::vector<std::string> candidates;
    if (e->is_string()) {
      candidates.push_back(e->get<std::string>());
    } else if (e->is_object()) {
      const json config = e->value("config", json::object());
      if (config.is_object()) {
        for (const char* key : {"name", "fn"}) {
          if (config.contains(key) && config[key].is_string()) {
            candidates.push_back(config[key].get<std::string>());
          }
        }
      }
      if ((*e)["class_name"].is_string())
        candidates.push_back((*e)["class_name"].get<std::string>());
    }
    bool found = false;
    for (const std::string& c : candidates) {
      try {
        (void)nn::metric_from_name(c, loss);
        names.push_back(c);
        found = true;
        break;
      } catch (const InvalidArgumentError&) {
      }
    }
    DTRAIN_CHECK(found, "training_config.metrics: metric ", e->dump(),
                 " is not supported by dtrain; load with {.compile = false} and compile the model "
                 "with metrics of your choice");
  }
  return names;
}

}  // namespace

std::string training_config_json(nn::Model& model) {
  TrainingState* s = find_state(model);
  if (s == nullptr || !s->optimizer || !s->loss) {
    throw FailedPreconditionError(
        str_cat("training_config_json: model '", model.name(), "' is not compiled"));
  }
  ordered_json j;
  j["loss"] = detail::loss_to_keras(*s->loss);
  ordered_json metrics = ordered_json::array();
  for (const auto& m : s->metrics) metrics.push_back(m->name());
  j["metrics"] = metrics;
  j["weighted_metrics"] = nullptr;
  j["loss_weights"] = nullptr;
  j["optimizer_config"] = detail::optimizer_config_to_keras(s->optimizer->get_config());
  return j.dump();
}

void compile_from_training_config(nn::Model& model, const std::string& training_config) {
  json j;
  try {
    j = json::parse(training_config);
  } catch (const json::exception& e) {
    throw InvalidArgumentError(str_cat("training_config: invalid JSON: ", e.what()));
  }
  DTRAIN_CHECK(j.is_object(), "training_config: expected an object");
  DTRAIN_CHECK(j.contains("loss") && !j["loss"].is_null(), "training_config: no loss");
  DTRAIN_CHECK(j.contains("optimizer_config"), "training_config: no optimizer_config");
  std::shared_ptr<nn::Loss> loss = loss_from_keras(j["loss"]);
  std::vector<std::string> metrics;
  if (j.contains("metrics")) metrics = metric_names_from_keras(j["metrics"], loss.get());
  std::shared_ptr<optim::Optimizer> optimizer =
      optim::optimizer_from_config(optimizer_config_from_keras(j["optimizer_config"]));
  model.compile({.optimizer = optimizer, .loss = loss, .metrics = metrics});
}

}  // namespace dtrain::train
