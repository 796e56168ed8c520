// save_weights/load_weights (by position, by name, TF-format prefixes, subclassed models), the
// errors of saving and loading (missing, corrupt and mismatched files, unknown layers, unbuilt
// models), and crash safety: a save that fails leaves the old file intact. The round trips and
// Keras layouts: saving_test.cc.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/nn/layers.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/saving.h"
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

// --- save_weights / load_weights --------------------------------------------------------------

TEST(SaveWeights, RoundTripByPositionIntoAFreshlyNamedModel) {
  TempDir dir;
  auto a = make_model();
  compile_adam(*a);
  fit_epochs(*a, make_data(), 1, 0, std::make_shared<BatchLosses>());
  a->save_weights(dir.file("w.h5"));
  const ck::KerasH5Contents c = ck::read_keras_h5(dir.file("w.h5"));
  EXPECT_TRUE(c.weights_only);
  EXPECT_TRUE(c.model_config.empty());
  EXPECT_TRUE(c.optimizer_weights.empty());

  auto b = make_model();  // new default names (dense_4, ...): loading goes by position
  EXPECT_NE(b->layers()[0]->name(), a->layers()[0]->name());
  b->load_weights(dir.file("w.h5"));
  const auto wa = a->weights(), wb = b->weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) EXPECT_TRUE(wa[i]->tensor().equals(wb[i]->tensor()));

  // A model file's /model_weights loads too.
  a->save(dir.file("m.h5"));
  auto e = make_model();
  e->load_weights(dir.file("m.h5"));
  EXPECT_TRUE(e->weights()[0]->tensor().equals(wa[0]->tensor()));

  // load_model refuses a weights file, saying what to do.
  const std::string msg =
      expect_throws<InvalidArgumentError>([&] { load_model(dir.file("w.h5")); });
  EXPECT_NE(msg.find("load_weights"), std::string::npos) << msg;
}

class TwoDense : public nn::Model {
 public:
  TwoDense() : nn::Model("two_dense") {}
  Tensor call(const Tensor& x, bool training) override { return d2_(d1_(x, training), training); }

 private:
  nn::Dense& d1_ = add("d1", nn::Dense(4, {.activation = "relu", .name = "sub_d1"}));
  nn::Dense& d2_ = add("d2", nn::Dense(2, {.name = "sub_d2"}));
};

TEST(SaveWeights, SubclassedModelsSaveWeightsButNotArchitecture) {
  TempDir dir;
  TwoDense a;
  a.build(Shape{3});
  a.save_weights(dir.file("w.h5"));
  TwoDense b;
  b.build(Shape{3});
  b.load_weights(dir.file("w.h5"));
  for (size_t i = 0; i < a.weights().size(); ++i) {
    EXPECT_TRUE(a.weights()[i]->tensor().equals(b.weights()[i]->tensor()));
  }
  expect_throws<UnimplementedError>([&] { a.save(dir.file("m.h5")); });
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"w.h5"});
}

TEST(SaveWeights, ByNameWithSkipMismatch) {
  TempDir dir;
  nn::Sequential a(
      {nn::Dense(5, {.input_shape = Shape{2}, .name = "first"}), nn::Dense(3, {.name = "second"})});
  a.save_weights(dir.file("w.h5"));
  nn::Sequential b(
      {nn::Dense(5, {.input_shape = Shape{2}, .name = "first"}), nn::Dense(4, {.name = "second"})});
  const Tensor second_before = b.weights()[2]->tensor().clone();
  load_weights(b, dir.file("w.h5"), {.by_name = true, .skip_mismatch = true});
  EXPECT_TRUE(b.weights()[0]->tensor().equals(a.weights()[0]->tensor()));
  EXPECT_TRUE(b.weights()[2]->tensor().equals(second_before));
  expect_throws<InvalidArgumentError>(
      [&] { load_weights(b, dir.file("w.h5"), {.by_name = true}); });
}

// --- Errors
// ---------------------------------------------------------------------------------------

