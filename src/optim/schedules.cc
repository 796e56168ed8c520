// Learning-rate schedules with Keras's formulas, evaluated in double and rounded to float once.
#include "dtrain/optim/schedules.h"

#include <algorithm>
#include <cmath>

#include "dtrain/core/error.h"

namespace dtrain::optim {

ExponentialDecay::ExponentialDecay(double initial_learning_rate, int64_t decay_steps,
                                   double decay_rate, bool staircase)
    : initial_learning_rate_(initial_learning_rate),
      decay_steps_(decay_steps),
      decay_rate_(decay_rate),
      staircase_(staircase) {
  DTRAIN_CHECK(decay_steps > 0, "ExponentialDecay: decay_steps must be positive, got ",
               decay_steps);
  DTRAIN_CHECK(std::isfinite(initial_learning_rate) && std::isfinite(decay_rate),
               "ExponentialDecay: initial_learning_rate ", initial_learning_rate,
               " and decay_rate ", decay_rate, " must be finite");
}

float ExponentialDecay::operator()(int64_t step) const {
  double p = static_cast<double>(step) / static_cast<double>(decay_steps_);
  if (staircase_) p = std::floor(p);
  return static_cast<float>(initial_learning_rate_ * std::pow(decay_rate_, p));
}

ScheduleConfig ExponentialDecay::get_config() const {
  return {"ExponentialDecay",
          {{"initial_learning_rate", initial_learning_rate_},
           {"decay_steps", static_cast<double>(decay_steps_)},
           {"decay_rate", decay_rate_},
           {"staircase", staircase_ ? 1.0 : 0.0}}};
}

PiecewiseConstantDecay::PiecewiseConstantDecay(std::vector<int64_t> boundaries,
                                               std::vector<double> values)
    : boundaries_(std::move(boundaries)), values_(std::move(values)) {
  DTRAIN_CHECK(values_.size() == boundaries_.size() + 1,
               "PiecewiseConstantDecay: the length of boundaries should be 1 less than the "
               "length of values; got ",
               boundaries_.size(), " boundaries and ", values_.size(), " values");
  DTRAIN_CHECK(std::is_sorted(boundaries_.begin(), boundaries_.end()),
               "PiecewiseConstantDecay: boundaries must be non-decreasing");
}

float PiecewiseConstantDecay::operator()(int64_t step) const {
  // The first boundary with step <= boundary selects its value; past the last, the last value.
  const auto it = std::lower_bound(boundaries_.begin(), boundaries_.end(), step);
  return static_cast<float>(values_[static_cast<size_t>(it - boundaries_.begin())]);
}

ScheduleConfig PiecewiseConstantDecay::get_config() const {
  ScheduleConfig config{"PiecewiseConstantDecay", {}, {}};
  config.lists.emplace_back("boundaries",
                            std::vector<double>(boundaries_.begin(), boundaries_.end()));
  config.lists.emplace_back("values", values_);
  return config;
}

CosineDecay::CosineDecay(const CosineDecayOptions& options) : o_(options) {
  DTRAIN_CHECK(o_.decay_steps > 0, "CosineDecay: decay_steps must be positive, got ",
               o_.decay_steps);
  DTRAIN_CHECK(o_.warmup_steps >= 0, "CosineDecay: warmup_steps must be >= 0, got ",
               o_.warmup_steps);
  DTRAIN_CHECK(o_.warmup_steps == 0 || o_.warmup_target.has_value(),
               "CosineDecay: warmup_steps = ", o_.warmup_steps, " needs a warmup_target");
  DTRAIN_CHECK(std::isfinite(o_.initial_learning_rate) && std::isfinite(o_.alpha) &&
                   std::isfinite(o_.warmup_target.value_or(0.0)),
               "CosineDecay: initial_learning_rate, alpha and warmup_target must be finite");
}

float CosineDecay::operator()(int64_t step) const {
  const double decay_steps = static_cast<double>(o_.decay_steps);
  auto decayed = [&](double s, double from) {
    const double cosine = 0.5 * (1.0 + std::cos(M_PI * (s / decay_steps)));
    return from * ((1.0 - o_.alpha) * cosine + o_.alpha);
  };
  double s = static_cast<double>(step);
  if (!o_.warmup_target.has_value()) {
    return static_cast<float>(decayed(std::min(s, decay_steps), o_.initial_learning_rate));
  }
  const double warmup = static_cast<double>(o_.warmup_steps);
  s = std::min(s, decay_steps + warmup);
  if (s < warmup) {
    return static_cast<float>((*o_.warmup_target - o_.initial_learning_rate) * (s / warmup) +
                              o_.initial_learning_rate);
  }
  return static_cast<float>(decayed(s - warmup, *o_.warmup_target));
}

ScheduleConfig CosineDecay::get_config() const {
  ScheduleConfig config{"CosineDecay",
                        {{"initial_learning_rate", o_.initial_learning_rate},
                         {"decay_steps", static_cast<double>(o_.decay_steps)},
                         {"alpha", o_.alpha}}};
  // Keras writes warmup_target None when absent; a missing scalar reads back as None.
  if (o_.warmup_target.has_value()) config.scalars.emplace_back("warmup_target", *o_.warmup_target);
  config.scalars.emplace_back("warmup_steps", static_cast<double>(o_.warmup_steps));
  return config;
}

LinearWarmup::LinearWarmup(LinearWarmupOptions options) : o_(std::move(options)) {
  DTRAIN_CHECK(o_.warmup_steps >= 0, "LinearWarmup: warmup_steps must be >= 0, got ",
               o_.warmup_steps);
  DTRAIN_CHECK(
      std::isfinite(o_.warmup_learning_rate) && std::isfinite(o_.after_warmup_learning_rate),
      "LinearWarmup: warmup_learning_rate ", o_.warmup_learning_rate,
      " and after_warmup_learning_rate ", o_.after_warmup_learning_rate, " must be finite");
}

double LinearWarmup::after(int64_t step) const {
  return o_.after_warmup_schedule ? static_cast<double>((*o_.after_warmup_schedule)(step))
                                  : o_.after_warmup_learning_rate;
}

float LinearWarmup::operator()(int64_t step) const {
  if (step >= o_.warmup_steps) return static_cast<float>(after(step));
  const double peak = after(o_.warmup_steps);
  const double frac = static_cast<double>(step) / static_cast<double>(o_.warmup_steps);
  return static_cast<float>(o_.warmup_learning_rate + frac * (peak - o_.warmup_learning_rate));
}

ScheduleConfig LinearWarmup::get_config() const {
  ScheduleConfig config{"LinearWarmup",
                        {{"warmup_steps", static_cast<double>(o_.warmup_steps)},
                         {"warmup_learning_rate", o_.warmup_learning_rate}}};
  if (o_.after_warmup_schedule) {
    config.schedules.emplace_back("after_warmup_lr_sched", o_.after_warmup_schedule->get_config());
  } else {
    config.scalars.emplace_back("after_warmup_lr_sched", o_.after_warmup_learning_rate);
  }
  return config;
}

namespace {

const double* find_scalar(const ScheduleConfig& c, const char* key) {
  for (const auto& [k, v] : c.scalars) {
    if (k == key) return &v;
  }
  return nullptr;
}

const std::vector<double>* find_list(const ScheduleConfig& c, const char* key) {
  for (const auto& [k, v] : c.lists) {
    if (k == key) return &v;
  }
  return nullptr;
}

void check_keys(const ScheduleConfig& c, std::initializer_list<const char*> scalars,
                std::initializer_list<const char*> lists,
                std::initializer_list<const char*> schedules = {}) {
  const auto check = [&c](const auto& entries, std::initializer_list<const char*> known,
                          const char* kind) {
    for (const auto& entry : entries) {
      const std::string& k = entry.first;
      DTRAIN_CHECK(std::any_of(known.begin(), known.end(), [&k](const char* s) { return k == s; }),
                   c.class_name, ": unknown config key '", k, "'", kind);
    }
  };
  check(c.schedules, schedules, " (a schedule)");
  check(c.scalars, scalars, "");
  check(c.lists, lists, "");
}

double require_scalar(const ScheduleConfig& c, const char* key) {
  const double* v = find_scalar(c, key);
  DTRAIN_CHECK(v != nullptr, c.class_name, ": config lacks '", key, "'");
  return *v;
}

}  // namespace

std::shared_ptr<LearningRateSchedule> schedule_from_config(const ScheduleConfig& config) {
  if (config.class_name == "ExponentialDecay") {
    check_keys(config, {"initial_learning_rate", "decay_steps", "decay_rate", "staircase"}, {});
    const double steps = require_scalar(config, "decay_steps");
    DTRAIN_CHECK(steps == std::floor(steps),
                 "ExponentialDecay: decay_steps must be an integer, got ", steps);
    const double* staircase = find_scalar(config, "staircase");
    return std::make_shared<ExponentialDecay>(
        require_scalar(config, "initial_learning_rate"), static_cast<int64_t>(steps),
        require_scalar(config, "decay_rate"), staircase != nullptr && *staircase != 0.0);
  }
  if (config.class_name == "PiecewiseConstantDecay") {
    check_keys(config, {}, {"boundaries", "values"});
    const std::vector<double>* b = find_list(config, "boundaries");
    const std::vector<double>* v = find_list(config, "values");
    DTRAIN_CHECK(b != nullptr && v != nullptr,
                 "PiecewiseConstantDecay: config needs 'boundaries' and 'values'");
    std::vector<int64_t> boundaries;
    boundaries.reserve(b->size());
    for (double x : *b) {
      DTRAIN_CHECK(x == std::floor(x), "PiecewiseConstantDecay: boundary ", x,
                   " is not an integer step");
      boundaries.push_back(static_cast<int64_t>(x));
    }
    return std::make_shared<PiecewiseConstantDecay>(std::move(boundaries), *v);
  }
  if (config.class_name == "CosineDecay") {
    check_keys(config,
               {"initial_learning_rate", "decay_steps", "alpha", "warmup_target", "warmup_steps"},
               {});
    CosineDecayOptions o;
    o.initial_learning_rate = require_scalar(config, "initial_learning_rate");
    const double steps = require_scalar(config, "decay_steps");
    DTRAIN_CHECK(steps == std::floor(steps), "CosineDecay: decay_steps must be an integer, got ",
                 steps);
    o.decay_steps = static_cast<int64_t>(steps);
    if (const double* a = find_scalar(config, "alpha")) o.alpha = *a;
    if (const double* t = find_scalar(config, "warmup_target")) o.warmup_target = *t;
    if (const double* w = find_scalar(config, "warmup_steps")) {
      DTRAIN_CHECK(*w == std::floor(*w), "CosineDecay: warmup_steps must be an integer, got ", *w);
      o.warmup_steps = static_cast<int64_t>(*w);
    }
    return std::make_shared<CosineDecay>(o);
  }
  if (config.class_name == "LinearWarmup") {
    check_keys(config, {"warmup_steps", "warmup_learning_rate", "after_warmup_lr_sched"}, {},
               {"after_warmup_lr_sched"});
    LinearWarmupOptions o;
    const double steps = require_scalar(config, "warmup_steps");
    DTRAIN_CHECK(steps == std::floor(steps), "LinearWarmup: warmup_steps must be an integer, got ",
                 steps);
    o.warmup_steps = static_cast<int64_t>(steps);
    if (const double* w = find_scalar(config, "warmup_learning_rate")) o.warmup_learning_rate = *w;
    const double* constant = find_scalar(config, "after_warmup_lr_sched");
    const ScheduleConfig* nested = nullptr;
    for (const auto& [k, v] : config.schedules) {
      if (k == "after_warmup_lr_sched") nested = &v;
    }
    DTRAIN_CHECK((constant != nullptr) != (nested != nullptr),
                 "LinearWarmup: config needs 'after_warmup_lr_sched' (a number or a schedule)");
    if (constant) {
      o.after_warmup_learning_rate = *constant;
    } else {
      o.after_warmup_schedule = schedule_from_config(*nested);
    }
    return std::make_shared<LinearWarmup>(std::move(o));
  }
  throw InvalidArgumentError(
      str_cat("schedule_from_config: unknown schedule '", config.class_name,
              "'; known: ExponentialDecay, PiecewiseConstantDecay, CosineDecay, LinearWarmup"));
}

}  // namespace dtrain::optim
