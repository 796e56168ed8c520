// Functional models in Keras 3 files: a residual CNN (Conv2D, BatchNormalization, ReLU, Add,
// GlobalAveragePooling2D, Dense) saved as .keras and as a Keras 3 .h5 loads back with the same
// weights, moving statistics, optimizer state and predictions, and its next epoch equals the
// original's bit for bit. The layout is judged by h5py (keras3_functional_check.py), never by
// dtrain: the fixture's CNN rebuilt as a Functional chain must give the real Keras 3.10 file's
// tree plus what Keras 3 adds for a Functional model; the residual CNN must follow Keras 3's
// rules for BatchNormalization and Add.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/checkpoint/keras_v3.h"
#include "dtrain/core/random.h"
#include "dtrain/nn/activations.h"
#include "dtrain/nn/convolutional.h"
#include "dtrain/nn/functional.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/losses.h"
#include "dtrain/nn/merging.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/nn/pooling.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/saving.h"
#include "dtrain/train/training.h"
#include "testutil/expect_throws.h"
#include "testutil/h5py.h"
#include "testutil/run_dtrain.h"
#include "testutil/temp_dir.h"

namespace dtrain::train {
namespace {

using dtrain::testutil::run_shell;
using dtrain::testutil::TempDir;
using nlohmann::json;
using nn::KerasTensor;
namespace ck = dtrain::checkpoint;

const std::string kChecker = "tests/train/keras3_functional_check.py";
const std::string kKeras3Zip = "../shared/fixtures/keras3/fashion_cnn_keras310.keras";

// input (8, 8, 3) → conv → bn → relu → [conv → bn → relu → conv → bn] + skip → relu → GAP →
// dense(3).
std::unique_ptr<nn::Functional> residual_cnn(uint64_t seed, bool sync = false) {
  KerasTensor x = nn::Input(Shape{8, 8, 3}, {.name = "input_layer"});
  auto conv = [&](const KerasTensor& t, uint64_t s) {
    return nn::call(nn::Conv2D(8, {3, 3}, {.padding = "same", .use_bias = false, .seed = s}), t);
  };
  auto bn = [&](const KerasTensor& t) {
    return nn::call(nn::BatchNormalization({.synchronized = sync}), t);
  };
  KerasTensor h = nn::call(nn::ReLU(), bn(conv(x, seed)));
  KerasTensor r = nn::call(nn::ReLU(), bn(conv(h, seed + 1)));
  r = bn(conv(r, seed + 2));
  KerasTensor s = nn::call(nn::ReLU(), nn::call(nn::Add(), {h, r}));
  KerasTensor y =
      nn::call(nn::Dense(3, {.seed = seed + 3}), nn::call(nn::GlobalAveragePooling2D(), s));
  return std::make_unique<nn::Functional>(std::vector<KerasTensor>{x}, std::vector<KerasTensor>{y},
                                          nn::FunctionalOptions{.name = "functional"});
}

struct Data {
  Tensor x, y;
};

Data make_data(int64_t n) {
  Philox rng(5);
  Tensor x(Shape{n, 8, 8, 3}), y(Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(i % 3);
    y.data<float>()[i] = static_cast<float>(c);
    for (int64_t k = 0; k < 192; ++k) {
      x.data<float>()[i * 192 + k] = (k % 3 == c ? 1.0f : 0.0f) + 0.5f * rng.normal();
    }
  }
  return {x, y};
}

void compile(nn::Model& m) {
  m.compile({.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.01}),
             .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
             .metrics = {"accuracy"}});
}

History fit_epochs(nn::Model& m, const Data& d, int64_t epochs, int64_t initial_epoch) {
  return m.fit(d.x, d.y,
               {.epochs = epochs,
                .batch_size = 16,
                .initial_epoch = initial_epoch,
                .seed = 7,
                .verbose = 0});
}

void expect_same_state(nn::Model& a, nn::Model& b) {
  const auto wa = a.weights();
  const auto wb = b.weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i]->name(), wb[i]->name());
    EXPECT_TRUE(wa[i]->tensor().equals(wb[i]->tensor())) << wa[i]->name();
  }
  ASSERT_NE(b.optimizer(), nullptr);
  EXPECT_EQ(a.optimizer()->iterations(), b.optimizer()->iterations());
  const auto va = a.trainable_variables();
  const auto vb = b.trainable_variables();
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) {
    for (const std::string& s : a.optimizer()->slot_names()) {
      Variable* sb = b.optimizer()->slot(*vb[i], s);
      ASSERT_NE(sb, nullptr) << vb[i]->name() << " " << s;
      EXPECT_TRUE(a.optimizer()->slot(*va[i], s)->tensor().equals(sb->tensor())) << sb->name();
    }
  }
}

