// Keras 3 model files: .keras archives and the Keras 3 .h5 dialect written by dtrain and read
// back bitwise (weights, optimizer slots, iteration, configs), fit() continuing after load_model
// exactly as an uninterrupted run, the real Keras 3 files (../shared/fixtures/keras3) parsed up to
// the layers this branch has, and the errors for bad archives. The layout checks against the real
// files use h5py (keras3_structure_test.cc); the fixtures' accuracies keras3_fixture_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/checkpoint/keras_v3.h"
#include "dtrain/core/random.h"
#include "dtrain/nn/layers.h"
#include "dtrain/optim/adam.h"
#include "dtrain/optim/rmsprop.h"
#include "dtrain/optim/sgd.h"
#include "dtrain/train/saving.h"
#include "dtrain/train/training.h"
#include "testutil/expect_throws.h"
#include "testutil/run_dtrain.h"
#include "testutil/temp_dir.h"
#include "train/saving_fixture.h"

namespace dtrain::train {
namespace {

using dtrain::testutil::expect_throws;
using dtrain::testutil::expect_throws_with;
using dtrain::testutil::read_bytes;
using dtrain::testutil::run_shell;
using dtrain::testutil::TempDir;
using dtrain::testutil::write_bytes;
namespace ck = dtrain::checkpoint;
using nlohmann::json;

const std::string kKeras3H5 = "../shared/fixtures/keras3/fashion_cnn_keras3141.h5";
const std::string kKeras3Zip = "../shared/fixtures/keras3/fashion_cnn_keras310.keras";

using saving_fixture::Data;

// The saving tests' data set (saving_fixture.h) with a seed of its own.
Data make_data() { return saving_fixture::make_data(99); }

// Dense(16) → Dropout → Dense(3); without the Dropout for runs compared step by step (a loaded
// Dropout draws other masks, as in Keras, which saves no random state).
std::unique_ptr<nn::Sequential> make_model(bool dropout = true) {
  auto m = std::make_unique<nn::Sequential>(std::initializer_list<nn::LayerRef>{
      nn::Dense(16, {.activation = "relu", .input_shape = Shape{8}})});
  if (dropout) m->add_layer(nn::Dropout(0.25));
  m->add_layer(nn::Dense(3, {.activation = "softmax"}));
  return m;
}

History fit_epochs(nn::Model& m, const Data& d, int64_t epochs, int64_t initial_epoch) {
  return m.fit(d.x, d.y,
               {.epochs = epochs,
                .batch_size = 32,
                .initial_epoch = initial_epoch,
                .seed = 7,
                .verbose = 0});
}

void expect_same_weights(nn::Model& a, nn::Model& b) {
  const auto wa = a.weights();
  const auto wb = b.weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i]->name(), wb[i]->name());
    EXPECT_TRUE(wa[i]->tensor().equals(wb[i]->tensor())) << wa[i]->name();
  }
}

void expect_same_optimizer_state(nn::Model& a, nn::Model& b) {
  optim::Optimizer* oa = a.optimizer();
  optim::Optimizer* ob = b.optimizer();
  ASSERT_NE(oa, nullptr);
  ASSERT_NE(ob, nullptr);
  EXPECT_EQ(oa->iterations(), ob->iterations());
  EXPECT_EQ(oa->learning_rate(), ob->learning_rate());
  ASSERT_EQ(oa->slot_names(), ob->slot_names());
  const auto va = a.trainable_variables();
  const auto vb = b.trainable_variables();
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) {
    for (const std::string& s : oa->slot_names()) {
      Variable* sa = oa->slot(*va[i], s);
      Variable* sb = ob->slot(*vb[i], s);
      ASSERT_NE(sa, nullptr);
      ASSERT_NE(sb, nullptr) << vb[i]->name() << " " << s;
      EXPECT_TRUE(sa->tensor().equals(sb->tensor())) << sa->name();
    }
  }
  EXPECT_EQ(oa->get_config().class_name, ob->get_config().class_name);
  EXPECT_EQ(oa->get_config().hyperparameters, ob->get_config().hyperparameters);
}

