// BatchNormalization inside fit(): moving statistics updated only by training steps, the mean
// of the replicas' updates under MirroredStrategy (identical and deterministic), no allocation
// per step, a frozen layer running in inference mode, and bitwise resume with BackupAndRestore.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <optional>

#include "dtrain/core/random.h"
#include "dtrain/distribute/mirrored_strategy.h"
#include "dtrain/nn/activations.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/ops/normalization.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/backup_and_restore.h"
#include "dtrain/train/saving.h"
#include "dtrain/train/training.h"
#include "testutil/count_new.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

struct Data {
  Tensor x, y;
};
Data make_data(int64_t n, uint64_t seed) {
  Philox rng(seed);
  Tensor x(Shape{n, 4});
  Tensor y(DType::kInt32, Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<int32_t>(rng.uniform_int(3));
    y.data<int32_t>()[i] = c;
    for (int64_t d = 0; d < 4; ++d) {
      x.data<float>()[i * 4 + d] = (d % 3 == c ? 2.0f : 0.0f) + (1.0f + d) * rng.normal() + d;
    }
  }
  return {x, y};
}

// BN first, so that its inputs (and so its moving statistics) do not depend on the weights.
std::unique_ptr<nn::Sequential> bn_model() {
  nn::clear_session();
  auto m = std::make_unique<nn::Sequential>(std::initializer_list<nn::LayerRef>{
      nn::BatchNormalization({.momentum = 0.9f, .input_shape = Shape{4}}),
      nn::Dense(8, {.activation = "gelu", .seed = 5}), nn::Dense(3, {.seed = 6})});
  m->compile(
      {.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.01f}),
       .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
  return m;
}

nn::BatchNormalization& bn_of(nn::Sequential& m) {
  return dynamic_cast<nn::BatchNormalization&>(*m.layers()[0]);
}

// The moving statistics after training on `x` in order, batches of `batch`, each split into
// `replicas` equal parts whose updates are averaged (computed here, independently of fit()).
std::pair<std::vector<double>, std::vector<double>> expected_stats(const Tensor& x, int64_t batch,
                                                                   int replicas) {
  std::vector<double> mm(4, 0.0), mv(4, 1.0);
  const int64_t n = x.dim(0);
  for (int64_t b = 0; b < n; b += batch) {
    std::vector<double> mean_sum(4, 0.0), var_sum(4, 0.0);
    const int64_t rows = std::min(batch, n - b), part = rows / replicas;
    for (int r = 0; r < replicas; ++r) {
      float mean[4], var[4];
      ops::batch_norm_moments(x.data<float>() + (b + r * part) * 4,
                              {.outer = part, .channels = 4, .inner = 1}, mean, var);
      for (int j = 0; j < 4; ++j) {
        mean_sum[j] += mean[j];
        var_sum[j] += var[j];
      }
    }
    for (int j = 0; j < 4; ++j) {
      mm[j] = mm[j] * 0.9 + mean_sum[j] / replicas * 0.1;
      mv[j] = mv[j] * 0.9 + var_sum[j] / replicas * 0.1;
    }
  }
  return {mm, mv};
}

void expect_stats(nn::BatchNormalization& bn,
                  const std::pair<std::vector<double>, std::vector<double>>& want) {
  for (int j = 0; j < 4; ++j) {
    EXPECT_NEAR(bn.moving_mean().tensor().data<float>()[j], want.first[j], 1e-5) << j;
    EXPECT_NEAR(bn.moving_variance().tensor().data<float>()[j], want.second[j], 1e-5) << j;
  }
}

TEST(BatchNormFit, OneDeviceUpdatesMovingStatisticsOnlyInTraining) {
  const Data d = make_data(256, 1);
  auto m = bn_model();
  m->fit(d.x, d.y, {.epochs = 1, .batch_size = 64, .shuffle = false, .verbose = 0});
  expect_stats(bn_of(*m), expected_stats(d.x, 64, 1));
  const Tensor mean = bn_of(*m).moving_mean().tensor().clone();
  m->evaluate(d.x, d.y, {.batch_size = 64, .verbose = 0});
  m->predict(d.x, {.batch_size = 64});
  EXPECT_TRUE(bn_of(*m).moving_mean().tensor().equals(mean)) << "evaluate/predict updated them";
  EXPECT_EQ(bn_of(*m).non_trainable_weights().size(), 2u);
  EXPECT_EQ(m->trainable_variables().size(), 6u);  // gamma, beta and the Dense weights
}

