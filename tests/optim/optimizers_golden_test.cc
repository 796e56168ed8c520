// Compares every optimizer configuration of tests/golden/optim_golden.json (Keras's formulas,
// cross-checked against torch.optim by tools/golden/gen_optim_golden.py) step by step.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/optim/optimizer.h"

namespace dtrain::optim {
namespace {

using nlohmann::json;

constexpr double kRelTol = 1e-5;
constexpr double kAbsTol = 1e-7;

const json& golden() {
  static const json doc = [] {
    std::ifstream in(DTRAIN_SOURCE_DIR "/tests/golden/optim_golden.json");
    if (!in) throw std::runtime_error("cannot open tests/golden/optim_golden.json");
    return json::parse(in);
  }();
  return doc;
}

Tensor tensor_from(const json& values, const Shape& shape) {
  return Tensor::from_vector<float>(values.get<std::vector<float>>(), shape);
}

OptimizerConfig config_from(const json& c) {
  OptimizerConfig config{c.at("class_name").get<std::string>(), "", {}, nullptr};
  for (const auto& [key, value] : c.at("config").items()) {
    config.hyperparameters.emplace_back(
        key, value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>());
  }
  if (c.contains("exclude_from_weight_decay")) {
    config.exclude_from_weight_decay =
        c.at("exclude_from_weight_decay").get<std::vector<std::string>>();
  }
  if (!c.at("schedule").is_null()) {
    auto s = std::make_shared<ScheduleConfig>();
    s->class_name = c.at("schedule").at("class_name").get<std::string>();
    for (const auto& [key, value] : c.at("schedule").at("config").items()) {
      if (value.is_array()) {
        s->lists.emplace_back(key, value.get<std::vector<double>>());
      } else {
        s->scalars.emplace_back(
            key, value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>());
      }
    }
    config.learning_rate_schedule = s;
  }
  return config;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const json& c : golden().at("cases")) names.push_back(c.at("name").get<std::string>());
  return names;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesEveryStep) {
  const json* found = nullptr;
  for (const json& c : golden().at("cases")) {
    if (c.at("name") == GetParam()) found = &c;
  }
  ASSERT_NE(found, nullptr);
  const json& c = *found;

  std::unique_ptr<Optimizer> opt = optimizer_from_config(config_from(c));
  EXPECT_EQ(opt->get_config().class_name, c.at("class_name").get<std::string>());

  std::vector<std::unique_ptr<Variable>> owned;
  std::vector<Variable*> vars;
  std::vector<Shape> shapes;
  for (const json& v : golden().at("variables")) {
    shapes.emplace_back(v.at("shape").get<std::vector<int64_t>>());
    owned.push_back(std::make_unique<Variable>(v.at("name").get<std::string>(),
                                               tensor_from(v.at("initial"), shapes.back())));
    vars.push_back(owned.back().get());
  }

  const json& grads = golden().at("gradients");
  const json& expected = c.at("expected");
  ASSERT_EQ(grads.size(), expected.size());
  double worst = 0;
  for (size_t step = 0; step < grads.size(); ++step) {
    std::vector<Tensor> g;
    for (size_t i = 0; i < vars.size(); ++i) g.push_back(tensor_from(grads[step][i], shapes[i]));
    opt->apply_gradients(g, vars);
    EXPECT_EQ(opt->iterations(), static_cast<int64_t>(step + 1));
    for (size_t i = 0; i < vars.size(); ++i) {
      const std::vector<double> want = expected[step][i].get<std::vector<double>>();
      const float* got = vars[i]->tensor().data<float>();
      ASSERT_EQ(static_cast<int64_t>(want.size()), vars[i]->tensor().num_elements());
      for (size_t k = 0; k < want.size(); ++k) {
        const double err = std::abs(got[k] - want[k]);
        worst = std::max(worst, err / std::max(std::abs(want[k]), 1e-30));
        EXPECT_LE(err, kRelTol * std::abs(want[k]) + kAbsTol)
            << GetParam() << ": step " << step + 1 << ", " << vars[i]->name() << "[" << k
            << "]: got " << got[k] << ", want " << want[k];
      }
    }
  }
  std::printf("%-34s max relative error %.2e\n", GetParam().c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, GoldenTest, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return info.param; });

TEST(GoldenFile, CoversEveryConfiguration) {
  const std::vector<std::string> names = case_names();
  for (const char* want :
       {"sgd_plain", "sgd_momentum", "sgd_nesterov", "adam_default", "adam_amsgrad", "adamw",
        "rmsprop_plain", "rmsprop_momentum", "rmsprop_centered", "adam_exponential_decay",
        "adam_piecewise_constant_decay", "sgd_momentum_clipnorm", "sgd_momentum_global_clipnorm",
        "sgd_clipvalue", "adam_clipnorm", "adamw_global_clipnorm_exclude_bias",
        "adamw_exclude_bias", "adam_cosine_decay", "adam_cosine_decay_warmup"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
}

}  // namespace
}  // namespace dtrain::optim