bool any_nonzero(const Tensor& t) {
  const float* p = t.data<float>();
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    if (p[i] != 0.0f) return true;
  }
  return false;
}

// Runs a Python snippet with Debian's python3 (zipfile is all it needs); fails the test on error.
void python(const std::string& code) {
  const auto r = run_shell("/usr/bin/python3 -c '" + code + "' 2>&1");
  ASSERT_EQ(r.code, 0) << r.output;
}

// Rewrites config.json of the archive `src` into `dst` with `edit` (a Python expression over the
// parsed dict `c`, evaluated for its side effect), keeping the other members.
void edit_config(const std::string& src, const std::string& dst, const std::string& edit) {
  python(
      "import json, zipfile\n"
      "zi = zipfile.ZipFile(\"" +
      src +
      "\")\n"
      "c = json.loads(zi.read(\"config.json\"))\n" +
      edit +
      "\n"
      "zo = zipfile.ZipFile(\"" +
      dst +
      "\", \"w\")\n"
      "for n in zi.namelist():\n"
      "    zo.writestr(n, json.dumps(c) if n == \"config.json\" else zi.read(n))\n"
      "zo.close()\n");
}

// --- Round trips -------------------------------------------------------------------------------

class Keras3RoundTrip : public ::testing::TestWithParam<SaveFormat> {};

TEST_P(Keras3RoundTrip, WeightsSlotsIterationAndConfigsAreBitwiseAndFitContinuesExactly) {
  set_random_seed(31);
  TempDir dir;
  const Data d = make_data();
  const std::string ext = GetParam() == SaveFormat::kKeras3Zip ? ".keras" : ".h5";
  auto a = make_model(/*dropout=*/false);
  a->compile({.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.02}),
              .loss = "sparse_categorical_crossentropy",
              .metrics = {"accuracy"}});
  fit_epochs(*a, d, 2, 0);
  const std::string path = dir.file("model" + ext);
  save_model(*a, path, {.format = GetParam()});
  if (GetParam() == SaveFormat::kKeras3Zip) {
    EXPECT_TRUE(ck::is_zip_file(path));
  } else {
    EXPECT_EQ(ck::read_keras_h5(path).keras_version.substr(0, 2), "3.");
  }

  std::unique_ptr<nn::Model> b = load_model(path);
  ASSERT_TRUE(b->compiled());
  EXPECT_EQ(b->name(), a->name());
  expect_same_weights(*a, *b);
  expect_same_optimizer_state(*a, *b);
  EXPECT_EQ(b->optimizer()->iterations(), 16);  // 2 epochs x 8 batches
  for (Variable* v : b->trainable_variables()) {
    EXPECT_TRUE(any_nonzero(b->optimizer()->slot(*v, "m")->tensor())) << v->name();
    EXPECT_TRUE(any_nonzero(b->optimizer()->slot(*v, "v")->tensor())) << v->name();
  }
  // The loaded model's next epoch is the original's next epoch, bit for bit.
  const History ha = fit_epochs(*a, d, 3, 2);
  const History hb = fit_epochs(*b, d, 3, 2);
  EXPECT_EQ(ha.history().at("loss"), hb.history().at("loss"));
  expect_same_weights(*a, *b);
  EXPECT_EQ(b->optimizer()->iterations(), 24);
}

INSTANTIATE_TEST_SUITE_P(Formats, Keras3RoundTrip,
                         ::testing::Values(SaveFormat::kKeras3Zip, SaveFormat::kKeras3H5),
                         [](const auto& info) {
                           return info.param == SaveFormat::kKeras3Zip ? std::string("Keras")
                                                                       : std::string("H5");
                         });

