// The two real Keras 3 files (../shared/fixtures/keras3): a Keras 3.14.1 .h5 and a Keras 3.10
// .keras, both Fashion-MNIST CNNs (Conv2D, MaxPooling2D, Dropout, Flatten, Dense). They load,
// `dtrain evaluate` gives their stated test accuracy to four decimals (inputs /255, NHWC), and a
// loaded model continues to fit with Keras's optimizer state (iterations continue, slots
// non-zero). These need the Conv2D and MaxPooling2D layers (the "conv" branch): on a tree
// without them every test here fails with "unknown layer class 'Conv2D'".
#include <gtest/gtest.h>

#include <string>

#include "dtrain/data/fashion_mnist.h"
#include "dtrain/train/saving.h"
#include "dtrain/train/training.h"
#include "testutil/run_dtrain.h"
#include "testutil/temp_dir.h"

namespace dtrain::train {
namespace {

using dtrain::testutil::contains;
using dtrain::testutil::run_dtrain;

const std::string kKeras3H5 = "../shared/fixtures/keras3/fashion_cnn_keras3141.h5";
const std::string kKeras3Zip = "../shared/fixtures/keras3/fashion_cnn_keras310.keras";

bool any_nonzero(const Tensor& t) {
  const float* p = t.data<float>();
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    if (p[i] != 0.0f) return true;
  }
  return false;
}

TEST(Keras3Fixtures, EvaluateGivesTheH5sStatedAccuracy) {
  const auto r = run_dtrain("evaluate --model " + kKeras3H5);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "test_accuracy: 0.9138")) << r.output;
}

TEST(Keras3Fixtures, EvaluateGivesTheDotKerasStatedAccuracy) {
  const auto r = run_dtrain("evaluate --model " + kKeras3Zip);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "test_accuracy: 0.9051")) << r.output;
}

// Loads `path`, checks Keras's optimizer state came with it (`iterations` steps, Adam slots
// non-zero), trains a few steps and checks the iterations continue and the weights move.
void continues_to_fit(const std::string& path, int64_t iterations) {
  std::unique_ptr<nn::Model> m = load_model(path);
  ASSERT_TRUE(m->compiled());
  ASSERT_NE(m->optimizer(), nullptr);
  EXPECT_EQ(m->optimizer()->get_config().class_name, "Adam");
  EXPECT_EQ(m->optimizer()->iterations(), iterations);
  const auto vars = m->trainable_variables();
  ASSERT_FALSE(vars.empty());
  for (Variable* v : vars) {
    ASSERT_NE(m->optimizer()->slot(*v, "m"), nullptr) << v->name();
    EXPECT_TRUE(any_nonzero(m->optimizer()->slot(*v, "m")->tensor())) << v->name();
    EXPECT_TRUE(any_nonzero(m->optimizer()->slot(*v, "v")->tensor())) << v->name();
  }
  const data::FashionMnist fm = data::fashion_mnist::load_data();
  const int64_t n = 256;
  const Tensor x = fm.x_train.slice(0, n).reshape(Shape{n, 28, 28, 1});
  const Tensor y = fm.y_train.slice(0, n);
  const Tensor before = vars[0]->tensor().clone();
  const nn::Logs start = m->evaluate(x, y, {.batch_size = 64});
  m->fit(x, y, {.epochs = 1, .batch_size = 64, .verbose = 0});
  EXPECT_EQ(m->optimizer()->iterations(), iterations + 4);
  EXPECT_FALSE(vars[0]->tensor().equals(before));
  // A trained model keeps its accuracy on examples it has seen (a fresh optimizer state with
  // the bias correction of step 1 would kick the weights far away).
  EXPECT_GT(m->evaluate(x, y, {.batch_size = 64}).at("accuracy"), start.at("accuracy") - 0.05);
}

TEST(Keras3Fixtures, TheH5ContinuesToFitWithItsOptimizerState) {
  continues_to_fit(kKeras3H5, 15000);
}

TEST(Keras3Fixtures, TheDotKerasContinuesToFitWithItsOptimizerState) {
  continues_to_fit(kKeras3Zip, 17500);
}

}  // namespace
}  // namespace dtrain::train
