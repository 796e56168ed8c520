// Sampler: greedy at temperature 0, the distribution of temperature / top-k sampling, seeds,
// and bad arguments.
#include "dtrain/nn/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dtrain/core/error.h"
#include "testutil/expect_throws.h"

namespace dtrain::nn {
namespace {

using testutil::expect_throws_with;

TEST(Sampler, GreedyAtTemperatureZero) {
  Sampler greedy({.temperature = 0.0f, .seed = 1});
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(greedy.sample(logits), 1);  // the lower id on ties
  EXPECT_EQ(greedy.sample(std::vector<float>{-INFINITY, -3.0f}), 1);
}

TEST(Sampler, FollowsTheSoftmaxWithTemperature) {
  const std::vector<float> logits = {std::log(1.0f), std::log(2.0f), std::log(5.0f)};
  for (float temp : {1.0f, 2.0f}) {
    Sampler s({.temperature = temp, .seed = 7});
    std::vector<int> counts(3, 0);
    const int n = 40000;
    for (int i = 0; i < n; ++i) ++counts[static_cast<size_t>(s.sample(logits))];
    // p_i ∝ w_i^(1/T).
    double z = 0;
    std::vector<double> p;
    for (double w : {1.0, 2.0, 5.0}) p.push_back(std::pow(w, 1.0 / temp)), z += p.back();
    for (size_t i = 0; i < 3; ++i) {
      // 6 standard deviations: never flaky, still tight.
      const double sd = std::sqrt(n * (p[i] / z) * (1 - p[i] / z));
      EXPECT_NEAR(counts[i], n * p[i] / z, 6 * sd) << "T " << temp << " id " << i;
    }
  }
}

TEST(Sampler, TopKSamplesOnlyTheKLargest) {
  const std::vector<float> logits = {1.0f, 3.0f, 0.0f, 2.9f, 2.0f};
  Sampler s({.temperature = 1.0f, .top_k = 2, .seed = 3});
  std::vector<int> counts(5, 0);
  for (int i = 0; i < 2000; ++i) ++counts[static_cast<size_t>(s.sample(logits))];
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[3], 0);
  Sampler one({.temperature = 5.0f, .top_k = 1, .seed = 3});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(one.sample(logits), 1);
  // top_k larger than the vocabulary: all of it.
  Sampler all({.temperature = 1.0f, .top_k = 99, .seed = 3});
  std::vector<int> seen(5, 0);
  for (int i = 0; i < 4000; ++i) ++seen[static_cast<size_t>(all.sample(logits))];
  for (int c : seen) EXPECT_GT(c, 0);
}

TEST(Sampler, SameSeedSameDraws) {
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  Sampler a({.temperature = 1.0f, .seed = 42}), b({.temperature = 1.0f, .seed = 42});
  Sampler c({.temperature = 1.0f, .seed = 43});
  std::vector<int32_t> da, db, dc;
  for (int i = 0; i < 50; ++i) {
    da.push_back(a.sample(logits));
    db.push_back(b.sample(logits));
    dc.push_back(c.sample(logits));
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
}

TEST(Sampler, RejectsBadArguments) {
  expect_throws_with<InvalidArgumentError>([] { Sampler({.temperature = -0.5f}); },
                                           {"temperature must be finite and >= 0"});
  expect_throws_with<InvalidArgumentError>([] { Sampler({.temperature = NAN}); }, {"temperature"});
  expect_throws_with<InvalidArgumentError>([] { Sampler({.top_k = -1}); }, {"top_k"});
  Sampler s;
  expect_throws_with<InvalidArgumentError>([&] { s.sample(std::vector<float>{}); },
                                           {"empty logits"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        s.sample(std::vector<float>{0.0f, NAN});
      },
      {"logit 1 is nan"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        s.sample(std::vector<float>{-INFINITY, -INFINITY});
      },
      {"every candidate logit"});
}

}  // namespace
}  // namespace dtrain::nn