TEST(Keras3Save, DotKerasIsTheNativeZipAndDotH5StaysKeras2) {
  set_random_seed(5);
  TempDir dir;
  auto m = make_model();
  m->save(dir.file("m.keras"));
  m->save(dir.file("m.h5"));
  EXPECT_TRUE(ck::is_zip_file(dir.file("m.keras")));
  EXPECT_FALSE(ck::is_hdf5_file(dir.file("m.keras")));
  EXPECT_EQ(ck::read_keras_h5(dir.file("m.h5")).keras_version, "2.12.0");

  const ck::KerasV3Contents c = ck::read_keras_v3(dir.file("m.keras"));
  const json meta = json::parse(c.metadata_json);
  EXPECT_EQ(meta["keras_version"], "3.10.0");
  EXPECT_EQ(meta["date_saved"].get<std::string>().size(), 19u);  // 2026-12-01@13:44:01
  const json config = json::parse(c.config_json);
  EXPECT_EQ(config["module"], "keras");
  EXPECT_EQ(config["class_name"], "Sequential");
  EXPECT_FALSE(config.contains("compile_config"));  // not compiled
  const json& layers = config["config"]["layers"];
  ASSERT_EQ(layers.size(), 4u);
  EXPECT_EQ(layers[0]["class_name"], "InputLayer");
  EXPECT_EQ(layers[0]["config"]["batch_shape"], json::parse("[null, 8]"));
  EXPECT_FALSE(layers[1]["config"].contains("batch_input_shape"));
  EXPECT_EQ(layers[1]["config"]["dtype"]["class_name"], "DTypePolicy");
  EXPECT_EQ(layers[1]["config"]["kernel_initializer"]["module"], "keras.initializers");
  EXPECT_EQ(layers[1]["build_config"]["input_shape"], json::parse("[null, 8]"));
  EXPECT_FALSE(layers[2].contains("build_config"));  // Keras 3's Dropout is built at creation
  EXPECT_EQ(layers[3]["build_config"]["input_shape"], json::parse("[null, 16]"));
  // Variables by attribute path, not by layer name.
  ASSERT_NE(c.find("layers/dense"), nullptr);
  ASSERT_NE(c.find("layers/dense_1"), nullptr);
  EXPECT_EQ(c.find("layers/dense")->name, m->layers()[0]->name());
  EXPECT_EQ(c.find("layers/dense")->values.size(), 2u);
  EXPECT_TRUE(c.find("layers/dense")->values[0].equals(m->layers()[0]->weights()[0]->tensor()));
  ASSERT_NE(c.find("layers/dropout"), nullptr);
  EXPECT_TRUE(c.find("layers/dropout")->values.empty());
  EXPECT_EQ(c.find("")->name, m->name());
  EXPECT_EQ(c.find("optimizer"), nullptr);

  std::unique_ptr<nn::Model> back = load_model(dir.file("m.keras"));
  EXPECT_FALSE(back->compiled());
  expect_same_weights(*m, *back);
}

TEST(Keras3Save, EveryOptimizerRoundTripsThroughDotKeras) {
  const Data d = make_data();
  std::vector<std::shared_ptr<optim::Optimizer>> opts = {
      std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.01, .amsgrad = true}),
      std::make_shared<optim::SGD>(optim::SGDOptions{.learning_rate = 0.05, .momentum = 0.9}),
      std::make_shared<optim::SGD>(optim::SGDOptions{.learning_rate = 0.05}),
      std::make_shared<optim::RMSprop>(
          optim::RMSpropOptions{.learning_rate = 0.01, .momentum = 0.5, .centered = true}),
  };
  for (const auto& opt : opts) {
    SCOPED_TRACE(opt->get_config().class_name);
    TempDir dir;
    set_random_seed(8);
    auto a = make_model(/*dropout=*/false);
    a->compile({.optimizer = opt, .loss = "sparse_categorical_crossentropy"});
    fit_epochs(*a, d, 1, 0);
    a->save(dir.file("o.keras"));
    std::unique_ptr<nn::Model> b = load_model(dir.file("o.keras"));
    expect_same_weights(*a, *b);
    expect_same_optimizer_state(*a, *b);
    EXPECT_EQ(fit_epochs(*a, d, 2, 1).history().at("loss"),
              fit_epochs(*b, d, 2, 1).history().at("loss"));
  }
}

