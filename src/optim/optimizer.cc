// Optimizer base: argument checks, slot creation and bookkeeping, learning rate and schedule,
// the iteration counter, and the factories. The per-variable math lives in the subclasses and
// the fused kernels of dtrain/ops/optimizer_kernels.h.
#include "dtrain/optim/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "dtrain/core/error.h"
#include "dtrain/core/parallel_for.h"
#include "dtrain/ops/optimizer_kernels.h"
#include "dtrain/optim/adam.h"
#include "dtrain/optim/rmsprop.h"
#include "dtrain/optim/sgd.h"

namespace dtrain::optim {
namespace {

Tensor int64_scalar_zero() {
  Tensor t(DType::kInt64, Shape{});
  t.data<int64_t>()[0] = 0;
  return t;
}

}  // namespace

const double* OptimizerConfig::find(std::string_view key) const {
  for (const auto& [k, v] : hyperparameters) {
    if (k == key) return &v;
  }
  return nullptr;
}

Optimizer::Optimizer(std::string name, double learning_rate, double weight_decay,
                     std::vector<std::string> slot_names, GradientClipping clipping,
                     bool fuses_weight_decay)
    : name_(std::move(name)),
      learning_rate_(learning_rate),
      weight_decay_(weight_decay),
      fuses_weight_decay_(fuses_weight_decay),
      slot_names_(std::move(slot_names)),
      clipping_(clipping),
      iterations_("iteration", int64_scalar_zero(), /*trainable=*/false) {
  DTRAIN_CHECK(std::isfinite(learning_rate), name_, ": learning_rate must be finite, got ",
               learning_rate);
  DTRAIN_CHECK(std::isfinite(weight_decay) && weight_decay >= 0.0, name_,
               ": weight_decay must be finite and >= 0, got ", weight_decay);
  DTRAIN_INTERNAL_CHECK(slot_names_.size() <= static_cast<size_t>(kMaxSlots));
  for (const auto& [key, value] : {std::pair<const char*, double>{"clipnorm", clipping.clipnorm},
                                   {"clipvalue", clipping.clipvalue},
                                   {"global_clipnorm", clipping.global_clipnorm}}) {
    DTRAIN_CHECK(std::isfinite(value) && value >= 0.0, name_, ": ", key,
                 " must be finite and > 0 (or 0 for None), got ", value);
  }
  const int set =
      (clipping.clipnorm > 0.0) + (clipping.clipvalue > 0.0) + (clipping.global_clipnorm > 0.0);
  DTRAIN_CHECK(set <= 1, name_,
               ": only one of `clipnorm`, `clipvalue` and `global_clipnorm` can be set. "
               "Received: clipnorm=",
               clipping.clipnorm, ", clipvalue=", clipping.clipvalue,
               ", global_clipnorm=", clipping.global_clipnorm);
}

void Optimizer::exclude_from_weight_decay(std::vector<std::string> var_names) {
  if (!slots_.empty()) {
    throw FailedPreconditionError(
        str_cat(name_,
                ": exclude_from_weight_decay() can only be configured before the "
                "optimizer is built (before its first update)"));
  }
  exclude_names_ = std::move(var_names);
}

bool Optimizer::uses_weight_decay(const Variable& var) const {
  if (weight_decay_ <= 0.0) return false;
  for (const std::string& s : exclude_names_) {
    if (var.name().find(s) != std::string::npos) return false;
  }
  return true;
}

Optimizer::~Optimizer() = default;

int64_t Optimizer::iterations() const { return iterations_.tensor().data<int64_t>()[0]; }

float Optimizer::learning_rate() const {
  return schedule_ ? (*schedule_)(iterations()) : static_cast<float>(learning_rate_);
}

void Optimizer::set_learning_rate(float learning_rate) {
  DTRAIN_CHECK(std::isfinite(learning_rate), name_, ": learning_rate must be finite, got ",
               learning_rate);
  learning_rate_ = learning_rate;
  schedule_.reset();
}

void Optimizer::set_learning_rate_schedule(std::shared_ptr<LearningRateSchedule> schedule) {
  DTRAIN_CHECK(schedule != nullptr, name_, ": set_learning_rate_schedule given a null schedule");
  schedule_ = std::move(schedule);
}

void Optimizer::build(std::span<Variable* const> vars) {
  for (size_t i = 0; i < vars.size(); ++i) {
    DTRAIN_CHECK(vars[i] != nullptr, name_, ": variable ", i, " is null");
    DTRAIN_CHECK(vars[i]->dtype() == DType::kFloat32, name_, ": variable '", vars[i]->name(),
                 "' is ", dtype_name(vars[i]->dtype()), "; optimizers update float32 variables");
  }
  // Slots are created slot by slot: every variable's "m", then every variable's "v". (Keras's
  // Adam alternates m and v per variable; files never depend on this order: .h5 optimizer
  // weights are written in Keras's order and checkpoints match slots by name.)
  std::vector<Variable*> fresh;
  for (Variable* var : vars) {
    if (slots_.count(var->id()) == 0 && std::find(fresh.begin(), fresh.end(), var) == fresh.end()) {
      fresh.push_back(var);
    }
  }
  for (Variable* var : fresh) {
    SlotSet set;
    set.decay = uses_weight_decay(*var);
    if (clipping_.any()) {
      clip_buffers_.push_back(Tensor::zeros(var->shape()));
      set.clipped = clip_buffers_.back().data<float>();
    }
    slots_.emplace(var->id(), set);
  }
  for (size_t s = 0; s < slot_names_.size(); ++s) {
    for (Variable* var : fresh) {
      auto slot = std::make_unique<Variable>(str_cat(name_, "/", slot_names_[s], "/", var->name()),
                                             Tensor::zeros(var->shape()), /*trainable=*/false);
      SlotSet& set = slots_.at(var->id());
      set.variables[s] = slot.get();
      set.data[s] = slot->tensor().data<float>();
      slot_variables_.push_back(std::move(slot));
    }
  }
}

void Optimizer::drop_slots(std::span<Variable* const> vars) {
  for (Variable* var : vars) {
    if (var == nullptr) continue;
    const auto it = slots_.find(var->id());
    if (it == slots_.end()) continue;
    const SlotSet set = it->second;
    slots_.erase(it);
    std::erase_if(slot_variables_, [&](const std::unique_ptr<Variable>& v) {
      return std::find(set.variables.begin(), set.variables.end(), v.get()) != set.variables.end();
    });
    if (set.clipped != nullptr) {
      std::erase_if(clip_buffers_, [&](const Tensor& t) { return t.data<float>() == set.clipped; });
    }
  }
}

void Optimizer::prepare_update(std::span<const Tensor> grads, std::span<Variable* const> vars,
                               std::span<const float> clip_scales) {
  DTRAIN_CHECK(clip_scales.empty() || clip_scales.size() == grads.size(), name_,
               ".apply_gradients: ", clip_scales.size(), " clip scales for ", grads.size(),
               " gradients");
  DTRAIN_CHECK(grads.size() == vars.size(), name_, ".apply_gradients: ", grads.size(),
               " gradients for ", vars.size(), " variables");
  bool any_gradient = false;
  bool all_built = true;
  for (size_t i = 0; i < vars.size(); ++i) {
    const Variable* var = vars[i];
    DTRAIN_CHECK(var != nullptr, name_, ".apply_gradients: variable ", i, " is null");
    DTRAIN_CHECK(var->dtype() == DType::kFloat32, name_, ".apply_gradients: variable '",
                 var->name(), "' is ", dtype_name(var->dtype()),
                 "; optimizers update float32 variables");
    all_built = all_built && slots_.count(var->id()) != 0;
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    any_gradient = true;
    DTRAIN_CHECK(g.dtype() == DType::kFloat32, name_, ".apply_gradients: gradient for variable '",
                 var->name(), "' is ", dtype_name(g.dtype()), ", expected float32");
    DTRAIN_CHECK(g.shape() == var->shape(), name_, ".apply_gradients: gradient for variable '",
                 var->name(), "' has shape ", g.shape().to_string(), " but the variable has shape ",
                 var->shape().to_string());
  }
  if (!any_gradient) {
    std::string names;
    for (const Variable* var : vars) names += str_cat(names.empty() ? "" : ", ", var->name());
    throw InvalidArgumentError(
        str_cat(name_, ".apply_gradients: no gradients provided for any variable: [", names, "]"));
  }
  if (!all_built) build(vars);
  pending_ = StepContext{iterations(), learning_rate()};
  if (!clip_scales.empty()) {
    clip_scales_.assign(clip_scales.begin(), clip_scales.end());
  } else if (clipping_.by_norm()) {
    compute_clip_scales(grads);
  }
}

double Optimizer::row_sum_of_squares(const float* p, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]) * static_cast<double>(p[i]);
  return s;
}

