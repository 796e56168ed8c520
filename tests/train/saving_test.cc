// Model saving in Keras's HDF5 format: loading the real Keras 2.12 model, bitwise save/load
// round trips (weights, optimizer slots, iteration, configs), fit() continuing after load_model
// exactly as an uninterrupted run, and files in the older Keras layouts (written here with the
// HDF5 layer's h5py-2.x mode: fixed-length strings, no InputLayer, OptimizerV2 and Keras 2.2
// optimizer names), and the training configs they carry (clipping, unsupported losses, optimizer
// state that does not fit). save_weights, the errors and crash safety: saving_errors_test.cc.
#include "dtrain/train/saving.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/core/random.h"
#include "dtrain/nn/layers.h"
#include "dtrain/optim/adam.h"
#include "dtrain/optim/rmsprop.h"
#include "dtrain/optim/sgd.h"
#include "dtrain/train/training.h"
#include "testutil/expect_throws.h"
#include "testutil/keras_fixture.h"
#include "testutil/temp_dir.h"
#include "train/saving_fixture.h"

namespace dtrain::train {
namespace {

using dtrain::testutil::expect_throws;
using dtrain::testutil::read_bytes;
using dtrain::testutil::TempDir;
using dtrain::testutil::write_bytes;

namespace fs = std::filesystem;
namespace ck = dtrain::checkpoint;

using saving_fixture::BatchLosses;
using saving_fixture::compile_adam;
using saving_fixture::Data;
using saving_fixture::expect_same_optimizer_state;
using saving_fixture::expect_same_weights;
using saving_fixture::fit_epochs;
using saving_fixture::make_data;
using saving_fixture::make_model;
using saving_fixture::same_start;
using testutil::kKerasFixture;
using testutil::kKerasFixtureDir;
using testutil::max_abs_diff_to_csv;

// --- The real Keras 2.12 model ------------------------------------------------------------------

TEST(LoadModelKeras212, RebuildsTheCompiledSequential) {
  std::unique_ptr<nn::Model> m = load_model(kKerasFixture);
  auto* seq = dynamic_cast<nn::Sequential*>(m.get());
  ASSERT_NE(seq, nullptr);
  EXPECT_EQ(m->name(), "sequential");
  ASSERT_EQ(m->layers().size(), 3u);
  EXPECT_EQ(m->layers()[0]->class_name(), "Flatten");
  EXPECT_EQ(m->layers()[1]->class_name(), "Dense");
  EXPECT_EQ(m->layers()[2]->class_name(), "Dense");
  EXPECT_EQ(m->layers()[1]->name(), "dense");
  EXPECT_EQ(m->layers()[2]->name(), "dense_1");
  ASSERT_TRUE(m->compiled());
  ASSERT_NE(m->optimizer(), nullptr);
  EXPECT_EQ(m->optimizer()->get_config().class_name, "Adam");
  EXPECT_FLOAT_EQ(m->optimizer()->learning_rate(), 0.001f);
  EXPECT_EQ(m->loss()->name(), "sparse_categorical_crossentropy");
  ASSERT_EQ(m->metrics().size(), 2u);  // the loss tracker, then the compiled metric
  EXPECT_EQ(m->metrics()[1]->name(), "accuracy");

  // Weights equal the CSVs Keras dumped.
  auto& dense = dynamic_cast<nn::Dense&>(*m->layers()[1]);
  auto& dense_1 = dynamic_cast<nn::Dense&>(*m->layers()[2]);
  EXPECT_LE(
      max_abs_diff_to_csv(dense.kernel().tensor(), kKerasFixtureDir + "layer_1_weights_0.csv"),
      1e-7);
  EXPECT_LE(max_abs_diff_to_csv(dense.bias()->tensor(), kKerasFixtureDir + "layer_1_weights_1.csv"),
            1e-7);
  EXPECT_LE(
      max_abs_diff_to_csv(dense_1.kernel().tensor(), kKerasFixtureDir + "layer_2_weights_0.csv"),
      1e-7);
  EXPECT_LE(
      max_abs_diff_to_csv(dense_1.bias()->tensor(), kKerasFixtureDir + "layer_2_weights_1.csv"),
      1e-7);

  // The optimizer state is the file's, bitwise (Keras >= 2.11 names, m/v interleaved).
  const ck::KerasH5Contents c = ck::read_keras_h5(kKerasFixture);
  EXPECT_EQ(m->optimizer()->iterations(), c.optimizer_weights[0].value.data<int64_t>()[0]);
  for (const ck::H5Weight& w : c.optimizer_weights) {
    if (w.name == "iteration:0") continue;
    const std::string name = ck::strip_weight_suffix(w.name);  // "Adam/m/dense/kernel"
    const size_t a = name.find('/'), b = name.find('/', a + 1);
    const std::string slot = name.substr(a + 1, b - a - 1), var = name.substr(b + 1);
    Variable* target = nullptr;
    for (Variable* v : m->trainable_variables()) {
      if (v->name() == var) target = m->optimizer()->slot(*v, slot);
    }
    ASSERT_NE(target, nullptr) << w.name;
    EXPECT_TRUE(target->tensor().equals(w.value)) << w.name;
  }
}

TEST(LoadModelKeras212, PredictsProbabilityDistributionsAndKeepsTraining) {
  std::unique_ptr<nn::Model> m = load_model(kKerasFixture);
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> xs(16 * 28 * 28);
  for (float& v : xs) v = pixel(gen);
  const Tensor x = Tensor::from_vector(xs, Shape{16, 28, 28});
  const Tensor p = m->predict(x, {.batch_size = 8});
  ASSERT_EQ(p.shape(), (Shape{16, 10}));
  for (int i = 0; i < 16; ++i) {
    double sum = 0;
    for (int j = 0; j < 10; ++j) {
      const float v = p.data<float>()[i * 10 + j];
      EXPECT_GE(v, 0.0f);
      EXPECT_LE(v, 1.0f);
      sum += v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << i;
  }
  // Two more Adam steps from the restored state.
  const int64_t before = m->optimizer()->iterations();
  std::vector<float> labels(16);
  for (int i = 0; i < 16; ++i) labels[i] = static_cast<float>(i % 10);
  const History h = m->fit(x, Tensor::from_vector(labels, Shape{16}),
                           {.epochs = 1, .batch_size = 8, .verbose = 0});
  EXPECT_EQ(m->optimizer()->iterations(), before + 2);
  EXPECT_TRUE(std::isfinite(h.last("loss")));
}

// --- Round trips --------------------------------------------------------------------------------

TEST(SaveModel, RoundTripIsBitwiseForWeightsSlotsIterationAndConfigs) {
  TempDir dir;
  const Data d = make_data();
  auto a = make_model();
  compile_adam(*a);
  fit_epochs(*a, d, 2, 0, std::make_shared<BatchLosses>());
  ASSERT_EQ(a->optimizer()->iterations(), 16);
  a->save(dir.file("m.h5"));

  std::unique_ptr<nn::Model> b = load_model(dir.file("m.h5"));
  EXPECT_EQ(b->to_json(), a->to_json());
  expect_same_weights(*a, *b);
  expect_same_optimizer_state(*a, *b);
  EXPECT_EQ(b->loss()->name(), "sparse_categorical_crossentropy");
  ASSERT_EQ(b->metrics().size(), 2u);
  EXPECT_EQ(b->metrics()[1]->name(), "accuracy");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.h5"});

  // Saving the loaded model again writes the same contents.
  b->save(dir.file("again.h5"));
  const ck::KerasH5Contents c1 = ck::read_keras_h5(dir.file("m.h5"));
  const ck::KerasH5Contents c2 = ck::read_keras_h5(dir.file("again.h5"));
  EXPECT_EQ(c1.model_config, c2.model_config);
  EXPECT_EQ(c1.training_config, c2.training_config);
}

TEST(SaveModel, WritesKeras212Layout) {
  TempDir dir;
  auto a = make_model();
  compile_adam(*a);
  fit_epochs(*a, make_data(), 1, 0, std::make_shared<BatchLosses>());
  a->save(dir.file("m.h5"));
  const ck::KerasH5Contents c = ck::read_keras_h5(dir.file("m.h5"));
  EXPECT_FALSE(c.weights_only);
  EXPECT_EQ(c.keras_version, "2.12.0");
  EXPECT_EQ(c.backend, "tensorflow");
  const auto config = nlohmann::json::parse(c.model_config);
  EXPECT_EQ(config["class_name"], "Sequential");
  EXPECT_FALSE(config.contains("keras_version"));  // only model.to_json() carries it
  EXPECT_EQ(config["config"]["layers"][0]["class_name"], "InputLayer");
  const auto training = nlohmann::json::parse(c.training_config);
  EXPECT_EQ(training["loss"]["class_name"], "SparseCategoricalCrossentropy");
  EXPECT_EQ(training["metrics"], nlohmann::json::array({"accuracy"}));
  EXPECT_EQ(training["optimizer_config"]["class_name"], "Adam");
  EXPECT_EQ(training["optimizer_config"]["config"]["is_legacy_optimizer"], false);
  EXPECT_EQ(training["optimizer_config"]["config"]["learning_rate"], 0.05);
  EXPECT_EQ(training["optimizer_config"]["config"]["amsgrad"], false);
  ASSERT_EQ(c.layers.size(), 2u);
  const std::string l0 = a->layers()[0]->name(), l1 = a->layers()[1]->name();
  EXPECT_EQ(c.layers[0].name, l0);
  ASSERT_EQ(c.layers[0].weights.size(), 2u);
  EXPECT_EQ(c.layers[0].weights[0].name, l0 + "/kernel:0");
  EXPECT_EQ(c.layers[0].weights[1].name, l0 + "/bias:0");
  // Keras 2.12's order, which its positional set_weights relies on: iteration, then m and v
  // interleaved per variable.
  const std::vector<std::string> expected = {"iteration:0",
                                             "Adam/m/" + l0 + "/kernel:0",
                                             "Adam/v/" + l0 + "/kernel:0",
                                             "Adam/m/" + l0 + "/bias:0",
                                             "Adam/v/" + l0 + "/bias:0",
                                             "Adam/m/" + l1 + "/kernel:0",
                                             "Adam/v/" + l1 + "/kernel:0",
                                             "Adam/m/" + l1 + "/bias:0",
                                             "Adam/v/" + l1 + "/bias:0"};
  ASSERT_EQ(c.optimizer_weights.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(c.optimizer_weights[i].name, expected[i]);
  EXPECT_EQ(c.optimizer_weights[0].value.dtype(), DType::kInt64);
  EXPECT_EQ(c.optimizer_weights[0].value.data<int64_t>()[0], 8);
}

TEST(SaveModel, RoundTripsEveryOptimizerAndSchedule) {
  const Data d = make_data();
  std::vector<std::shared_ptr<optim::Optimizer>> optimizers = {
      std::make_shared<optim::SGD>(
          optim::SGDOptions{.learning_rate = 0.05, .momentum = 0.9, .nesterov = true}),
      std::make_shared<optim::SGD>(optim::SGDOptions{.learning_rate = 0.05}),
      std::make_shared<optim::RMSprop>(
          optim::RMSpropOptions{.learning_rate = 0.01, .momentum = 0.5, .centered = true}),
      std::make_shared<optim::AdamW>(optim::AdamWOptions{.weight_decay = 0.01, .amsgrad = true}),
  };
  auto scheduled = std::make_shared<optim::Adam>();
  scheduled->set_learning_rate_schedule(
      std::make_shared<optim::ExponentialDecay>(0.01, 5, 0.5, true));
  optimizers.push_back(scheduled);
  auto piecewise = std::make_shared<optim::SGD>();
  piecewise->set_learning_rate_schedule(std::make_shared<optim::PiecewiseConstantDecay>(
      std::vector<int64_t>{4, 10}, std::vector<double>{0.1, 0.05, 0.01}));
  optimizers.push_back(piecewise);
  auto warmup = std::make_shared<optim::AdamW>();
  warmup->set_learning_rate_schedule(
      std::make_shared<optim::LinearWarmup>(optim::LinearWarmupOptions{
          .warmup_steps = 3,
          .after_warmup_schedule = std::make_shared<optim::CosineDecay>(
              optim::CosineDecayOptions{.initial_learning_rate = 0.01, .decay_steps = 20})}));
  optimizers.push_back(warmup);
  for (const auto& opt : optimizers) {
    SCOPED_TRACE(opt->get_config().class_name);
    TempDir dir;
    auto a = make_model();
    a->compile({.optimizer = opt, .loss = "sparse_categorical_crossentropy"});
    fit_epochs(*a, d, 1, 0, std::make_shared<BatchLosses>());
    a->save(dir.file("m.h5"));
    std::unique_ptr<nn::Model> b = load_model(dir.file("m.h5"));
    expect_same_weights(*a, *b);
    expect_same_optimizer_state(*a, *b);
    EXPECT_EQ(b->optimizer()->learning_rate(), a->optimizer()->learning_rate());
  }
}

// --- Resuming -----------------------------------------------------------------------------------

// Train 2 epochs, save, load, train the 3rd epoch: the loss continues where it was (it does not
// jump back to the initial loss), and the result is bitwise what an uninterrupted 3-epoch run
// computes. Bitwise, not merely close, because nothing differs between the two runs: the same
// initial weights (seeded), the same batches in the same order (fit shuffles each epoch by seed
// and epoch number, and initial_epoch = 2 selects epoch 2's order), the same kernels on the same
// shapes, and a restored state that is exact — float32 weights and slots stored as their bits,
// the int64 iteration counter (Adam's bias correction depends on it), and hyperparameters that
// survive JSON unchanged (nlohmann writes the shortest decimal that reads back as the same
// double).
TEST(LoadModelResume, FitContinuesExactlyAsAnUninterruptedRun) {
  set_random_seed(2024);  // deterministic initial weights
  TempDir dir;
  const Data d = make_data();

  auto [a, c] = same_start(dir.file("init.h5"));
  compile_adam(*a);
  auto before = std::make_shared<BatchLosses>();
  fit_epochs(*a, d, 2, 0, before);
  a->save(dir.file("resume.h5"));

  std::unique_ptr<nn::Model> b = load_model(dir.file("resume.h5"));
  auto after = std::make_shared<BatchLosses>();
  fit_epochs(*b, d, 3, 2, after);
  ASSERT_EQ(after->epochs, std::vector<int64_t>{2});

  // "Loss before saving": the last epoch's mean loss (what fit reported); a single batch's loss
  // varies by ±0.15 around it here.
  const double initial = before->losses[0].front();
  double last_epoch = 0;
  for (double l : before->losses[1])
    last_epoch += l / static_cast<double>(before->losses[1].size());
  const double first_after = after->losses[0].front();
  std::printf(
      "initial loss %.6f, epoch 2 mean before saving %.6f, first batch after loading %.6f\n",
      initial, last_epoch, first_after);
  ASSERT_LT(last_epoch, 0.7 * initial) << "the model should have learned in 2 epochs";
  EXPECT_LT(std::abs(first_after - last_epoch), 0.3 * (initial - last_epoch));

  compile_adam(*c);
  auto uninterrupted = std::make_shared<BatchLosses>();
  fit_epochs(*c, d, 3, 0, uninterrupted);
  ASSERT_EQ(uninterrupted->losses.size(), 3u);
  EXPECT_EQ(after->losses[0], uninterrupted->losses[2]);
  expect_same_weights(*b, *c, /*same_names=*/false);
  expect_same_optimizer_state(*b, *c, /*same_names=*/false);
}

// The control that shows the test above can fail: the same weights with a fresh optimizer
// (load without compile, compile anew) do not reproduce the uninterrupted run.
TEST(LoadModelResume, AFreshOptimizerDoesNotReproduceTheRun) {
  set_random_seed(2024);
  TempDir dir;
  const Data d = make_data();
  auto [a, c] = same_start(dir.file("init.h5"));
  compile_adam(*a);
  fit_epochs(*a, d, 2, 0, std::make_shared<BatchLosses>());
  a->save(dir.file("resume.h5"));
  std::unique_ptr<nn::Model> b = load_model(dir.file("resume.h5"), {.compile = false});
  EXPECT_FALSE(b->compiled());
  compile_adam(*b);
  auto after = std::make_shared<BatchLosses>();
  fit_epochs(*b, d, 3, 2, after);
  compile_adam(*c);
  auto uninterrupted = std::make_shared<BatchLosses>();
  fit_epochs(*c, d, 3, 0, uninterrupted);
  EXPECT_EQ(after->losses[0].front(),
            uninterrupted->losses[2].front());            // same weights, same batch
  EXPECT_NE(after->losses[0], uninterrupted->losses[2]);  // then Adam's state makes the difference
  EXPECT_EQ(b->optimizer()->iterations(), 8);
}

// --- Older Keras files --------------------------------------------------------------------------

// A file as TF 2.0/2.1 (keras_version "2.2.4-tf", h5py 2.x) wrote it: fixed-length strings, no
// InputLayer (batch_input_shape on the first layer), the OptimizerV2 optimizer config and slot
// names ("Adam/iter:0", "Adam/dense/kernel/m:0", all m's then all v's), no
// top_level_model_weights group.
ck::KerasH5Contents tf21_style_contents(const std::string& lr_key, bool standalone_names) {
  ck::KerasH5Contents c;
  c.keras_version = standalone_names ? "2.2.4" : "2.2.4-tf";
  c.model_config = R"({"class_name": "Sequential", "config": {"name": "sequential", "layers": [
    {"class_name": "Dense", "config": {"name": "dense", "trainable": true,
      "batch_input_shape": [null, 4], "dtype": "float32", "units": 3, "activation": "relu",
      "use_bias": true, "kernel_initializer": {"class_name": "GlorotUniform",
      "config": {"seed": null}}, "bias_initializer": {"class_name": "Zeros", "config": {}},
      "kernel_regularizer": null, "bias_regularizer": null, "activity_regularizer": null,
      "kernel_constraint": null, "bias_constraint": null}},
    {"class_name": "Dense", "config": {"name": "dense_1", "trainable": true, "dtype": "float32",
      "units": 2, "activation": "softmax", "use_bias": true}}]}})";
  c.training_config = str_cat(
      R"({"loss": "sparse_categorical_crossentropy", "metrics": ["acc"], "weighted_metrics": null,
          "sample_weight_mode": null, "loss_weights": null, "optimizer_config": {"class_name": "Adam",
          "config": {)",
      standalone_names ? "" : R"("name": "Adam", )", "\"", lr_key,
      R"(": 0.0020000000949949026, "decay": 0.0, "beta_1": 0.9, "beta_2": 0.999,
          "epsilon": 1e-07, "amsgrad": false}}})");
  auto fill = [](const Shape& s, float start) {
    Tensor t(s);
    for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = start + 0.01f * i;
    return t;
  };
  c.layers = {
      {"dense", {{"dense/kernel:0", fill({4, 3}, 1)}, {"dense/bias:0", fill({3}, 2)}}},
      {"dense_1", {{"dense_1/kernel:0", fill({3, 2}, 3)}, {"dense_1/bias:0", fill({2}, 4)}}}};
  Tensor iter(DType::kInt64, Shape{});
  iter.data<int64_t>()[0] = 5;
  const std::vector<std::pair<std::string, Shape>> vars = {{"dense/kernel", {4, 3}},
                                                           {"dense/bias", {3}},
                                                           {"dense_1/kernel", {3, 2}},
                                                           {"dense_1/bias", {2}}};
  int k = 0;
  if (standalone_names) {
    // Keras 2.2.4 (standalone): unnamed slot variables, then [1]-shaped vhats even without amsgrad.
    c.optimizer_weights.push_back({"Adam/iterations:0", iter});
    for (const char* slot : {"m", "v"}) {
      for (const auto& [name, shape] : vars) {
        c.optimizer_weights.push_back(
            {str_cat("training/Adam/Variable", k ? str_cat("_", k) : "", ":0"),
             fill(shape, slot[0] == 'm' ? 10.0f : 20.0f)});
        ++k;
      }
    }
    for (size_t i = 0; i < vars.size(); ++i) {
      c.optimizer_weights.push_back(
          {str_cat("training/Adam/Variable_", k++, ":0"), Tensor::zeros({1})});
    }
  } else {
    c.optimizer_weights.push_back({"Adam/iter:0", iter});
    for (const char* slot : {"m", "v"}) {
      for (const auto& [name, shape] : vars) {
        c.optimizer_weights.push_back(
            {str_cat("Adam/", name, "/", slot, ":0"), fill(shape, slot[0] == 'm' ? 10.0f : 20.0f)});
      }
    }
  }
  return c;
}