TEST(Keras3Save, LoadWeightsReadsDotKerasAndKeras3WeightsFiles) {
  TempDir dir;
  set_random_seed(12);
  auto a = make_model();
  a->save(dir.file("a.keras"));
  // Keras 3's save_weights("x.weights.h5") writes what the archive's model.weights.h5 holds.
  python("import zipfile\nopen(\"" + dir.file("a.weights.h5") +
         "\", \"wb\").write(zipfile.ZipFile(\"" + dir.file("a.keras") +
         "\").read(\"model.weights.h5\"))\n");
  ASSERT_TRUE(ck::is_keras_v3_weights_file(dir.file("a.weights.h5")));
  for (const char* name : {"a.keras", "a.weights.h5"}) {
    SCOPED_TRACE(name);
    auto b = make_model();  // other layer names, same classes: paths match, names need not
    b->load_weights(dir.file(name));
    const auto wa = a->weights(), wb = b->weights();
    ASSERT_EQ(wa.size(), wb.size());
    for (size_t i = 0; i < wa.size(); ++i) EXPECT_TRUE(wa[i]->tensor().equals(wb[i]->tensor()));
  }
  nn::Sequential other({nn::Dense(5, {.input_shape = Shape{8}})});
  expect_throws_with<InvalidArgumentError>([&] { other.load_weights(dir.file("a.keras")); },
                                           {"a.keras", "layers/dense/vars/0", "[8, 5]", "[8, 16]"});
}

// --- The real Keras 3 files --------------------------------------------------------------------

TEST(Keras3Fixtures, TheH5ReadsWithItsNestedWeightPathsAndOptimizer) {
  const ck::KerasH5Contents c = ck::read_keras_h5(kKeras3H5);
  EXPECT_EQ(c.keras_version, "3.14.1");
  ASSERT_EQ(c.layers.size(), 9u);
  EXPECT_EQ(c.layers[6].name, "dense");
  ASSERT_EQ(c.layers[6].weights.size(), 2u);
  EXPECT_EQ(c.layers[6].weights[0].name, "sequential/dense/kernel");
  EXPECT_EQ(c.layers[6].weights[0].value.shape(), (Shape{1600, 128}));
  EXPECT_TRUE(c.layers[4].weights.empty());  // dropout: weight_names is an empty float64 array
  ASSERT_EQ(c.optimizer_weights.size(), 18u);
  EXPECT_EQ(c.optimizer_weights[0].name, "adam/iteration");
  EXPECT_EQ(c.optimizer_weights[0].value.item(), 15000);
  // Before Keras 3 support the file failed on layers[0] (InputLayer without
  // batch_input_shape); the whole model loads now (keras3_fixture_test evaluates it).
  const std::unique_ptr<nn::Model> model = load_model(kKeras3H5);
  EXPECT_EQ(model->layers().size(), 9u);
}

TEST(Keras3Fixtures, TheDotKerasArchiveReadsWithItsVariablesAndOptimizer) {
  const ck::KerasV3Contents c = ck::read_keras_v3(kKeras3Zip);
  EXPECT_EQ(json::parse(c.metadata_json)["keras_version"], "3.10.0");
  EXPECT_EQ(json::parse(c.config_json)["class_name"], "Sequential");
  const ck::KerasV3Vars* dense = c.find("layers/dense");
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->name, "dense");
  ASSERT_EQ(dense->values.size(), 2u);
  EXPECT_EQ(dense->values[0].shape(), (Shape{1600, 64}));
  const ck::KerasV3Vars* opt = c.find("optimizer");
  ASSERT_NE(opt, nullptr);
  EXPECT_EQ(opt->name, "adam");
  ASSERT_EQ(opt->values.size(), 18u);  // iteration, learning_rate, 2 slots x 8 variables
  EXPECT_EQ(opt->values[0].dtype(), DType::kInt64);
  EXPECT_EQ(opt->values[10].shape(), (Shape{1600, 64}));  // vars/10: dense kernel momentum
  ASSERT_NE(c.find(""), nullptr);
  EXPECT_EQ(c.find("")->name, "sequential");
  EXPECT_EQ(load_model(kKeras3Zip)->layers().size(), 8u);
}