double Optimizer::squared_norm(const Tensor& g) {
  const float* p = g.data<float>();
  const int64_t n = g.num_elements();
  const int64_t rows = g.shape().rank() == 0 ? 1 : g.shape()[0];
  if (rows <= 0 || n == 0) return 0.0;
  const int64_t row = n / rows;
  double s = 0.0;
  for (int64_t r = 0; r < rows; ++r) s += row_sum_of_squares(p + r * row, row);
  return s;
}

float Optimizer::clipnorm_scale(double squared, double clipnorm) {
  const double norm = std::sqrt(squared);
  // tf.clip_by_norm: g·c / max(‖g‖, c); a NaN norm propagates.
  return static_cast<float>(std::isnan(norm) ? norm : clipnorm / std::max(norm, clipnorm));
}

float Optimizer::global_clipnorm_scale(double total, double global_clipnorm) {
  const double norm = std::sqrt(total);
  const double c = global_clipnorm;
  // tf.clip_by_global_norm: scale = c·min(1/N, 1/c), plus (N − N) so an infinite N gives NaN.
  return static_cast<float>(c * std::min(1.0 / norm, 1.0 / c) + (norm - norm));
}

void Optimizer::compute_clip_scales(std::span<const Tensor> grads) {
  clip_scales_.assign(grads.size(), 1.0f);  // keeps its capacity: no allocation after the first
  // Each gradient's Σ g² (squared_norm: row by row), gradients split over parallel_for's threads;
  // the global sum then adds them in gradient order, as one thread would.
  thread_local std::vector<double> sums;  // grows to the most gradients, then allocates nothing
  sums.assign(grads.size(), 0.0);
  double* const sum = sums.data();  // (a thread_local named in the lambda is each thread's own)
  parallel_for(static_cast<int64_t>(grads.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (grads[i].defined()) sum[i] = squared_norm(grads[i]);
    }
  });
  if (clipping_.clipnorm > 0.0) {
    for (size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].defined()) clip_scales_[i] = clipnorm_scale(sums[i], clipping_.clipnorm);
    }
    return;
  }
  double total = 0.0;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) total += sums[i];
  }
  std::fill(clip_scales_.begin(), clip_scales_.end(),
            global_clipnorm_scale(total, clipping_.global_clipnorm));
}

