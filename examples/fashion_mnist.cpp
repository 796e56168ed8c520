// The second tutorial's flow in dtrain, on one process: a Sequential model (Dense 128 relu,
// Dense 10), a tf.data-style pipeline over Fashion-MNIST scaled to [0, 1], compile / fit /
// evaluate. Run: build/examples/fashion_mnist [epochs]
#include <cstdio>
#include <cstdlib>

#include "dtrain/dtrain.h"

using namespace dtrain;

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 5;
  set_random_seed(0);  // reproducible initial weights and shuffles

  // (x_train, y_train), (x_test, y_test) = fashion_mnist.load_data(); x / 255.0
  data::FashionMnist fm = data::fashion_mnist::load_data();

  // tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10000).batch(64)
  auto train = data::Dataset::from_tensor_slices({fm.x_train, fm.y_train}).shuffle(10000).batch(64);
  auto test = data::Dataset::from_tensor_slices({fm.x_test, fm.y_test}).batch(64);

  nn::Sequential model({
      nn::Flatten({.input_shape = Shape{28, 28}}),
      nn::Dense(128, {.activation = "relu"}),
      nn::Dense(10),
  });
  model.summary();
  model.compile({.optimizer = "adam",
                 .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
                 .metrics = {"accuracy"}});
  model.fit(train, {.epochs = epochs, .validation_data = test});
  const nn::Logs result = model.evaluate(test, {});
  std::printf("test loss %.4f, test accuracy %.4f\n", result.at("loss"), result.at("accuracy"));
  return 0;
}