class Keras3FunctionalRoundTrip : public ::testing::TestWithParam<SaveFormat> {
 protected:
  void SetUp() override { nn::clear_session(); }
};

TEST_P(Keras3FunctionalRoundTrip, ResidualCnnLoadsBitwiseAndFitContinuesExactly) {
  set_random_seed(11);
  TempDir dir;
  const Data d = make_data(96);
  auto a = residual_cnn(21);
  compile(*a);
  fit_epochs(*a, d, 2, 0);
  const std::string path =
      dir.file(GetParam() == SaveFormat::kKeras3Zip ? "resnet.keras" : "resnet.h5");
  save_model(*a, path, {.format = GetParam()});

  std::unique_ptr<nn::Model> b = load_model(path);
  ASSERT_TRUE(b->compiled());
  EXPECT_EQ(b->class_name(), "Functional");
  EXPECT_EQ(b->name(), "functional");
  ASSERT_EQ(b->layers().size(), a->layers().size());
  for (size_t i = 0; i < a->layers().size(); ++i) {
    EXPECT_EQ(b->layers()[i]->name(), a->layers()[i]->name());
  }
  expect_same_state(*a, *b);
  EXPECT_EQ(b->optimizer()->iterations(), 12);  // 2 epochs x 6 batches
  // Inference uses the restored moving statistics.
  const PredictOptions p{.batch_size = 32};
  EXPECT_TRUE(a->predict(d.x, p).equals(b->predict(d.x, p)));
  const History ha = fit_epochs(*a, d, 3, 2);
  const History hb = fit_epochs(*b, d, 3, 2);
  EXPECT_EQ(ha.history().at("loss"), hb.history().at("loss"));
  expect_same_state(*a, *b);
  EXPECT_TRUE(a->predict(d.x, p).equals(b->predict(d.x, p)));
}

INSTANTIATE_TEST_SUITE_P(Formats, Keras3FunctionalRoundTrip,
                         ::testing::Values(SaveFormat::kKeras3Zip, SaveFormat::kKeras3H5),
                         [](const auto& info) {
                           return info.param == SaveFormat::kKeras3Zip ? std::string("Keras")
                                                                       : std::string("H5");
                         });

// The Keras 3 .h5 of a Functional model names its weights "<layer>/<weight>" (no model scope,
// unlike a Sequential's) and so its optimizer variables "adam/<layer>_<weight>_momentum".
TEST(Keras3Functional, TheH5NamesWeightsWithoutTheModelScope) {
  nn::clear_session();
  TempDir dir;
  auto m = residual_cnn(3);
  compile(*m);
  fit_epochs(*m, make_data(16), 1, 0);
  save_model(*m, dir.file("m.h5"), {.format = SaveFormat::kKeras3H5});
  const ck::KerasH5Contents c = ck::read_keras_h5(dir.file("m.h5"));
  const json config = json::parse(c.model_config);
  EXPECT_EQ(config["class_name"], "Functional");
  EXPECT_FALSE(config.contains("module"));  // the legacy dialect
  bool found = false;
  for (const auto& l : c.layers) {
    if (l.name != "batch_normalization") continue;
    found = true;
    ASSERT_EQ(l.weights.size(), 4u);
    EXPECT_EQ(l.weights[0].name, "batch_normalization/gamma");
    EXPECT_EQ(l.weights[3].name, "batch_normalization/moving_variance");
  }
  EXPECT_TRUE(found);
  ASSERT_FALSE(c.optimizer_weights.empty());
  EXPECT_EQ(c.optimizer_weights[0].name, "adam/iteration");
  EXPECT_EQ(c.optimizer_weights[2].name, "adam/conv2d_kernel_momentum");
}