std::pair<int64_t, int64_t> Optimizer::element_range(int64_t n, int part, int parts) {
  auto boundary = [&](int p) -> int64_t {
    if (p <= 0) return 0;
    if (p >= parts) return n;
    const int64_t b = (n * p / parts + 8) / 16 * 16;  // nearest multiple of 16
    return std::min(b, n);
  };
  return {boundary(part), boundary(part + 1)};
}

void Optimizer::update_part(std::span<const Tensor> grads, std::span<Variable* const> vars,
                            int part, int parts) {
  const float wd_lr = static_cast<float>(weight_decay_ * pending_.lr);
  const bool by_norm = clipping_.by_norm();
  const auto clip_value = static_cast<float>(clipping_.clipvalue);
  for (size_t i = 0; i < vars.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    Variable* var = vars[i];
    const auto [begin, end] = element_range(var->tensor().num_elements(), part, parts);
    if (begin >= end) continue;
    float* x = var->tensor().data<float>() + begin;
    const int64_t n = end - begin;
    const SlotSet& set = slots_.find(var->id())->second;
    if (set.decay && !fuses_weight_decay_) ops::weight_decay_update(x, n, wd_lr);
    const float* gp = g.data<float>() + begin;
    if (clip_value > 0.0f) {
      float* c = set.clipped + begin;
      parallel_for(n, kParallelGrainElements, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) c[k] = std::clamp(gp[k], -clip_value, clip_value);
      });
      gp = c;
    } else if (by_norm && clip_scales_[i] != 1.0f) {
      const float scale = clip_scales_[i];
      float* c = set.clipped + begin;
      parallel_for(n, kParallelGrainElements, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) c[k] = gp[k] * scale;
      });
      gp = c;
    }
    std::array<float*, kMaxSlots> slots{};
    for (size_t s = 0; s < slot_names_.size(); ++s) slots[s] = set.data[s] + begin;
    StepContext ctx = pending_;
    ctx.weight_decay = set.decay ? weight_decay_ : 0.0;
    update_step(ctx, x, gp, n, slots.data());
  }
}

