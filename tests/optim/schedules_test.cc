// Learning-rate schedules: Keras's values at and around boundaries, config round trips, errors.
#include "dtrain/optim/schedules.h"

#include <gtest/gtest.h>

#include <cmath>

#include "dtrain/core/error.h"
#include "testutil/expect_throws.h"

namespace dtrain::optim {
namespace {

TEST(ExponentialDecay, ContinuousAndStaircase) {
  ExponentialDecay smooth(0.1, 10, 0.5);
  EXPECT_FLOAT_EQ(smooth(0), 0.1f);
  EXPECT_FLOAT_EQ(smooth(5), static_cast<float>(0.1 * std::pow(0.5, 0.5)));
  EXPECT_FLOAT_EQ(smooth(10), 0.05f);
  EXPECT_FLOAT_EQ(smooth(25), static_cast<float>(0.1 * std::pow(0.5, 2.5)));
  ExponentialDecay stairs(0.1, 10, 0.5, /*staircase=*/true);
  EXPECT_FLOAT_EQ(stairs(9), 0.1f);
  EXPECT_FLOAT_EQ(stairs(10), 0.05f);
  EXPECT_FLOAT_EQ(stairs(19), 0.05f);
  EXPECT_FLOAT_EQ(stairs(20), 0.025f);
}

TEST(ExponentialDecay, RejectsNonPositiveDecaySteps) {
  EXPECT_THROW(ExponentialDecay(0.1, 0, 0.5), InvalidArgumentError);
  EXPECT_THROW(ExponentialDecay(0.1, -3, 0.5), InvalidArgumentError);
}

TEST(PiecewiseConstantDecay, BoundariesBelongToTheLowerInterval) {
  // Keras: values[0] for step <= 100, values[1] for 100 < step <= 200, values[2] after.
  PiecewiseConstantDecay s({100, 200}, {1.0, 0.5, 0.1});
  EXPECT_FLOAT_EQ(s(0), 1.0f);
  EXPECT_FLOAT_EQ(s(100), 1.0f);
  EXPECT_FLOAT_EQ(s(101), 0.5f);
  EXPECT_FLOAT_EQ(s(200), 0.5f);
  EXPECT_FLOAT_EQ(s(201), 0.1f);
  EXPECT_FLOAT_EQ(s(1'000'000'000'000), 0.1f);
  PiecewiseConstantDecay constant({}, {0.3});
  EXPECT_FLOAT_EQ(constant(7), 0.3f);
}

TEST(PiecewiseConstantDecay, SizeAndOrderErrors) {
  testutil::expect_throws_with<InvalidArgumentError>(
      [] {
        PiecewiseConstantDecay({100, 200}, {1.0, 0.5});
      },
      {"2 boundaries and 2 values"});
  EXPECT_THROW(PiecewiseConstantDecay({200, 100}, {1, 2, 3}), InvalidArgumentError);
}

TEST(Schedules, ConfigRoundTrip) {
  ExponentialDecay e(0.1, 1000, 0.96, true);
  const ScheduleConfig ec = e.get_config();
  EXPECT_EQ(ec.class_name, "ExponentialDecay");
  auto e2 = schedule_from_config(ec);
  for (int64_t step : {0, 999, 1000, 5000}) EXPECT_EQ((*e2)(step), e(step));
  PiecewiseConstantDecay p({3, 7}, {0.1, 0.01, 0.001});
  auto p2 = schedule_from_config(p.get_config());
  for (int64_t step : {0, 3, 4, 7, 8}) EXPECT_EQ((*p2)(step), p(step));
  EXPECT_THROW(schedule_from_config({"CosineDecay", {}, {}}), InvalidArgumentError);
  EXPECT_THROW(schedule_from_config({"ExponentialDecay", {{"decay_steps", 10}}, {}}),
               InvalidArgumentError);
  EXPECT_THROW(schedule_from_config(
                   {"ExponentialDecay",
                    {{"initial_learning_rate", 0.1}, {"decay_steps", 1.5}, {"decay_rate", 0.5}},
                    {}}),
               InvalidArgumentError);
}

TEST(CosineDecay, KerasFormulaWithAndWithoutWarmup) {
  const CosineDecay plain({.initial_learning_rate = 1.0, .decay_steps = 4, .alpha = 0.2});
  EXPECT_FLOAT_EQ(plain(0), 1.0f);
  EXPECT_FLOAT_EQ(plain(2), 0.8f * 0.5f + 0.2f);
  EXPECT_FLOAT_EQ(plain(4), 0.2f);
  EXPECT_FLOAT_EQ(plain(100), 0.2f);  // held at the end
  const CosineDecay warm(
      {.initial_learning_rate = 0.0, .decay_steps = 10, .warmup_target = 0.5, .warmup_steps = 5});
  EXPECT_FLOAT_EQ(warm(0), 0.0f);
  EXPECT_FLOAT_EQ(warm(2), 0.2f);
  EXPECT_FLOAT_EQ(warm(5), 0.5f);
  EXPECT_FLOAT_EQ(warm(10), 0.25f);
  EXPECT_NEAR(warm(15), 0.0f, 1e-9f);
  EXPECT_NEAR(warm(1000), 0.0f, 1e-9f);
}

TEST(CosineDecay, ConfigRoundTripAndErrors) {
  const CosineDecay warm({.initial_learning_rate = 0.1,
                          .decay_steps = 10,
                          .alpha = 0.05,
                          .warmup_target = 0.5,
                          .warmup_steps = 5});
  const auto back = schedule_from_config(warm.get_config());
  for (int64_t s = 0; s < 20; ++s) EXPECT_EQ((*back)(s), warm(s)) << s;
  const CosineDecay plain({.initial_learning_rate = 0.1, .decay_steps = 3});
  const ScheduleConfig c = plain.get_config();
  EXPECT_EQ(c.class_name, "CosineDecay");
  for (const auto& [k, v] : c.scalars) EXPECT_NE(k, "warmup_target");  // None
  EXPECT_EQ((*schedule_from_config(c))(2), plain(2));
  EXPECT_THROW(CosineDecay({.decay_steps = 0}), InvalidArgumentError);
  EXPECT_THROW(CosineDecay({.decay_steps = 5, .warmup_steps = 3}), InvalidArgumentError);
  EXPECT_THROW(CosineDecay({.decay_steps = 5, .warmup_target = 1.0, .warmup_steps = -1}),
               InvalidArgumentError);
  EXPECT_THROW(schedule_from_config({"CosineDecay", {{"initial_learning_rate", 0.1}}}),
               InvalidArgumentError);
}

TEST(LinearWarmup, ToAConstantAndIntoAnotherSchedule) {
  const LinearWarmup to_const(
      {.warmup_learning_rate = 0.0, .warmup_steps = 4, .after_warmup_learning_rate = 0.8});
  EXPECT_FLOAT_EQ(to_const(0), 0.0f);
  EXPECT_FLOAT_EQ(to_const(1), 0.2f);
  EXPECT_FLOAT_EQ(to_const(3), 0.6f);
  EXPECT_FLOAT_EQ(to_const(4), 0.8f);
  EXPECT_FLOAT_EQ(to_const(1000), 0.8f);
  // Into ExponentialDecay: the ramp ends at the wrapped schedule's value at warmup_steps, and
  // the wrapped schedule sees the global step afterwards (TF Model Garden's LinearWarmup).
  auto decay = std::make_shared<ExponentialDecay>(1.0, 10, 0.5);
  const LinearWarmup wrap(
      {.warmup_learning_rate = 0.1, .warmup_steps = 5, .after_warmup_schedule = decay});
  const double peak = std::pow(0.5, 0.5);
  EXPECT_FLOAT_EQ(wrap(0), 0.1f);
  EXPECT_FLOAT_EQ(wrap(2), static_cast<float>(0.1 + 0.4 * (peak - 0.1)));
  EXPECT_FLOAT_EQ(wrap(5), (*decay)(5));
  EXPECT_FLOAT_EQ(wrap(17), (*decay)(17));
  // No warmup: the wrapped schedule from step 0.
  const LinearWarmup none({.warmup_steps = 0, .after_warmup_schedule = decay});
  EXPECT_FLOAT_EQ(none(0), 1.0f);
}

TEST(LinearWarmup, ConfigRoundTripAndErrors) {
  auto cosine = std::make_shared<CosineDecay>(
      CosineDecayOptions{.initial_learning_rate = 0.3, .decay_steps = 7, .alpha = 0.1});
  const LinearWarmup wrap(
      {.warmup_learning_rate = 0.01, .warmup_steps = 3, .after_warmup_schedule = cosine});
  const ScheduleConfig c = wrap.get_config();
  EXPECT_EQ(c.class_name, "LinearWarmup");
  ASSERT_EQ(c.schedules.size(), 1u);
  EXPECT_EQ(c.schedules[0].first, "after_warmup_lr_sched");
  EXPECT_EQ(c.schedules[0].second.class_name, "CosineDecay");
  const auto back = schedule_from_config(c);
  for (int64_t s = 0; s < 15; ++s) EXPECT_EQ((*back)(s), wrap(s)) << s;
  const LinearWarmup to_const({.warmup_steps = 2, .after_warmup_learning_rate = 0.5});
  const auto back2 = schedule_from_config(to_const.get_config());
  for (int64_t s = 0; s < 4; ++s) EXPECT_EQ((*back2)(s), to_const(s)) << s;
  EXPECT_THROW(LinearWarmup({.warmup_steps = -1}), InvalidArgumentError);
  testutil::expect_throws_with<InvalidArgumentError>(
      [] {
        schedule_from_config({"LinearWarmup", {{"warmup_steps", 3}}});
      },
      {"LinearWarmup: config needs 'after_warmup_lr_sched'"});
  testutil::expect_throws_with<InvalidArgumentError>(
      [] {
        schedule_from_config(
            {"LinearWarmup", {{"warmup_steps", 1.5}, {"after_warmup_lr_sched", 1}}});
      },
      {"warmup_steps must be an integer"});
}

}  // namespace
}  // namespace dtrain::optim