TEST(SavingErrors, MissingAndCorruptFiles) {
  TempDir dir;
  std::string msg = expect_throws<NotFoundError>([&] { load_model(dir.file("nope.h5")); });
  EXPECT_NE(msg.find(dir.file("nope.h5")), std::string::npos) << msg;
  auto m = make_model();
  msg = expect_throws<NotFoundError>([&] { m->load_weights(dir.file("nope.h5")); });
  EXPECT_NE(msg.find(dir.file("nope.h5")), std::string::npos) << msg;

  const std::string bytes = read_bytes(kKerasFixture);
  std::ofstream(dir.file("cut.h5"), std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  msg = expect_throws<DataLossError>([&] { load_model(dir.file("cut.h5")); });
  EXPECT_NE(msg.find(dir.file("cut.h5")), std::string::npos) << msg;
}

// A global heap collection whose free-space object has size 0 makes libhdf5 1.10 loop forever
// on the first string attribute it reads (found by fuzzing load_model): it is rejected before
// HDF5 parses it. The file is Keras 3.14's fixture (whose string attributes are variable-length,
// in a global heap) with that one field zeroed.
TEST(SavingErrors, AGlobalHeapThatWouldHangHdf5IsDataLoss) {
  TempDir dir;
  std::string bytes = read_bytes("../shared/fixtures/keras3/fashion_cnn_keras3141.h5");
  const size_t heap = bytes.find("GCOL");
  ASSERT_NE(heap, std::string::npos);
  uint64_t heap_bytes = 0;
  std::memcpy(&heap_bytes, bytes.data() + heap + 8, 8);
  size_t p = heap + 16;  // the objects: index (2), references (2), reserved (4), size (8), data
  while (true) {
    ASSERT_LT(p + 16, heap + heap_bytes) << "no free-space object";
    uint16_t index = 0;
    uint64_t size = 0;
    std::memcpy(&index, bytes.data() + p, 2);
    std::memcpy(&size, bytes.data() + p + 8, 8);
    if (index == 0) break;
    p += 16 + (size + 7) / 8 * 8;
  }
  std::memset(bytes.data() + p + 8, 0, 8);
  write_bytes(dir.file("heap.h5"), bytes);
  const std::string msg = expect_throws<DataLossError>([&] { load_model(dir.file("heap.h5")); });
  EXPECT_NE(msg.find("global heap collection at offset " + std::to_string(heap)),
            std::string::npos)
      << msg;
}

TEST(SavingErrors, LayerCountAndShapeMismatchNameTheLayerWeightAndShapes) {
  TempDir dir;
  nn::Sequential a(
      {nn::Dense(16, {.input_shape = Shape{8}, .name = "h"}), nn::Dense(3, {.name = "out"})});
  a.save_weights(dir.file("w.h5"));

  nn::Sequential three({nn::Dense(16, {.input_shape = Shape{8}, .name = "h"}),
                        nn::Dense(3, {.name = "mid"}), nn::Dense(3, {.name = "out"})});
  std::string msg =
      expect_throws<InvalidArgumentError>([&] { three.load_weights(dir.file("w.h5")); });
  EXPECT_NE(msg.find("2 layers with weights [h, out]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 [h, mid, out]"), std::string::npos) << msg;

  nn::Sequential narrow(
      {nn::Dense(12, {.input_shape = Shape{8}, .name = "h"}), nn::Dense(3, {.name = "out"})});
  const Tensor kernel_before = narrow.weights()[0]->tensor().clone();
  msg = expect_throws<InvalidArgumentError>([&] { narrow.load_weights(dir.file("w.h5")); });
  EXPECT_NE(msg.find("layer 'h'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("h/kernel:0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 16]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 12]"), std::string::npos) << msg;
  EXPECT_TRUE(narrow.weights()[0]->tensor().equals(kernel_before)) << "changed on failure";
}

TEST(SavingErrors, UnknownLayerClassInModelConfig) {
  TempDir dir;
  ck::KerasH5Contents c;
  c.model_config = R"({"class_name": "Sequential", "config": {"name": "s", "layers": [
      {"class_name": "Conv2D", "config": {"name": "conv2d", "filters": 8,
       "batch_input_shape": [null, 28, 28, 1]}}]}})";
  c.layers = {{"conv2d", {{"conv2d/kernel:0", Tensor::zeros({3, 3, 1, 8})}}}};
  ck::write_keras_h5(dir.file("conv.h5"), c);
  const std::string msg =
      expect_throws<InvalidArgumentError>([&] { load_model(dir.file("conv.h5")); });
  EXPECT_NE(msg.find("Conv2D"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir.file("conv.h5")), std::string::npos) << msg;
}