void Optimizer::finish_update() { iterations_.tensor().data<int64_t>()[0] += 1; }

void Optimizer::apply_gradients(std::span<const Tensor> grads, std::span<Variable* const> vars) {
  prepare_update(grads, vars);
  update_part(grads, vars, 0, 1);
  finish_update();
}

Variable* Optimizer::slot(const Variable& var, std::string_view slot_name) {
  const auto it = slots_.find(var.id());
  if (it == slots_.end()) return nullptr;
  for (size_t s = 0; s < slot_names_.size(); ++s) {
    if (slot_names_[s] == slot_name) return it->second.variables[s];
  }
  return nullptr;
}

std::vector<Variable*> Optimizer::variables() {
  std::vector<Variable*> out;
  out.reserve(1 + slot_variables_.size());
  out.push_back(&iterations_);
  for (const auto& v : slot_variables_) out.push_back(v.get());
  return out;
}

void Optimizer::add_clipping_to_config(OptimizerConfig& config) const {
  if (clipping_.clipnorm > 0.0) config.hyperparameters.emplace_back("clipnorm", clipping_.clipnorm);
  if (clipping_.global_clipnorm > 0.0) {
    config.hyperparameters.emplace_back("global_clipnorm", clipping_.global_clipnorm);
  }
  if (clipping_.clipvalue > 0.0) {
    config.hyperparameters.emplace_back("clipvalue", clipping_.clipvalue);
  }
  config.exclude_from_weight_decay = exclude_names_;
}

void Optimizer::add_learning_rate_to_config(OptimizerConfig& config) const {
  if (schedule_) {
    config.learning_rate_schedule = std::make_shared<ScheduleConfig>(schedule_->get_config());
  } else {
    config.hyperparameters.emplace_back("learning_rate", learning_rate_);
  }
}

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

constexpr const char* kKnownNames = "sgd, adam, adamw, rmsprop";

// Reads a config's hyperparameters into options, rejecting keys outside `known`.
class ConfigReader {
 public:
  ConfigReader(const OptimizerConfig& config, std::initializer_list<const char*> known)
      : config_(config) {
    for (const auto& hyperparameter : config.hyperparameters) {
      const std::string& key = hyperparameter.first;
      DTRAIN_CHECK(
          key == "clipnorm" || key == "clipvalue" || key == "global_clipnorm" ||
              std::any_of(known.begin(), known.end(), [&](const char* k) { return key == k; }),
          "optimizer_from_config: ", config.class_name, " has no hyperparameter '", key, "'");
    }
  }
  void read(const char* key, double& out) const {
    if (const double* v = config_.find(key)) out = *v;
  }
  void read(const char* key, bool& out) const {
    if (const double* v = config_.find(key)) out = *v != 0.0;
  }
  // The clipping arguments, which every optimizer takes.
  template <class Options>
  void read_clipping(Options& o) const {
    read("clipnorm", o.clipnorm);
    read("clipvalue", o.clipvalue);
    read("global_clipnorm", o.global_clipnorm);
  }
  void read_name(std::string& out) const {
    if (!config_.name.empty()) out = config_.name;
  }