void expect_tf21_model_loaded(nn::Model& m, const ck::KerasH5Contents& c) {
  ASSERT_EQ(m.layers().size(), 2u);
  EXPECT_EQ(m.layers()[0]->name(), "dense");
  EXPECT_EQ(m.input_shape(), std::optional<Shape>(Shape{4}));
  const auto vars = m.trainable_variables();
  ASSERT_EQ(vars.size(), 4u);
  EXPECT_TRUE(vars[0]->tensor().equals(c.layers[0].weights[0].value));
  EXPECT_TRUE(vars[3]->tensor().equals(c.layers[1].weights[1].value));
  ASSERT_TRUE(m.compiled());
  optim::Optimizer& opt = *m.optimizer();
  EXPECT_EQ(opt.get_config().class_name, "Adam");
  EXPECT_FLOAT_EQ(opt.learning_rate(), 0.002f);
  EXPECT_EQ(opt.iterations(), 5);
  for (size_t i = 0; i < vars.size(); ++i) {
    EXPECT_TRUE(opt.slot(*vars[i], "m")->tensor().equals(c.optimizer_weights[1 + i].value))
        << vars[i]->name();
    EXPECT_TRUE(opt.slot(*vars[i], "v")->tensor().equals(c.optimizer_weights[5 + i].value))
        << vars[i]->name();
  }
  EXPECT_EQ(m.metrics().at(1)->name(), "acc");
}

