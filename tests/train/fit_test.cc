// compile/fit/evaluate/predict semantics on small synthetic data.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <optional>

#include "dtrain/autograd/functions.h"
#include "dtrain/core/random.h"
#include "dtrain/distribute/mirrored_strategy.h"
#include "dtrain/nn/layers.h"
#include "dtrain/optim/adam.h"
#include "dtrain/optim/sgd.h"
#include "dtrain/train/training.h"

// Counts global operator new calls so a test can check that training steps do not allocate.
#include "testutil/count_new.h"

namespace dtrain {
namespace {

using nn::Dense;
using nn::Sequential;

// Two Gaussian blobs per class in 8 dimensions: learnable to high accuracy.
struct Blobs {
  Tensor x, y;
};
Blobs make_blobs(int64_t n, int64_t classes, uint64_t seed) {
  Philox rng(seed);
  Tensor x(Shape{n, 8});
  Tensor y(DType::kInt64, Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = static_cast<int64_t>(rng.uniform_int(classes));
    y.data<int64_t>()[i] = c;
    for (int64_t d = 0; d < 8; ++d) {
      const float center = (d % classes == c) ? 2.0f : 0.0f;
      x.data<float>()[i * 8 + d] = center + 0.5f * rng.normal();
    }
  }
  return {x, y};
}

std::unique_ptr<Sequential> small_model(uint64_t seed) {
  auto m = std::make_unique<Sequential>(std::initializer_list<nn::LayerRef>{
      Dense(16, {.activation = "relu", .seed = seed, .input_shape = Shape{8}}),
      Dense(3, {.seed = seed + 1})});
  m->compile(
      {.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.01f}),
       .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
       .metrics = {"accuracy"}});
  return m;
}

