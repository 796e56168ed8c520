// What dtrain writes as .keras and as a Keras 3 .h5 has the groups, attributes, dtypes and shapes
// the real Keras 3 files have, judged by h5py (Debian's python3-h5py), never by dtrain: dtrain
// saves the Dense part of each fixture's model (same names, compiled with Adam and trained one
// step so that the optimizer has its slots) and keras3_structure_check.py compares its tree with
// the fixture's, the fixture's Conv2D/MaxPooling2D entries dropped.
#include <gtest/gtest.h>

#include "dtrain/nn/layers.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/saving.h"
#include "dtrain/train/training.h"
#include "testutil/h5py.h"
#include "testutil/run_dtrain.h"
#include "testutil/temp_dir.h"

namespace dtrain::train {
namespace {

using dtrain::testutil::run_shell;
using dtrain::testutil::TempDir;

const std::string kChecker = "tests/train/keras3_structure_check.py";

void compile_and_step(nn::Model& m, const Shape& example) {
  m.compile({.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 1e-3}),
             .loss = "sparse_categorical_crossentropy",
             .metrics = {"accuracy"}});
  std::vector<float> xs(static_cast<size_t>(4 * example.num_elements()), 0.5f);
  const Tensor x = Tensor::from_vector(xs, example.with_first(4));
  const Tensor y = Tensor::from_vector(std::vector<float>{0, 1, 2, 3}, Shape{4});
  m.fit(x, y, {.epochs = 1, .batch_size = 4, .verbose = 0});
}

std::string check(const std::string& mode, const std::string& fixture, const std::string& ours) {
  const auto r =
      run_shell("/usr/bin/python3 " + kChecker + " " + mode + " " + fixture + " " + ours + " 2>&1");
  EXPECT_EQ(r.code, 0) << r.output;
  return r.output;
}

// fashion_cnn_keras310.keras without its convolutions: Flatten → Dropout(0.5) → Dense(64, relu)
// → Dense(10, softmax) on the 5×5×64 features the second pooling layer hands Flatten.
TEST(Keras3Structure, DotKerasMatchesKeras310) {
  DTRAIN_REQUIRE_H5PY();
  TempDir dir;
  nn::Sequential m({nn::Flatten({.input_shape = Shape{5, 5, 64}, .name = "flatten"}),
                    nn::Dropout(0.5, {.name = "dropout"}),
                    nn::Dense(64, {.activation = "relu", .name = "dense"}),
                    nn::Dense(10, {.activation = "softmax", .name = "dense_1"})},
                   {.name = "sequential"});
  compile_and_step(m, Shape{5, 5, 64});
  m.save(dir.file("dense.keras"));
  const std::string out = check("keras", "../shared/fixtures/keras3/fashion_cnn_keras310.keras",
                                dir.file("dense.keras"));
  EXPECT_NE(out.find("0 differences"), std::string::npos) << out;
}

// fashion_cnn_keras3141.h5 without its convolutions: Dropout(0.25) → Flatten → Dense(128, relu)
// → Dropout(0.5) → Dense(10, softmax).
TEST(Keras3Structure, Keras3H5MatchesKeras3141) {
  DTRAIN_REQUIRE_H5PY();
  TempDir dir;
  nn::Sequential m({nn::Dropout(0.25, {.name = "dropout"}), nn::Flatten({.name = "flatten"}),
                    nn::Dense(128, {.activation = "relu", .name = "dense"}),
                    nn::Dropout(0.5, {.name = "dropout_1"}),
                    nn::Dense(10, {.activation = "softmax", .name = "dense_1"})},
                   {.name = "sequential"});
  m.build(Shape{5, 5, 64});
  compile_and_step(m, Shape{5, 5, 64});
  save_model(m, dir.file("dense.h5"), {.format = SaveFormat::kKeras3H5});
  const std::string out =
      check("h5", "../shared/fixtures/keras3/fashion_cnn_keras3141.h5", dir.file("dense.h5"));
  EXPECT_NE(out.find("0 differences"), std::string::npos) << out;
}

// The checker can fail: dtrain's default .h5 (the Keras 2.12 layout) is not Keras 3's.
TEST(Keras3Structure, TheCheckerTellsKeras2LayoutApart) {
  DTRAIN_REQUIRE_H5PY();
  TempDir dir;
  nn::Sequential m({nn::Dropout(0.25, {.name = "dropout"}), nn::Flatten({.name = "flatten"}),
                    nn::Dense(128, {.activation = "relu", .name = "dense"}),
                    nn::Dropout(0.5, {.name = "dropout_1"}),
                    nn::Dense(10, {.activation = "softmax", .name = "dense_1"})},
                   {.name = "sequential"});
  m.build(Shape{5, 5, 64});
  compile_and_step(m, Shape{5, 5, 64});
  m.save(dir.file("keras2.h5"));
  const auto r = run_shell("/usr/bin/python3 " + kChecker +
                           " h5 ../shared/fixtures/keras3/fashion_cnn_keras3141.h5 " +
                           dir.file("keras2.h5") + " 2>&1");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("dense/kernel:0"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dtrain::train
