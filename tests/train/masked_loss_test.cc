// Losses and metrics weight by the output's Keras mask (nn/output_mask.h): a timestep-wise
// tagger after Embedding(mask_zero=true) gives the loss Σ loss · mask / valid (Keras 3's
// apply_mask and reduce_weighted_values; Keras 2.12 agrees) and the accuracy
// Σ match · mask / Σ mask. Golden values, gradients and the weights after one SGD step from
// explicit PyTorch math (tools/golden/gen_masked_loss_golden.py); a finite-difference gradient
// check through the masked loss; fit and evaluate (one device and MirroredStrategy) pick the mask
// up; masks and weights of the wrong shape are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/distribute/mirrored_strategy.h"
#include "dtrain/nn/embedding.h"
#include "dtrain/nn/functional.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/losses.h"
#include "dtrain/nn/metrics.h"
#include "dtrain/nn/model.h"
#include "dtrain/nn/output_mask.h"
#include "dtrain/optim/sgd.h"
#include "dtrain/train/training.h"
#include "testutil/expect_throws.h"
#include "testutil/golden.h"
#include "testutil/gradcheck.h"
#include "testutil/weights_gradcheck.h"

namespace dtrain::nn {
namespace {

using testutil::expect_close_to_golden;
using testutil::expect_throws_with;
using testutil::golden_file;
using testutil::golden_tensor;

const nlohmann::json& golden() { return golden_file("masked_loss_golden.json"); }

constexpr const char* kWeightNames[] = {"embedding", "dense1_kernel", "dense1_bias",
                                        "dense2_kernel", "dense2_bias"};

// Embedding(7, 4, mask_zero) → Dense(5, tanh) → Dense(7), with the golden weights.
std::unique_ptr<Sequential> tagger() {
  const auto& g = golden();
  const int64_t steps = golden_tensor(g.at("ids")).dim(1);
  auto m = std::make_unique<Sequential>();
  m->add_layer(Embedding(g.at("vocab").get<int64_t>(), g.at("embed_dim").get<int64_t>(),
                         {.mask_zero = true, .input_shape = Shape{steps}}));
  m->add_layer(Dense(g.at("hidden").get<int64_t>(), {.activation = "tanh"}));
  m->add_layer(Dense(g.at("vocab").get<int64_t>()));
  const std::vector<Variable*> w = m->weights();
  EXPECT_EQ(w.size(), 5u);
  for (size_t i = 0; i < w.size() && i < 5; ++i) {
    w[i]->tensor().copy_from(golden_tensor(g.at("weights").at(kWeightNames[i])));
  }
  return m;
}

SparseCategoricalCrossentropy loss_fn() {
  return SparseCategoricalCrossentropy({.from_logits = true});
}

TEST(MaskedLoss, LossAndAccuracyCountOnlyTheUnmaskedStepsAsKerasDoes) {
  const auto& g = golden();
  auto model = tagger();
  const Tensor ids = golden_tensor(g.at("ids"));
  const Tensor labels = golden_tensor(g.at("labels"));
  const auto [y_pred, mask] = call_with_output_mask(*model, ids, /*training=*/false);
  expect_close_to_golden(y_pred, g.at("logits"), "logits");
  ASSERT_TRUE(mask.defined()) << "the embedding's mask did not reach the output";
  expect_close_to_golden(mask, g.at("mask"), "mask");
  const auto loss = loss_fn();
  expect_close_to_golden(loss.per_sample(labels, y_pred), g.at("per_step_loss"), "per-step");
  const double masked = loss(labels, y_pred, mask).item();
  EXPECT_NEAR(masked, g.at("loss").get<double>(), 1e-6);
  EXPECT_NEAR(masked, g.at("keras_float32_loss").get<double>(), 1e-6);
  // Without the mask: the mean over every step, which differs.
  EXPECT_NEAR(loss(labels, y_pred).item(), g.at("unmasked_loss").get<double>(), 1e-6);
  EXPECT_GT(std::abs(g.at("loss").get<double>() - g.at("unmasked_loss").get<double>()), 1e-2);

  SparseCategoricalAccuracy acc;
  acc.update_state(labels, y_pred, mask);
  EXPECT_NEAR(acc.result(), g.at("accuracy").get<double>(), 1e-12);
  auto by_name = metric_from_name("accuracy", &loss);  // compile(metrics={"accuracy"})
  by_name->update_state(labels, y_pred, mask);
  EXPECT_NEAR(by_name->result(), g.at("accuracy").get<double>(), 1e-12);
  auto by_shape = metric_from_name("accuracy");  // resolved by shape on the first batch
  by_shape->update_state(labels, y_pred, mask);
  EXPECT_NEAR(by_shape->result(), g.at("accuracy").get<double>(), 1e-12);
  SparseCategoricalAccuracy plain;
  plain.update_state(labels, y_pred);
  EXPECT_NEAR(plain.result(), g.at("unmasked_accuracy").get<double>(), 1e-12);

  // A Functional model reports its output's mask too; a model whose output drops it, none.
  {
    KerasTensor in = Input(Shape{ids.dim(1)});
    KerasTensor h = call(Embedding(7, 2, {.mask_zero = true}), in);
    Functional f({in}, {call(Dense(3), h)});
    const auto [out, m] = call_with_output_mask(f, ids, /*training=*/false);
    EXPECT_EQ(out.shape(), (Shape{3, 5, 3}));
    ASSERT_TRUE(m.defined());
    expect_close_to_golden(m, g.at("mask"), "functional mask");
    Sequential pooled;
    pooled.add_layer(Embedding(7, 2, {.mask_zero = true, .input_shape = Shape{ids.dim(1)}}));
    pooled.add_layer(Flatten());
    EXPECT_FALSE(call_with_output_mask(pooled, ids, false).second.defined());
  }

  // A fully masked batch: 0 (Keras's divide_no_nan), not NaN.
  const Tensor none = Tensor::zeros(mask.shape());
  EXPECT_EQ(loss(labels, y_pred, none).item(), 0.0f);
}

TEST(MaskedLoss, GradientsThroughTheMaskedLossMatchTorchAndFiniteDifferences) {
  const auto& g = golden();
  auto model = tagger();
  const Tensor ids = golden_tensor(g.at("ids"));
  const Tensor labels = golden_tensor(g.at("labels"));
  const auto loss = loss_fn();
  std::vector<Tensor> grads;
  {
    GradientTape tape;
    const auto [y_pred, mask] = call_with_output_mask(*model, ids, /*training=*/true);
    grads = tape.gradient(loss(labels, y_pred, mask), model->trainable_weights());
  }
  ASSERT_EQ(grads.size(), 5u);
  for (size_t i = 0; i < grads.size(); ++i) {
    expect_close_to_golden(grads[i], g.at("gradients").at(kWeightNames[i]), kWeightNames[i]);
  }
  // The padding id's embedding row only meets masked steps: no gradient reaches it.
  for (int64_t j = 0; j < grads[0].dim(1); ++j) EXPECT_EQ(grads[0].data<float>()[j], 0.0f);

  const Tensor mask = golden_tensor(g.at("mask"));
  const Tensor logits = golden_tensor(g.at("logits"));
  EXPECT_LT(testutil::gradcheck(
                [&](const std::vector<Tensor>& v) { return loss(labels, v[0], mask); }, {logits}),
            1e-2);
  EXPECT_LT(testutil::weights_gradcheck(
                [&] {
                  const auto [y, m] = call_with_output_mask(*model, ids, /*training=*/true);
                  return loss(labels, y, m);
                },
                model->trainable_weights()),
            1e-2);
  // The other losses weight the same way (per-sample values of the mask's shape).
  const Tensor probs = softmax(logits);
  Tensor one_hot = Tensor::zeros(logits.shape());
  for (int64_t r = 0; r < labels.num_elements(); ++r) {
    one_hot.data<float>()[r * logits.dim(-1) + labels.data<int64_t>()[r]] = 1.0f;
  }
  const CategoricalCrossentropy cce;
  const MeanSquaredError mse;
  const BinaryCrossentropy bce;
  for (const Loss* l : std::vector<const Loss*>{&cce, &mse, &bce}) {
    SCOPED_TRACE(l->name());
    EXPECT_LT(
        testutil::gradcheck([&](const std::vector<Tensor>& v) { return (*l)(one_hot, v[0], mask); },
                            {probs}, 1e-3f),
        1e-2);
    // Σ per-sample · mask / valid.
    const Tensor per = l->per_sample(one_hot, probs);
    double sum = 0, valid = 0;
    for (int64_t i = 0; i < per.num_elements(); ++i) {
      sum += static_cast<double>(per.data<float>()[i]) * mask.data<float>()[i];
      valid += mask.data<float>()[i];
    }
    EXPECT_NEAR((*l)(one_hot, probs, mask).item(), sum / valid, 1e-6);
  }
}

void expect_trained_like_torch(Model& model) {
  const auto& g = golden();
  const std::vector<Variable*> w = model.weights();
  ASSERT_EQ(w.size(), 5u);
  for (size_t i = 0; i < w.size(); ++i) {
    expect_close_to_golden(w[i]->tensor(), g.at("weights_after_sgd_step").at(kWeightNames[i]),
                           kWeightNames[i]);
  }
}

TEST(MaskedLoss, FitAndEvaluateWeightByTheOutputMask) {
  const auto& g = golden();
  const Tensor ids = golden_tensor(g.at("ids"));
  const Tensor labels = golden_tensor(g.at("labels"));
  auto compile = [&](Model& m) {
    m.compile({.optimizer = std::make_shared<optim::SGD>(
                   optim::SGDOptions{.learning_rate = g.at("learning_rate").get<double>()}),
               .loss = loss_fn(),
               .metrics = {"accuracy"}});
  };
  {
    auto model = tagger();
    compile(*model);
    const Logs logs = model->evaluate(ids, labels, {.batch_size = 3, .verbose = 0});
    EXPECT_NEAR(logs.at("loss"), g.at("loss").get<double>(), 1e-6);
    EXPECT_NEAR(logs.at("accuracy"), g.at("accuracy").get<double>(), 1e-6);
    const train::History h =
        model->fit(ids, labels, {.epochs = 1, .batch_size = 3, .shuffle = false, .verbose = 0});
    EXPECT_NEAR(h.last("loss"), g.at("loss").get<double>(), 1e-6);
    EXPECT_NEAR(h.last("accuracy"), g.at("accuracy").get<double>(), 1e-6);
    expect_trained_like_torch(*model);
  }
  {
    // The replicated step (one replica: the whole batch).
    distribute::MirroredStrategy strategy(1);
    auto scope = strategy.scope();
    auto model = tagger();
    compile(*model);
    const train::History h =
        model->fit(ids, labels, {.epochs = 1, .batch_size = 3, .shuffle = false, .verbose = 0});
    EXPECT_NEAR(h.last("loss"), g.at("loss").get<double>(), 1e-6);
    EXPECT_NEAR(h.last("accuracy"), g.at("accuracy").get<double>(), 1e-6);
    expect_trained_like_torch(*model);
  }
}

TEST(MaskedLoss, RefusesMasksAndWeightsOfTheWrongShape) {
  const Tensor logits = testutil::random_tensor(Shape{2, 3, 4}, 5);
  const Tensor labels = Tensor::zeros(Shape{2, 3}, DType::kInt32);
  const auto loss = loss_fn();
  expect_throws_with<InvalidArgumentError>(
      [&] {
        loss(labels, logits, Tensor::ones(Shape{2, 4}));
      },
      {"sparse_categorical_crossentropy", "mask must have the per-sample losses' shape [2, 3]",
       "got [2, 4]"});
  SparseCategoricalAccuracy acc;
  expect_throws_with<InvalidArgumentError>(
      [&] {
        acc.update_state(labels, logits, Tensor::ones(Shape{3, 2}));
      },
      {"sparse_categorical_accuracy", "[2, 3]", "got [3, 2]"});
}

}  // namespace
}  // namespace dtrain::nn