TEST(Fit, LearnsAndReportsHistoryAndValidation) {
  const Blobs train = make_blobs(600, 3, 1), test = make_blobs(200, 3, 2);
  auto model = small_model(3);
  const train::History h = model->fit(train.x, train.y,
                                      {.epochs = 5,
                                       .batch_size = 32,
                                       .validation_data = std::make_pair(test.x, test.y),
                                       .seed = 4,
                                       .verbose = 0});
  ASSERT_EQ(h.epochs(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  for (const char* k : {"loss", "accuracy", "val_loss", "val_accuracy"}) {
    ASSERT_EQ(h.history().at(k).size(), 5u) << k;
  }
  EXPECT_LT(h.history().at("loss").back(), h.history().at("loss").front());
  EXPECT_GT(h.last("val_accuracy"), 0.9);
  const nn::Logs eval = model->evaluate(test.x, test.y, {.batch_size = 64});
  EXPECT_NEAR(eval.at("accuracy"), h.last("val_accuracy"), 1e-12);
  EXPECT_NEAR(eval.at("loss"), h.last("val_loss"), 1e-6);
}

// As in Keras, fit's validation runs the callbacks' on_test_* hooks, once per epoch.
TEST(Fit, ValidationCallsTheCallbacksTestHooks) {
  const Blobs train = make_blobs(96, 3, 1), test = make_blobs(80, 3, 2);
  auto model = small_model(3);
  struct Hooks : train::Callback {
    int begins = 0, batches = 0, ends = 0;
    double last_loss = -1;
    void on_test_begin(const nn::Logs&) override { ++begins; }
    void on_test_batch_end(int64_t, const nn::Logs&) override { ++batches; }
    void on_test_end(const nn::Logs& logs) override {
      ++ends;
      last_loss = logs.at("loss");
    }
  };
  auto hooks = std::make_shared<Hooks>();
  const train::History h = model->fit(train.x, train.y,
                                      {.epochs = 2,
                                       .batch_size = 32,
                                       .validation_data = std::make_pair(test.x, test.y),
                                       .seed = 4,
                                       .verbose = 0,
                                       .callbacks = {hooks}});
  EXPECT_EQ(hooks->begins, 2);
  EXPECT_EQ(hooks->batches, 2 * 3);  // 80 rows in batches of 32
  EXPECT_EQ(hooks->ends, 2);
  EXPECT_EQ(hooks->last_loss, h.last("val_loss"));
}

// An epoch that ends again (a survivor's rollback over an epoch's end) replaces its entry and the
// later ones; keys missing from some epochs stay aligned with their own epochs.
TEST(Fit, HistoryReplacesAnEpochThatEndsAgain) {
  train::History h;
  h.on_epoch_end(0, {{"loss", 3.0}});
  h.on_epoch_end(1, {{"loss", 2.0}, {"val_loss", 2.5}});
  h.on_epoch_end(2, {{"loss", 1.0}, {"val_loss", 1.5}});
  h.on_epoch_end(1, {{"loss", 2.0}, {"val_loss", 2.5}});
  EXPECT_EQ(h.epochs(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(h.history().at("loss"), (std::vector<double>{3.0, 2.0}));
  EXPECT_EQ(h.history().at("val_loss"), (std::vector<double>{2.5}));
  h.on_epoch_end(2, {{"loss", 1.0}, {"val_loss", 1.5}});
  EXPECT_EQ(h.epochs(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(h.history().at("loss"), (std::vector<double>{3.0, 2.0, 1.0}));
  EXPECT_EQ(h.last("val_loss"), 1.5);
  h.on_epoch_end(0, {{"loss", 4.0}});
  EXPECT_EQ(h.epochs(), (std::vector<int64_t>{0}));
  EXPECT_EQ(h.history().count("val_loss"), 0u);
  EXPECT_EQ(h.last("loss"), 4.0);
}

TEST(Fit, SameSeedGivesBitwiseIdenticalWeights) {
  const Blobs train = make_blobs(500, 3, 5);
  auto run = [&] {
    set_random_seed(42);
    nn::clear_session();
    Sequential m(
        {Dense(16, {.activation = "relu", .input_shape = Shape{8}}), nn::Dropout(0.2f), Dense(3)});
    m.compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy"});
    m.fit(train.x, train.y, {.epochs = 2, .batch_size = 16, .verbose = 0});
    std::vector<Tensor> w;
    for (Variable* v : m.weights()) w.push_back(v->tensor().clone());
    return w;
  };
  const auto a = run(), b = run();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equals(b[i])) << "weight " << i;
}

TEST(Fit, EvaluateAveragesOverExamplesNotBatches) {
  const Blobs d = make_blobs(100, 3, 6);
  auto model = small_model(7);
  // 100 = 64 + 36: a batch-weighted mean differs from the per-example mean unless weighted.
  const double by64 = model->evaluate(d.x, d.y, {.batch_size = 64}).at("loss");
  const double by100 = model->evaluate(d.x, d.y, {.batch_size = 100}).at("loss");
  EXPECT_NEAR(by64, by100, 1e-6);
}

TEST(Fit, PredictConcatenatesBatches) {
  const Blobs d = make_blobs(70, 3, 8);
  auto model = small_model(9);
  const Tensor p = model->predict(d.x, {.batch_size = 32});
  ASSERT_EQ(p.shape(), (Shape{70, 3}));
  const Tensor direct = (*model)(d.x);
  for (int64_t i = 0; i < p.num_elements(); ++i) {
    EXPECT_NEAR(p.data<float>()[i], direct.data<float>()[i], 1e-5);
  }
}

TEST(Fit, StepsPerEpochInitialEpochAndCallbacks) {
  const Blobs d = make_blobs(320, 3, 10);
  auto model = small_model(11);
  int batches = 0, epochs_begun = 0;
  auto counter = std::make_shared<train::LambdaCallback>(train::LambdaCallbackOptions{
      .on_epoch_begin = [&](int64_t, const nn::Logs&) { ++epochs_begun; },
      .on_batch_end = [&](int64_t, const nn::Logs&) { ++batches; }});
  const auto ds = data::Dataset::from_tensor_slices({d.x, d.y}).batch(32).repeat();
  const auto h = model->fit(ds, {.epochs = 4,
                                 .steps_per_epoch = 3,
                                 .initial_epoch = 1,
                                 .verbose = 0,
                                 .callbacks = {counter}});
  EXPECT_EQ(epochs_begun, 3);
  EXPECT_EQ(batches, 9);
  EXPECT_EQ(h.epochs(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(model->optimizer()->iterations(), 9);
}

TEST(Fit, EarlyStoppingStopsWhenTheMonitorStalls) {
  const Blobs d = make_blobs(200, 3, 12);
  auto model = small_model(13);
  model->compile(
      {.optimizer = std::make_shared<optim::SGD>(optim::SGDOptions{.learning_rate = 0.0f}),
       .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
  auto stop = std::make_shared<train::EarlyStopping>(
      train::EarlyStoppingOptions{.monitor = "loss", .min_delta = 1e-6, .patience = 2});
  const auto h = model->fit(d.x, d.y, {.epochs = 20, .verbose = 0, .callbacks = {stop}});
  EXPECT_EQ(h.epochs().size(), 3u);  // no improvement is possible with lr = 0
  EXPECT_EQ(stop->stopped_epoch(), 2);
}

TEST(Fit, TerminateOnNaNStopsTraining) {
  Blobs d = make_blobs(128, 3, 14);
  d.x.data<float>()[5 * 8] = NAN;  // poisons the first batch's loss
  auto model = small_model(15);
  int batches = 0;
  auto counter = std::make_shared<train::LambdaCallback>(
      train::LambdaCallbackOptions{.on_batch_end = [&](int64_t, const nn::Logs&) { ++batches; }});
  model->fit(d.x, d.y,
             {.epochs = 3,
              .batch_size = 32,
              .shuffle = false,
              .verbose = 0,
              .callbacks = {std::make_shared<train::TerminateOnNaN>(), counter}});
  EXPECT_EQ(batches, 1);
}

TEST(Fit, ErrorsNameTheProblem) {
  const Blobs d = make_blobs(64, 3, 16);
  Sequential uncompiled({Dense(3, {.input_shape = Shape{8}})});
  EXPECT_THROW(uncompiled.fit(d.x, d.y, {.verbose = 0}), FailedPreconditionError);
  auto model = small_model(17);
  const Tensor wrong = Tensor::zeros(Shape{64, 7});
  try {
    model->fit(wrong, d.y, {.verbose = 0});
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("7"), std::string::npos) << e.what();
  }
  Tensor bad_labels = Tensor::from_vector<int64_t>(std::vector<int64_t>(64, 5), Shape{64});
  try {
    model->fit(d.x, bad_labels, {.verbose = 0});
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("label 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model->compile({.optimizer = "adamax", .loss = "mse"}), InvalidArgumentError);
  EXPECT_THROW(model->compile({.optimizer = "adam", .loss = "hinge_ish"}), InvalidArgumentError);
}

// Under MirroredStrategy(2) the replica threads sum the gradients and apply the update on halves
// of every variable: with skip_nonfinite the update runs after the finiteness check (a second
// parallel phase) instead of fused with the sum; both give the same bits, and the weights match
// one replica on the same global batches.
TEST(Fit, MirroredReplicasSplitTheUpdateAndMatchOneReplica) {
  const Blobs train = make_blobs(640, 3, 21);
  auto run = [&](int replicas, bool skip_nonfinite) {
    distribute::MirroredStrategy strategy(replicas);
    auto scope = strategy.scope();
    nn::clear_session();
    auto m = small_model(22);
    m->fit(train.x, train.y,
           {.epochs = 2,
            .batch_size = 64,
            .seed = 23,
            .verbose = 0,
            .skip_nonfinite = skip_nonfinite});
    std::vector<Tensor> w;
    for (Variable* v : m->weights()) w.push_back(v->tensor().clone());
    for (Variable* v : m->optimizer()->variables()) w.push_back(v->tensor().clone());
    return w;
  };
  const auto fused = run(2, false), phased = run(2, true), one = run(1, false);
  ASSERT_EQ(fused.size(), phased.size());
  ASSERT_EQ(fused.size(), one.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_TRUE(fused[i].equals(phased[i])) << "variable " << i;
    if (fused[i].dtype() != DType::kFloat32) {
      EXPECT_TRUE(fused[i].equals(one[i])) << "variable " << i;  // the iteration counter
      continue;
    }
    const float* a = fused[i].data<float>();
    const float* b = one[i].data<float>();
    for (int64_t k = 0; k < fused[i].num_elements(); ++k) {
      ASSERT_NEAR(a[k], b[k], 1e-4f) << "variable " << i << " element " << k;
    }
  }
}

// A loss that is +inf while its gradient is finite (zero): only a check of the loss itself can
// tell that the step went bad.
class InfiniteLoss : public nn::Loss {
 public:
  Tensor operator()(const Tensor&, const Tensor& y_pred) const override {
    return scale(reduce_mean(y_pred), 0.0f, std::numeric_limits<float>::infinity());
  }
  std::string name() const override { return "infinite"; }
  nn::LossConfig get_config() const override { return {.class_name = "Infinite", .name = name()}; }
};

// One non-finite rule for every step: with skip_nonfinite a non-finite loss skips the update
// (the optimizer's iteration count does not move) on one device and under MirroredStrategy.
TEST(Fit, SkipNonfiniteChecksTheLossOnEveryStrategy) {
  const Blobs train = make_blobs(128, 3, 31);
  for (int replicas : {0, 1, 2}) {
    std::optional<distribute::MirroredStrategy> strategy;
    std::optional<distribute::Strategy::ScopeGuard> scope;
    if (replicas > 0) {
      strategy.emplace(replicas);
      scope.emplace(&*strategy);
    }
    nn::clear_session();
    Sequential m({Dense(4, {.seed = 3, .input_shape = Shape{8}}), Dense(3, {.seed = 4})});
    m.compile({.optimizer = "adam", .loss = std::make_shared<InfiniteLoss>()});
    m.build(Shape{8});
    std::vector<Tensor> before;
    for (Variable* v : m.weights()) before.push_back(v->tensor().clone());
    m.fit(train.x, train.y,
          {.epochs = 1, .batch_size = 32, .seed = 1, .verbose = 0, .skip_nonfinite = true});
    EXPECT_EQ(m.optimizer()->iterations(), 0) << replicas << " replicas";
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(m.weights()[i]->tensor().equals(before[i])) << replicas << " replicas, " << i;
    }
  }
}

// Dropout under MirroredStrategy(2): each replica draws from its own stream, so runs with one
// seed are bitwise identical however the replica threads interleave.
TEST(Fit, MirroredDropoutIsReproducible) {
  const Blobs train = make_blobs(64 * 30, 3, 24);
  auto run = [&] {
    distribute::MirroredStrategy strategy(2);
    auto scope = strategy.scope();
    set_random_seed(25);
    nn::clear_session();
    Sequential m(
        {Dense(16, {.activation = "relu", .input_shape = Shape{8}}), nn::Dropout(0.5f), Dense(3)});
    m.compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy"});
    m.fit(train.x, train.y, {.epochs = 3, .batch_size = 64, .seed = 26, .verbose = 0});
    std::vector<Tensor> w;
    for (Variable* v : m.weights()) w.push_back(v->tensor().clone());
    return w;
  };
  const auto first = run();
  for (int again = 0; again < 3; ++again) {
    const auto w = run();
    ASSERT_EQ(w.size(), first.size());
    for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(w[i].equals(first[i])) << "weight " << i;
  }
}

TEST(Fit, TrainingStepsDoNotAllocateInSteadyState) {
  const Blobs d = make_blobs(64 * 40, 3, 18);
  auto model = small_model(19);
  long at_batch_10 = 0, at_batch_35 = 0;
  uint64_t sys_at_10 = 0, sys_at_35 = 0;
  auto probe = std::make_shared<train::LambdaCallback>(
      train::LambdaCallbackOptions{.on_batch_end = [&](int64_t b, const nn::Logs&) {
        if (b == 10) {
          at_batch_10 = testutil::new_calls();
          sys_at_10 = allocator_stats().system_allocations;
        }
        if (b == 35) {
          at_batch_35 = testutil::new_calls();
          sys_at_35 = allocator_stats().system_allocations;
        }
      }});
  model->fit(d.x, d.y, {.epochs = 1, .batch_size = 64, .verbose = 0, .callbacks = {probe}});
  EXPECT_EQ(at_batch_35 - at_batch_10, 0) << "operator new calls in 25 training steps";
  EXPECT_EQ(sys_at_35, sys_at_10) << "tensor buffers taken from the system in 25 steps";
}

// The same under MirroredStrategy(2): replica threads allocate and free tensors concurrently.
TEST(Fit, MirroredTrainingStepsDoNotAllocateInSteadyState) {
  const Blobs d = make_blobs(64 * 40, 3, 27);
  distribute::MirroredStrategy strategy(2);
  auto scope = strategy.scope();
  auto model = small_model(28);
  long at_batch_10 = 0, at_batch_35 = 0;
  auto probe = std::make_shared<train::LambdaCallback>(
      train::LambdaCallbackOptions{.on_batch_end = [&](int64_t b, const nn::Logs&) {
        if (b == 10) at_batch_10 = testutil::new_calls();
        if (b == 35) at_batch_35 = testutil::new_calls();
      }});
  model->fit(d.x, d.y, {.epochs = 1, .batch_size = 64, .verbose = 0, .callbacks = {probe}});
  EXPECT_EQ(at_batch_35 - at_batch_10, 0) << "operator new calls in 25 mirrored training steps";
}

}  // namespace
}  // namespace dtrain