// --- Bad archives ------------------------------------------------------------------------------

TEST(Keras3Errors, MissingTruncatedAndNonZipFilesNameTheFile) {
  TempDir dir;
  set_random_seed(3);
  auto m = make_model();
  m->save(dir.file("good.keras"));
  const std::string bytes = read_bytes(dir.file("good.keras"));

  expect_throws_with<NotFoundError>([&] { (void)load_model(dir.file("missing.keras")); },
                                    {"missing.keras"});
  for (size_t keep : {size_t{0}, size_t{3}, bytes.size() / 2, bytes.size() - 10}) {
    SCOPED_TRACE(keep);
    write_bytes(dir.file("cut.keras"), bytes.substr(0, keep));
    expect_throws_with<DataLossError>([&] { (void)load_model(dir.file("cut.keras")); },
                                      {"cut.keras"});
  }
  write_bytes(dir.file("text.keras"), "this is not a zip archive at all\n");
  expect_throws_with<DataLossError>([&] { (void)load_model(dir.file("text.keras")); },
                                    {"text.keras", "not a zip archive"});
  // A flipped byte inside model.weights.h5 (stored uncompressed): the member's CRC fails.
  std::string flipped = bytes;
  const size_t at = flipped.find("HDF");
  ASSERT_NE(at, std::string::npos);
  flipped[at + 200] = static_cast<char>(flipped[at + 200] ^ 0x5a);
  write_bytes(dir.file("flipped.keras"), flipped);
  expect_throws_with<DataLossError>([&] { (void)load_model(dir.file("flipped.keras")); },
                                    {"flipped.keras", "model.weights.h5"});
}

TEST(Keras3Errors, ArchivesWithoutConfigOrWithMalformedJson) {
  TempDir dir;
  python("import zipfile\nz = zipfile.ZipFile(\"" + dir.file("noconfig.keras") +
         "\", \"w\")\nz.writestr(\"metadata.json\", \"{}\")\n"
         "z.writestr(\"model.weights.h5\", b\"\")\nz.close()\n");
  expect_throws_with<InvalidArgumentError>([&] { (void)load_model(dir.file("noconfig.keras")); },
                                           {"noconfig.keras", "no config.json", "metadata.json"});

  set_random_seed(3);
  auto m = make_model();
  m->save(dir.file("good.keras"));
  python("import zipfile\nzi = zipfile.ZipFile(\"" + dir.file("good.keras") +
         "\")\nzo = zipfile.ZipFile(\"" + dir.file("badjson.keras") +
         "\", \"w\")\nfor n in zi.namelist():\n"
         "    zo.writestr(n, b\"{\\\"class_name\\\": \" if n == \"config.json\" else zi.read(n))\n"
         "zo.close()\n");
  expect_throws_with<InvalidArgumentError>([&] { (void)load_model(dir.file("badjson.keras")); },
                                           {"badjson.keras", "config.json", "not valid JSON"});

  // config.json fine, model.weights.h5 not an HDF5 file.
  python("import zipfile\nzi = zipfile.ZipFile(\"" + dir.file("good.keras") +
         "\")\nzo = zipfile.ZipFile(\"" + dir.file("badweights.keras") +
         "\", \"w\")\nfor n in zi.namelist():\n"
         "    zo.writestr(n, zi.read(n)[:100] if n == \"model.weights.h5\" else zi.read(n))\n"
         "zo.close()\n");
  expect_throws_with<DataLossError>([&] { (void)load_model(dir.file("badweights.keras")); },
                                    {"badweights.keras", "model.weights.h5"});
  edit_config(dir.file("good.keras"), dir.file("notamodel.keras"), "c = [1, 2]");
  expect_throws_with<InvalidArgumentError>([&] { (void)load_model(dir.file("notamodel.keras")); },
                                           {"notamodel.keras", "config.json"});
  edit_config(dir.file("good.keras"), dir.file("subclassed.keras"),
              "c[\"class_name\"] = \"MyModel\"");
  expect_throws_with<UnimplementedError>([&] { (void)load_model(dir.file("subclassed.keras")); },
                                         {"subclassed.keras", "MyModel", "subclassed"});
  // A Sequential's config relabelled Functional: no input_layers, named in config.json.
  edit_config(dir.file("good.keras"), dir.file("functional.keras"),
              "c[\"class_name\"] = \"Functional\"");
  expect_throws_with<InvalidArgumentError>([&] { (void)load_model(dir.file("functional.keras")); },
                                           {"functional.keras", "config.json", "input_layers"});
}

