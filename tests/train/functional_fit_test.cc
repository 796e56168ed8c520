// Functional models in the training loop: fit/evaluate/predict like Sequential, TF2 checkpoint
// keys equal to the equivalent Sequential's, .h5 save/load with the Functional model_config,
// and the clear refusal to fit a model with several inputs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/random.h"
#include "dtrain/nn/functional.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/losses.h"
#include "dtrain/nn/merging.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/saving.h"
#include "dtrain/train/training.h"
#include "testutil/expect_throws.h"
#include "testutil/temp_dir.h"

namespace dtrain::train {
namespace {

using nlohmann::json;
using nn::Dense;
using nn::Functional;
using nn::KerasTensor;
namespace ck = dtrain::checkpoint;

struct Blobs {
  Tensor x, y;
};

// Three Gaussian blobs in 8 dimensions.
Blobs make_blobs(int64_t n, uint64_t seed) {
  Philox rng(seed);
  Tensor x(Shape{n, 8}), y(Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(i % 3);
    y.data<float>()[i] = static_cast<float>(c);
    for (int d = 0; d < 8; ++d) {
      x.data<float>()[i * 8 + d] = (d % 3 == c ? 2.0f : 0.0f) + 0.5f * rng.normal();
    }
  }
  return {x, y};
}

void compile(nn::Model& m) {
  m.compile({.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.01f}),
             .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
             .metrics = {"accuracy"}});
}

// input → dense(16, relu) → dense_1(16, relu); add(dense, dense_1) → dense_2(3).
std::unique_ptr<Functional> residual(uint64_t seed) {
  KerasTensor x = nn::Input(Shape{8});
  KerasTensor h = nn::call(Dense(16, {.activation = "relu", .seed = seed}), x);
  KerasTensor y = nn::call(Dense(16, {.activation = "relu", .seed = seed + 1}), h);
  KerasTensor s = nn::call(nn::Add(), {h, y});
  return std::make_unique<Functional>(
      std::vector<KerasTensor>{x},
      std::vector<KerasTensor>{nn::call(Dense(3, {.seed = seed + 2}), s)},
      nn::FunctionalOptions{.name = "resnet"});
}

class FunctionalFitTest : public ::testing::Test {
 protected:
  void SetUp() override { nn::clear_session(); }
};

TEST_F(FunctionalFitTest, ResidualModelLearnsWithFitEvaluateAndPredict) {
  const Blobs train = make_blobs(600, 1), test = make_blobs(200, 2);
  auto model = residual(3);
  compile(*model);
  const History h =
      model->fit(train.x, train.y, {.epochs = 4, .batch_size = 32, .seed = 5, .verbose = 0});
  const auto& loss = h.history().at("loss");
  ASSERT_EQ(loss.size(), 4u);
  EXPECT_LT(loss.back(), loss.front());
  const nn::Logs logs = model->evaluate(test.x, test.y, {.batch_size = 50, .verbose = 0});
  EXPECT_GT(logs.at("accuracy"), 0.9);
  const Tensor p = model->predict(test.x, {.batch_size = 64});
  EXPECT_EQ(p.shape(), (Shape{200, 3}));
  const Tensor direct = (*model)(test.x);
  for (int64_t i = 0; i < p.num_elements(); ++i) {
    EXPECT_NEAR(p.data<float>()[i], direct.data<float>()[i], 1e-5);
  }
}

TEST_F(FunctionalFitTest, CheckpointKeysEqualTheEquivalentSequentials) {
  const Blobs train = make_blobs(64, 1);
  auto functional = residual(3);
  nn::Sequential sequential({Dense(16, {.activation = "relu", .input_shape = Shape{8}}),
                             Dense(16, {.activation = "relu"}), Dense(3)});
  compile(*functional);
  compile(sequential);
  functional->fit(train.x, train.y, {.epochs = 1, .batch_size = 32, .verbose = 0});
  sequential.fit(train.x, train.y, {.epochs = 1, .batch_size = 32, .verbose = 0});
  ck::Checkpoint a({{"model", *functional}, {"optimizer", *functional->optimizer()}});
  ck::Checkpoint b({{"model", sequential}, {"optimizer", *sequential.optimizer()}});
  const std::vector<std::string> keys = a.keys();
  EXPECT_EQ(keys, b.keys());
  // Including the slot variables, under layer_with_weights-<j> (the InputLayer and the Add
  // hold no weights).
  EXPECT_NE(std::find(keys.begin(), keys.end(),
                      "model/layer_with_weights-2/kernel/.OPTIMIZER_SLOT/optimizer/m/"
                      ".ATTRIBUTES/VARIABLE_VALUE"),
            keys.end());
}