TEST(BatchNormFit, MirroredUsesTheMeanOfTheReplicasUpdatesDeterministically) {
  const Data d = make_data(256, 2);
  auto run = [&] {
    distribute::MirroredStrategy strategy(2);
    auto scope = strategy.scope();
    auto m = bn_model();
    m->fit(d.x, d.y, {.epochs = 1, .batch_size = 64, .shuffle = false, .verbose = 0});
    expect_stats(bn_of(*m), expected_stats(d.x, 64, 2));
    std::vector<Tensor> w;
    for (Variable* v : m->weights()) w.push_back(v->tensor().clone());
    return w;
  };
  const auto a = run();
  for (int trial = 0; trial < 3; ++trial) {
    const auto b = run();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equals(b[i])) << "variable " << i;
  }
}

TEST(BatchNormFit, MirroredStepsWithBatchNormDoNotAllocateInSteadyState) {
  const Data d = make_data(64 * 40, 3);
  distribute::MirroredStrategy strategy(2);
  auto scope = strategy.scope();
  auto m = bn_model();
  long at_10 = 0, at_35 = 0;
  auto probe = std::make_shared<train::LambdaCallback>(
      train::LambdaCallbackOptions{.on_batch_end = [&](int64_t b, const nn::Logs&) {
        if (b == 10) at_10 = testutil::new_calls();
        if (b == 35) at_35 = testutil::new_calls();
      }});
  m->fit(d.x, d.y, {.epochs = 1, .batch_size = 64, .verbose = 0, .callbacks = {probe}});
  EXPECT_EQ(at_35 - at_10, 0) << "operator new calls in 25 mirrored steps with BN";
}

TEST(BatchNormFit, FrozenLayerRunsInInferenceMode) {
  const Data d = make_data(128, 4);
  auto m = bn_model();
  bn_of(*m).set_trainable(false);
  m->fit(d.x, d.y, {.epochs = 1, .batch_size = 32, .verbose = 0});
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(bn_of(*m).moving_mean().tensor().data<float>()[j], 0.0f);
    EXPECT_EQ(bn_of(*m).moving_variance().tensor().data<float>()[j], 1.0f);
  }
  // Inference mode with the initial statistics: γ·x / sqrt(1 + ε) + β.
  const Tensor x = d.x.slice(0, 2);
  const Tensor y = bn_of(*m)(x, /*training=*/true);
  const float* g = bn_of(*m).gamma()->tensor().data<float>();
  const float* b = bn_of(*m).beta()->tensor().data<float>();
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_NEAR(y.data<float>()[i], g[i % 4] * x.data<float>()[i] / std::sqrt(1.001f) + b[i % 4],
                1e-5);
  }
}

// SyncBatchNormalization under MirroredStrategy(2) with a global batch of 64 (32 per replica)
// trains as BatchNormalization on one device with batch 64: the moments and their backward are
// those of the global batch.
TEST(BatchNormFit, SyncBatchNormOnTwoReplicasMatchesOneDevice) {
  const Data d = make_data(512, 6);
  auto run = [&](int replicas) {
    std::optional<distribute::MirroredStrategy> strategy;
    std::optional<distribute::Strategy::ScopeGuard> scope;
    if (replicas > 0) {
      strategy.emplace(replicas);
      scope.emplace(&*strategy);
    }
    nn::clear_session();
    // No bias before BN: its exact gradient is 0, so Adam would amplify rounding noise.
    nn::Sequential m({nn::Dense(6, {.use_bias = false, .seed = 3, .input_shape = Shape{4}}),
                      nn::BatchNormalization({.momentum = 0.8f, .synchronized = true}),
                      nn::Activation("relu"), nn::Dense(3, {.seed = 4})});
    m.compile(
        {.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.01f}),
         .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
    m.fit(d.x, d.y, {.epochs = 2, .batch_size = 64, .shuffle = false, .verbose = 0});
    std::vector<Tensor> w;
    for (Variable* v : m.weights()) w.push_back(v->tensor().clone());
    return w;
  };
  const auto one = run(0), two = run(2);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    for (int64_t k = 0; k < one[i].num_elements(); ++k) {
      EXPECT_NEAR(two[i].data<float>()[k], one[i].data<float>()[k], 2e-4f)
          << "variable " << i << " element " << k;
    }
  }
  // Plain BatchNormalization on two replicas differs (per-replica moments, as TF).
  nn::clear_session();
}