TEST(LoadModelOlderKeras, Tf21FileWithFixedLengthStringsAndOptimizerV2Names) {
  TempDir dir;
  const ck::KerasH5Contents c = tf21_style_contents("learning_rate", false);
  ck::write_keras_h5(dir.file("tf21.h5"), c,
                     {.fixed_length_strings = true, .top_level_group = false});
  const auto objects = ck::list_h5_objects(dir.file("tf21.h5"));
  ASSERT_EQ(objects[0].path, "/");
  for (const auto& [name, type] : objects[0].attributes) {
    EXPECT_EQ(type.rfind("fixed string(", 0), 0u) << name << ": " << type;
  }
  std::unique_ptr<nn::Model> m = load_model(dir.file("tf21.h5"));
  expect_tf21_model_loaded(*m, c);
  const Tensor x = Tensor::ones(Shape{2, 4});
  const Tensor y = Tensor::from_vector<float>({0, 1}, Shape{2});
  m->fit(x, y, {.epochs = 1, .batch_size = 2, .verbose = 0});
  EXPECT_EQ(m->optimizer()->iterations(), 6);
}

TEST(LoadModelOlderKeras, Keras224StandaloneFileMatchesSlotsByPosition) {
  TempDir dir;
  const ck::KerasH5Contents c = tf21_style_contents("lr", true);
  ck::write_keras_h5(dir.file("k224.h5"), c,
                     {.fixed_length_strings = true, .top_level_group = false});
  std::unique_ptr<nn::Model> m = load_model(dir.file("k224.h5"));
  expect_tf21_model_loaded(*m, c);
}