TEST_F(FunctionalFitTest, ObjectGraphNumbersTheInputLayerAsKerasDoes) {
  // Keras's Functional.layers lists the InputLayer first, so it is layer-0 and the first Dense
  // layer-1 (Sequential's layers skip it: there the first Dense is layer-0). A checkpoint read
  // back by object path therefore finds the Dense under both names.
  testutil::TempDir dir;
  auto model = residual(3);
  ck::Checkpoint(*model).write(dir.file("ckpt"));
  const ck::BundleReader reader(dir.file("ckpt"));
  ASSERT_TRUE(reader.contains("_CHECKPOINTABLE_OBJECT_GRAPH"));
  const std::string graph = reader.read_strings("_CHECKPOINTABLE_OBJECT_GRAPH").at(0);
  for (const char* name :
       {"layer-0", "layer-1", "layer-4", "layer_with_weights-0", "layer_with_weights-2"}) {
    EXPECT_NE(graph.find(name), std::string::npos) << name;
  }
  EXPECT_EQ(graph.find("layer-5"), std::string::npos);
}

TEST_F(FunctionalFitTest, SavesAndLoadsH5WithTheFunctionalConfig) {
  testutil::TempDir dir;
  const Blobs train = make_blobs(96, 1);
  auto model = residual(3);
  compile(*model);
  model->fit(train.x, train.y, {.epochs = 1, .batch_size = 32, .verbose = 0});
  model->save(dir.file("m.h5"));
  const ck::KerasH5Contents c = ck::read_keras_h5(dir.file("m.h5"));
  EXPECT_EQ(json::parse(c.model_config)["class_name"], "Functional");
  // Keras 2 writes a group for every layer of model.layers, the InputLayer's empty.
  ASSERT_EQ(c.layers.size(), 5u);
  EXPECT_EQ(c.layers[0].name, "input_1");
  EXPECT_TRUE(c.layers[0].weights.empty());
  EXPECT_EQ(c.layers[3].name, "add");
  ASSERT_EQ(c.layers[4].weights.size(), 2u);
  EXPECT_EQ(c.layers[4].weights[0].name, "dense_2/kernel:0");

  auto loaded = load_model(dir.file("m.h5"));
  ASSERT_NE(dynamic_cast<Functional*>(loaded.get()), nullptr);
  EXPECT_EQ(loaded->to_json(), model->to_json());
  const Tensor want = (*model)(train.x), got = (*loaded)(train.x);
  EXPECT_TRUE(want.equals(got));
  // The optimizer state came along: one more epoch gives the same weights on both.
  model->fit(train.x, train.y, {.epochs = 1, .batch_size = 32, .shuffle = false, .verbose = 0});
  loaded->fit(train.x, train.y, {.epochs = 1, .batch_size = 32, .shuffle = false, .verbose = 0});
  const auto va = model->weights(), vb = loaded->weights();
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) EXPECT_TRUE(va[i]->tensor().equals(vb[i]->tensor()));
}

TEST_F(FunctionalFitTest, FitRefusesSeveralInputs) {
  KerasTensor a = nn::Input(Shape{4});
  KerasTensor b = nn::Input(Shape{4});
  Functional model({a, b}, {nn::call(Dense(1), nn::call(nn::Add(), {a, b}))},
                   {.name = "two_inputs"});
  compile(model);
  testutil::expect_throws_with<UnimplementedError>(
      [&] {
        model.fit(Tensor::zeros(Shape{4, 4}), Tensor::zeros(Shape{4}), {.verbose = 0});
      },
      {"fit", "'two_inputs'", "2 inputs"});
}

}  // namespace
}  // namespace dtrain::train
