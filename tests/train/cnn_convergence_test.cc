// The built-in CNN (Conv2D(32,3,relu) → MaxPooling2D → Conv2D(64,3,relu) → MaxPooling2D →
// Flatten → Dense(128,relu) → Dense(10)) learns Fashion-MNIST with Adam 1e-3 and batch 64.
// The bar (≥ 0.885 test accuracy after 3 epochs, median of 3 seeds; PyTorch 0.888) takes
// minutes on a loaded 2-core CI machine, so it is measured by bench/cnn_epoch.sh; this test
// trains one seed for kSteps steps (a fraction of one epoch, see kSteps) and checks a bar that
// PyTorch's same model reaches at that point, and that the loss fell.
#include <gtest/gtest.h>

#include "dtrain/core/random.h"
#include "dtrain/data/fashion_mnist.h"
#include "dtrain/nn/convolutional.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/pooling.h"
#include "dtrain/ops/gemm.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/training.h"

namespace dtrain {
namespace {

constexpr int64_t kSteps = 300;  // 19200 examples, a third of an epoch
// PyTorch 1.13 with the same model, batch, optimizer and 300 steps: 0.815 (seed 0); dtrain
// reaches 0.832 here (Keras glorot_uniform init rather than torch's kaiming_uniform). A bar of
// 0.80 fails a model that learns markedly slower than the reference.
constexpr double kMinAccuracy = 0.80;

TEST(CnnConvergence, BuiltInCnnLearnsFashionMnist) {
  ops::set_num_threads(1);
  data::FashionMnist fm = data::fashion_mnist::load_data();
  fm.x_train = fm.x_train.reshape(Shape{fm.x_train.dim(0), 28, 28, 1});
  fm.x_test = fm.x_test.reshape(Shape{fm.x_test.dim(0), 28, 28, 1});
  set_random_seed(0);
  nn::Sequential model(
      {nn::Conv2D(32, {3}, {.activation = "relu", .input_shape = Shape{28, 28, 1}}),
       nn::MaxPooling2D(), nn::Conv2D(64, {3}, {.activation = "relu"}), nn::MaxPooling2D(),
       nn::Flatten(), nn::Dense(128, {.activation = "relu"}), nn::Dense(10)});
  model.compile(
      {.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 1e-3f}),
       .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
       .metrics = {"accuracy"}});
  const nn::Logs before = model.evaluate(fm.x_test.slice(0, 2000), fm.y_test.slice(0, 2000), {});
  const train::History h =
      model.fit(fm.x_train, fm.y_train,
                {.epochs = 1, .batch_size = 64, .steps_per_epoch = kSteps, .verbose = 0});
  const nn::Logs after = model.evaluate(fm.x_test, fm.y_test, {.batch_size = 256});
  std::printf("after %lld steps: train loss %.4f, test loss %.4f (before %.4f), accuracy %.4f\n",
              static_cast<long long>(kSteps), h.last("loss"), after.at("loss"), before.at("loss"),
              after.at("accuracy"));
  EXPECT_LT(after.at("loss"), 0.5 * before.at("loss"));
  EXPECT_GE(after.at("accuracy"), kMinAccuracy);
}

}  // namespace
}  // namespace dtrain