// A file whose Conv2D kernel does not match its config (kernel_size 3 edited to 1; same
// padding keeps every other shape): the error names the file, the layer and both shapes, for
// .keras and for both .h5 dialects.
TEST(Keras3Functional, AConvKernelThatDoesNotMatchTheConfigNamesTheLayer) {
  nn::clear_session();
  TempDir dir;
  auto m = residual_cnn(4);
  for (const auto& [file, format] :
       std::vector<std::pair<std::string, SaveFormat>>{{"m.keras", SaveFormat::kKeras3Zip},
                                                       {"k3.h5", SaveFormat::kKeras3H5},
                                                       {"k2.h5", SaveFormat::kKeras2H5}}) {
    save_model(*m, dir.file(file), {.format = format});
    const std::string bad = dir.file("bad_" + file);
    if (format == SaveFormat::kKeras3Zip) {
      ck::KerasV3Contents c = ck::read_keras_v3(dir.file(file));
      json config = json::parse(c.config_json);
      config["config"]["layers"][1]["config"]["kernel_size"] = {1, 1};  // [0]: the InputLayer
      c.config_json = config.dump();
      ck::write_keras_v3(bad, c);
    } else {
      ck::KerasH5Contents c = ck::read_keras_h5(dir.file(file));
      json config = json::parse(c.model_config);
      config["config"]["layers"][1]["config"]["kernel_size"] = {1, 1};
      c.model_config = config.dump();
      ck::write_keras_h5(bad, c);
    }
    const std::string msg =
        testutil::expect_throws<InvalidArgumentError>([&] { (void)load_model(bad); });
    for (const std::string& want :
         {bad, std::string("conv2d"), std::string("[3, 3, 3, 8]"), std::string("[1, 1, 3, 8]")}) {
      EXPECT_NE(msg.find(want), std::string::npos) << file << ": " << msg;
    }
  }
}

TEST(Keras3Functional, TheFixturesCnnAsAFunctionalChainHasKeras3sLayout) {
  DTRAIN_REQUIRE_H5PY();
  nn::clear_session();
  TempDir dir;
  KerasTensor x = nn::Input(Shape{28, 28, 1}, {.name = "input_layer"});
  KerasTensor h = nn::call(nn::Conv2D(32, {3, 3}, {.activation = "relu", .name = "conv2d"}), x);
  h = nn::call(nn::MaxPooling2D({.name = "max_pooling2d"}), h);
  h = nn::call(nn::Conv2D(64, {3, 3}, {.activation = "relu", .name = "conv2d_1"}), h);
  h = nn::call(nn::MaxPooling2D({.name = "max_pooling2d_1"}), h);
  h = nn::call(nn::Flatten({.name = "flatten"}), h);
  h = nn::call(nn::Dropout(0.5, {.name = "dropout"}), h);
  h = nn::call(nn::Dense(64, {.activation = "relu", .name = "dense"}), h);
  h = nn::call(nn::Dense(10, {.activation = "softmax", .name = "dense_1"}), h);
  nn::Functional m({x}, {h}, {.name = "functional"});
  m.compile({.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 1e-3}),
             .loss = "sparse_categorical_crossentropy",
             .metrics = {"accuracy"}});
  const Tensor xs = Tensor::from_vector(std::vector<float>(4 * 784, 0.5f), Shape{4, 28, 28, 1});
  const Tensor ys = Tensor::from_vector(std::vector<float>{0, 1, 2, 3}, Shape{4});
  m.fit(xs, ys, {.epochs = 1, .batch_size = 4, .verbose = 0});
  m.save(dir.file("chain.keras"));
  const auto r = run_shell("/usr/bin/python3 " + kChecker + " chain " + kKeras3Zip + " " +
                           dir.file("chain.keras") + " 2>&1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("0 differences"), std::string::npos) << r.output;
}

TEST(Keras3Functional, TheResidualCnnFollowsKeras3sRulesForBatchNormAndAdd) {
  DTRAIN_REQUIRE_H5PY();
  for (const bool sync : {false, true}) {
    nn::clear_session();
    TempDir dir;
    auto m = residual_cnn(9, sync);
    compile(*m);
    fit_epochs(*m, make_data(16), 1, 0);
    m->save(dir.file("resnet.keras"));
    const auto r = run_shell("/usr/bin/python3 " + kChecker + " residual " +
                             dir.file("resnet.keras") + " 2>&1");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("0 differences"), std::string::npos) << r.output;
    // SyncBatchNormalization is Keras 3's BatchNormalization(synchronized=True), and loads back
    // synchronized.
    const json config = json::parse(ck::read_keras_v3(dir.file("resnet.keras")).config_json);
    EXPECT_EQ(config["config"]["layers"][2]["class_name"], "BatchNormalization");
    EXPECT_EQ(config["config"]["layers"][2]["config"]["synchronized"], sync);
    std::unique_ptr<nn::Model> back = load_model(dir.file("resnet.keras"));
    EXPECT_EQ(back->layers()[2]->class_name(),
              sync ? "SyncBatchNormalization" : "BatchNormalization");
  }
}

// The checker can fail: a Sequential archive is not a Functional one.
TEST(Keras3Functional, TheCheckerTellsASequentialArchiveApart) {
  DTRAIN_REQUIRE_H5PY();
  const auto r = run_shell("/usr/bin/python3 " + kChecker + " chain " + kKeras3Zip + " " +
                           kKeras3Zip + " 2>&1");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("keras.src.models.functional"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("layers/input_layer/vars"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dtrain::train