TEST(SaveWeights, TensorFlowFormatPrefixesRoundTrip) {
  TempDir dir;
  auto a = make_model();
  auto b = make_model();
  a->save_weights(dir.file("weights"));
  EXPECT_TRUE(std::filesystem::exists(dir.file("weights.index")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("weights.data-00000-of-00001")));
  const auto wa = a->weights(), wb = b->weights();
  ASSERT_EQ(wa.size(), wb.size());
  bool differ = false;
  for (size_t i = 0; i < wa.size(); ++i) differ |= !wa[i]->tensor().equals(wb[i]->tensor());
  ASSERT_TRUE(differ) << "two fresh models should start from different weights";
  b->load_weights(dir.file("weights"));
  for (size_t i = 0; i < wa.size(); ++i) EXPECT_TRUE(wa[i]->tensor().equals(wb[i]->tensor())) << i;
  // A whole-model save still needs a Keras file name.
  expect_throws<UnimplementedError>([&] { a->save(dir.file("saved_model_dir")); });
}

TEST(SavingErrors, UnbuiltModelsCannotBeSaved) {
  TempDir dir;
  nn::Sequential m({nn::Dense(3)});
  expect_throws<FailedPreconditionError>([&] { m.save(dir.file("m.h5")); });
  expect_throws<FailedPreconditionError>([&] { m.save_weights(dir.file("w.h5")); });
  EXPECT_TRUE(dir.entries().empty());
}

// A layer whose weight has a dtype HDF5 files do not carry here (bfloat16).
class BFloat16Layer : public nn::Layer {
 public:
  BFloat16Layer() : nn::Layer("bf16") {}
  std::string class_name() const override { return "BFloat16Layer"; }
  Tensor call(const Tensor& x, bool) override { return x; }

 protected:
  void build_impl(const Shape&) override {
    auto init = nn::initializer_from_name("zeros");
    Variable& w = add_weight("w", Shape{2}, *init);
    w.tensor() = Tensor(DType::kBFloat16, Shape{2});
  }
};

TEST(SavingCrashSafety, AnUnsaveableModelLeavesTheOldFileIntact) {
  TempDir dir;
  auto good = make_model();
  compile_adam(*good);
  good->save(dir.file("m.h5"));
  const std::string before = read_bytes(dir.file("m.h5"));
  nn::Sequential bad({nn::Dense(4, {.input_shape = Shape{8}}), BFloat16Layer()});
  const std::string msg = expect_throws<UnimplementedError>([&] { bad.save(dir.file("m.h5")); });
  EXPECT_NE(msg.find("bfloat16"), std::string::npos) << msg;
  EXPECT_EQ(read_bytes(dir.file("m.h5")), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.h5"});
}

TEST(SavingCrashSafety, AWriteThatFailsMidwayLeavesTheOldFileIntact) {
  TempDir dir;
  const std::string path = dir.file("big.h5");
  auto small = make_model();
  compile_adam(*small);
  small->save(path);
  const std::string before = read_bytes(path);
  nn::Sequential big({nn::Dense(512, {.input_shape = Shape{512}}), nn::Dense(10)});
  big.compile({.optimizer = "adam", .loss = "mse"});

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing the child
    struct rlimit limit {
      256 * 1024, 256 * 1024
    };
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int code = 3;
    try {
      big.save(path);  // ~1 MiB of weights
      code = 1;
    } catch (const ResourceExhaustedError&) {
      code = 0;
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the save succeeded; 2: wrong error type";
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"big.h5"});
  std::unique_ptr<nn::Model> m = load_model(path);
  expect_same_weights(*small, *m);
}

}  // namespace
}  // namespace dtrain::train