// --- Training configs of Keras files ------------------------------------------------------------

TEST(SavingErrors, UnsupportedTrainingConfigIsRefusedUnlessCompileIsFalse) {
  TempDir dir;
  ck::KerasH5Contents c = tf21_style_contents("learning_rate", false);
  c.training_config = R"({"loss": "sparse_categorical_crossentropy", "metrics": [],
      "optimizer_config": {"class_name": "Adam", "config": {"learning_rate": 0.001,
      "use_ema": true}}})";
  ck::write_keras_h5(dir.file("ema.h5"), c);
  const std::string msg =
      expect_throws<InvalidArgumentError>([&] { load_model(dir.file("ema.h5")); });
  EXPECT_NE(msg.find("use_ema"), std::string::npos) << msg;
  std::unique_ptr<nn::Model> m = load_model(dir.file("ema.h5"), {.compile = false});
  EXPECT_FALSE(m->compiled());
}

// Keras's clipping arguments load into the optimizer (and a null one means unset).
TEST(Saving, GradientClippingArgumentsLoadFromKerasFiles) {
  TempDir dir;
  ck::KerasH5Contents c = tf21_style_contents("learning_rate", false);
  c.training_config = R"({"loss": "sparse_categorical_crossentropy", "metrics": [],
      "optimizer_config": {"class_name": "Adam", "config": {"learning_rate": 0.001,
      "clipnorm": null, "global_clipnorm": 1.5, "clipvalue": null}}})";
  ck::write_keras_h5(dir.file("clip.h5"), c);
  std::unique_ptr<nn::Model> m = load_model(dir.file("clip.h5"));
  ASSERT_TRUE(m->compiled());
  EXPECT_EQ(m->optimizer()->clipping().global_clipnorm, 1.5);
  EXPECT_EQ(m->optimizer()->clipping().clipnorm, 0.0);
  const optim::OptimizerConfig config = m->optimizer()->get_config();
  ASSERT_NE(config.find("global_clipnorm"), nullptr);
  EXPECT_EQ(*config.find("global_clipnorm"), 1.5);
  // Written back under Keras's key.
  save_model(*m, dir.file("again.h5"));
  EXPECT_EQ(load_model(dir.file("again.h5"))->optimizer()->clipping().global_clipnorm, 1.5);
}

TEST(SavingErrors, OptimizerStateThatDoesNotFitStartsFreshWithAWarning) {
  TempDir dir;
  ck::KerasH5Contents c = tf21_style_contents("learning_rate", false);
  c.optimizer_weights[1].value = Tensor::zeros({7});  // Adam/dense/kernel/m:0 of the wrong shape
  ck::write_keras_h5(dir.file("bad_opt.h5"), c);
  testing::internal::CaptureStderr();
  std::unique_ptr<nn::Model> m = load_model(dir.file("bad_opt.h5"));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("freshly initialized optimizer"), std::string::npos) << err;
  EXPECT_NE(err.find("Adam/dense/kernel/m:0"), std::string::npos) << err;
  ASSERT_TRUE(m->compiled());
  EXPECT_EQ(m->optimizer()->iterations(), 0);
  Variable* kernel = m->trainable_variables()[0];
  const Tensor& slot = m->optimizer()->slot(*kernel, "m")->tensor();
  for (int64_t i = 0; i < slot.num_elements(); ++i) ASSERT_EQ(slot.data<float>()[i], 0.0f);
}

}  // namespace
}  // namespace dtrain::train
