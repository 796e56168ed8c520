// Gradient clipping by norm under MirroredStrategy: the norm is that of the whole reduced
// gradient, computed before any replica thread updates its element range.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dtrain/core/random.h"
#include "dtrain/distribute/mirrored_strategy.h"
#include "dtrain/nn/layers.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/training.h"

namespace dtrain {
namespace {

struct Data {
  Tensor x, y;
};

// Regression targets large enough that the gradients' global norm is far above the clip.
Data make_data(int64_t n, uint64_t seed) {
  Philox rng(seed);
  Tensor x(Shape{n, 8});
  Tensor y(Shape{n, 3});
  for (int64_t i = 0; i < n * 8; ++i) x.data<float>()[i] = rng.normal();
  for (int64_t i = 0; i < n * 3; ++i) y.data<float>()[i] = 20.0f * rng.normal();
  return {x, y};
}

std::vector<Tensor> train(int replicas, const optim::AdamWOptions& options, const Data& d) {
  std::optional<distribute::MirroredStrategy> strategy;
  std::optional<distribute::Strategy::ScopeGuard> scope;
  if (replicas > 0) {
    strategy.emplace(replicas);
    scope.emplace(&*strategy);
  }
  nn::clear_session();
  nn::Sequential m({nn::Dense(16, {.activation = "relu", .seed = 5, .input_shape = Shape{8}}),
                    nn::Dense(3, {.seed = 6})});
  auto opt = std::make_shared<optim::AdamW>(options);
  opt->exclude_from_weight_decay({"bias"});
  m.compile({.optimizer = opt, .loss = "mse"});
  m.fit(d.x, d.y, {.epochs = 2, .batch_size = 64, .seed = 7, .verbose = 0});
  std::vector<Tensor> w;
  for (Variable* v : m.weights()) w.push_back(v->tensor().clone());
  for (Variable* v : m.optimizer()->variables()) w.push_back(v->tensor().clone());
  return w;
}

void expect_near(const std::vector<Tensor>& a, const std::vector<Tensor>& b, float tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].dtype() != DType::kFloat32) {
      EXPECT_TRUE(a[i].equals(b[i])) << "variable " << i;  // the iteration counter
      continue;
    }
    const float* p = a[i].data<float>();
    const float* q = b[i].data<float>();
    for (int64_t k = 0; k < a[i].num_elements(); ++k) {
      ASSERT_NEAR(p[k], q[k], tol) << "variable " << i << " element " << k;
    }
  }
}

TEST(FitClipping, MirroredGlobalClipnormMatchesOneDeviceAndIsDeterministic) {
  const Data d = make_data(512, 3);
  const optim::AdamWOptions options{
      .learning_rate = 0.01, .weight_decay = 0.1, .global_clipnorm = 1.0};
  const auto one = train(0, options, d);
  const auto two = train(2, options, d);
  const auto two_again = train(2, options, d);
  for (size_t i = 0; i < two.size(); ++i) {
    EXPECT_TRUE(two[i].equals(two_again[i])) << "variable " << i << " differs between runs";
  }
  expect_near(two, one, 1e-5f);
  // Clipping mattered: without it the weights end elsewhere.
  const auto unclipped = train(0, {.learning_rate = 0.01, .weight_decay = 0.1}, d);
  float max_diff = 0;
  for (size_t i = 0; i < 4; ++i) {
    for (int64_t k = 0; k < one[i].num_elements(); ++k) {
      max_diff =
          std::max(max_diff, std::abs(one[i].data<float>()[k] - unclipped[i].data<float>()[k]));
    }
  }
  EXPECT_GT(max_diff, 1e-3f);
}

TEST(FitClipping, MirroredClipnormMatchesOneDevice) {
  const Data d = make_data(256, 4);
  const optim::AdamWOptions options{.learning_rate = 0.01, .clipnorm = 0.5};
  expect_near(train(3, options, d), train(0, options, d), 1e-5f);
}

}  // namespace
}  // namespace dtrain