// A trained model with BatchNormalization, LayerNormalization and the new activations saves
// to Keras's HDF5 format and loads back with the same weights (moving statistics included)
// and the same predictions.
TEST(BatchNormFit, SavedH5LoadsWithTheSameStatisticsAndPredictions) {
  const Data d = make_data(128, 7);
  nn::clear_session();
  nn::Sequential m({nn::Dense(8, {.use_bias = false, .input_shape = Shape{4}}),
                    nn::BatchNormalization({.momentum = 0.5f}), nn::LeakyReLU(),
                    nn::LayerNormalization(), nn::Dense(3, {.activation = "gelu"})});
  m.compile({.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.01f}),
             .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
  m.fit(d.x, d.y, {.epochs = 1, .batch_size = 32, .verbose = 0});
  const std::string path =
      (fs::temp_directory_path() / ("dtrain_bn_" + std::to_string(getpid()) + ".h5")).string();
  m.save(path);
  nn::clear_session();
  const std::unique_ptr<nn::Model> back = train::load_model(path);
  fs::remove(path);
  const std::vector<Variable*> a = m.weights(), b = back->weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]->name(), b[i]->name());
    EXPECT_TRUE(a[i]->tensor().equals(b[i]->tensor())) << a[i]->name();
  }
  EXPECT_TRUE(m.predict(d.x, {.batch_size = 32}).equals(back->predict(d.x, {.batch_size = 32})));
}

class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("simulated crash") {}
};

std::vector<Tensor> train_resumable(const Data& d, const std::string& dir, int64_t crash_at) {
  set_random_seed(77);
  distribute::MirroredStrategy strategy(2);
  auto scope = strategy.scope();
  nn::clear_session();
  nn::Sequential m({nn::Dense(8, {.input_shape = Shape{4}}), nn::BatchNormalization(), nn::ReLU(),
                    nn::Dropout(0.2f), nn::Dense(3)});
  m.compile({.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.01f}),
             .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
  int64_t steps = 0;
  auto crasher = std::make_shared<train::LambdaCallback>(
      train::LambdaCallbackOptions{.on_batch_end = [&](int64_t, const nn::Logs&) {
        if (++steps == crash_at) throw Interrupted();
      }});
  std::vector<std::shared_ptr<train::Callback>> callbacks;
  if (!dir.empty()) {
    callbacks.push_back(std::make_shared<train::BackupAndRestore>(
        dir, train::BackupAndRestoreOptions{.save_freq = 3}));
  }
  callbacks.push_back(crasher);
  try {
    m.fit(d.x, d.y, {.epochs = 3, .batch_size = 16, .verbose = 0, .callbacks = callbacks});
  } catch (const Interrupted&) {
    return {};
  }
  std::vector<Tensor> w;
  for (Variable* v : m.weights()) w.push_back(v->tensor().clone());
  for (Variable* v : m.optimizer()->variables()) w.push_back(v->tensor().clone());
  return w;
}

TEST(BatchNormFit, ResumedMirroredRunMatchesUninterruptedRunBitwise) {
  const std::string dir =
      (fs::temp_directory_path() / ("dtrain_bn_bar_" + std::to_string(getpid()))).string();
  fs::remove_all(dir);
  const Data d = make_data(160, 5);  // 10 steps per epoch
  const auto reference = train_resumable(d, "", -1);
  ASSERT_FALSE(reference.empty());
  EXPECT_TRUE(train_resumable(d, dir, 14).empty());  // the newest backup is after step 12
  const auto resumed = train_resumable(d, dir, -1);
  ASSERT_EQ(resumed.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(resumed[i].equals(reference[i])) << "variable " << i;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dtrain