TEST(Keras3Errors, AKernelShapeThatDoesNotMatchTheConfigNamesLayerAndVariable) {
  TempDir dir;
  set_random_seed(3);
  auto m = make_model();
  const std::string first = m->layers()[0]->name();
  m->save(dir.file("good.keras"));
  edit_config(dir.file("good.keras"), dir.file("units.keras"),
              "c[\"config\"][\"layers\"][1][\"config\"][\"units\"] = 17");
  expect_throws_with<InvalidArgumentError>(
      [&] { (void)load_model(dir.file("units.keras")); },
      {"units.keras", "layer '" + first + "'", "layers/dense/vars/0", "[8, 16]", "[8, 17]"});
  // A layer the file has no variables for (a config with one Dense more).
  edit_config(
      dir.file("good.keras"), dir.file("extra.keras"),
      "c[\"config\"][\"layers\"].append(json.loads(json.dumps(c[\"config\"][\"layers\"][3])))\n"
      "c[\"config\"][\"layers\"][4][\"config\"][\"name\"] = \"extra\"");
  expect_throws_with<InvalidArgumentError>([&] { (void)load_model(dir.file("extra.keras")); },
                                           {"extra.keras", "layer 'extra'", "layers/dense_2"});
  // The same mismatch in a Keras 3 .h5.
  save_model(*m, dir.file("k3.h5"), {.format = SaveFormat::kKeras3H5});
  ck::KerasH5Contents c = ck::read_keras_h5(dir.file("k3.h5"));
  json config = json::parse(c.model_config);
  config["config"]["layers"][1]["config"]["units"] = 17;
  c.model_config = config.dump();
  ck::write_keras_h5(dir.file("k3_units.h5"), c);
  expect_throws_with<InvalidArgumentError>([&] { (void)load_model(dir.file("k3_units.h5")); },
                                           {"k3_units.h5", first, "[8, 16]", "[8, 17]"});
}

TEST(Keras3Errors, AFailedSaveLeavesTheOldArchiveIntact) {
  TempDir dir;
  set_random_seed(3);
  auto m = make_model();
  m->save(dir.file("m.keras"));
  const std::string before = read_bytes(dir.file("m.keras"));
  nn::Sequential unbuilt({nn::Dense(4)});
  EXPECT_THROW(unbuilt.save(dir.file("m.keras")), FailedPreconditionError);
  EXPECT_THROW(save_model(*m, dir.file("m.h5"), {.format = SaveFormat::kKeras3Zip}),
               InvalidArgumentError);
  EXPECT_EQ(read_bytes(dir.file("m.keras")), before);
  EXPECT_EQ(std::filesystem::exists(dir.file("m.h5")), false);
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    files.push_back(e.path().filename());
  }
  EXPECT_EQ(files, std::vector<std::string>{"m.keras"});  // no temporary file left behind
}

}  // namespace
}  // namespace dtrain::train