 private:
  const OptimizerConfig& config_;
};

}  // namespace

std::unique_ptr<Optimizer> optimizer_from_config(const OptimizerConfig& config) {
  const std::string kind = lower(config.class_name);
  std::unique_ptr<Optimizer> opt;
  if (kind == "sgd") {
    SGDOptions o;
    ConfigReader r(config, {"learning_rate", "momentum", "nesterov", "weight_decay"});
    r.read("learning_rate", o.learning_rate);
    r.read("momentum", o.momentum);
    r.read("nesterov", o.nesterov);
    r.read("weight_decay", o.weight_decay);
    r.read_name(o.name);
    r.read_clipping(o);
    opt = std::make_unique<SGD>(o);
  } else if (kind == "adam") {
    AdamOptions o;
    ConfigReader r(config,
                   {"learning_rate", "beta_1", "beta_2", "epsilon", "amsgrad", "weight_decay"});
    r.read("learning_rate", o.learning_rate);
    r.read("beta_1", o.beta_1);
    r.read("beta_2", o.beta_2);
    r.read("epsilon", o.epsilon);
    r.read("amsgrad", o.amsgrad);
    r.read("weight_decay", o.weight_decay);
    r.read_name(o.name);
    r.read_clipping(o);
    opt = std::make_unique<Adam>(o);
  } else if (kind == "adamw") {
    AdamWOptions o;
    ConfigReader r(config,
                   {"learning_rate", "weight_decay", "beta_1", "beta_2", "epsilon", "amsgrad"});
    r.read("learning_rate", o.learning_rate);
    r.read("weight_decay", o.weight_decay);
    r.read("beta_1", o.beta_1);
    r.read("beta_2", o.beta_2);
    r.read("epsilon", o.epsilon);
    r.read("amsgrad", o.amsgrad);
    r.read_name(o.name);
    r.read_clipping(o);
    opt = std::make_unique<AdamW>(o);
  } else if (kind == "rmsprop") {
    RMSpropOptions o;
    ConfigReader r(config,
                   {"learning_rate", "rho", "momentum", "epsilon", "centered", "weight_decay"});
    r.read("learning_rate", o.learning_rate);
    r.read("rho", o.rho);
    r.read("momentum", o.momentum);
    r.read("epsilon", o.epsilon);
    r.read("centered", o.centered);
    r.read("weight_decay", o.weight_decay);
    r.read_name(o.name);
    r.read_clipping(o);
    opt = std::make_unique<RMSprop>(o);
  } else {
    throw InvalidArgumentError(str_cat("optimizer_from_config: unknown optimizer class '",
                                       config.class_name, "'; known: SGD, Adam, AdamW, RMSprop"));
  }
  if (!config.exclude_from_weight_decay.empty()) {
    opt->exclude_from_weight_decay(config.exclude_from_weight_decay);
  }
  if (config.learning_rate_schedule) {
    opt->set_learning_rate_schedule(schedule_from_config(*config.learning_rate_schedule));
  }
  return opt;
}

std::unique_ptr<Optimizer> optimizer_from_name(const std::string& name) {
  const std::string kind = lower(name);
  if (kind == "sgd") return std::make_unique<SGD>();
  if (kind == "adam") return std::make_unique<Adam>();
  if (kind == "adamw") return std::make_unique<AdamW>();
  if (kind == "rmsprop") return std::make_unique<RMSprop>();
  throw InvalidArgumentError(
      str_cat("optimizer_from_name: unknown optimizer '", name, "'; known: ", kKnownNames));
}

}  // namespace dtrain::optim
