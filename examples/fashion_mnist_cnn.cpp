// A Keras-style CNN on Fashion-MNIST: Conv2D(32, 3, relu) → MaxPooling2D → Conv2D(64, 3, relu)
// → MaxPooling2D → Flatten → Dense(128, relu) → Dense(10), Adam, batch 64; fit, evaluate, save.
// Run: build/examples/fashion_mnist_cnn [epochs] [path.h5]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dtrain/dtrain.h"

using namespace dtrain;

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 3;
  const std::string path = argc > 2 ? argv[2] : "fashion_cnn.h5";
  set_random_seed(0);

  // x_train[..., None]: images [n, 28, 28] get a channel axis [n, 28, 28, 1] (NHWC).
  data::FashionMnist fm = data::fashion_mnist::load_data();
  const Tensor x_train = fm.x_train.reshape(Shape{fm.x_train.dim(0), 28, 28, 1});
  const Tensor x_test = fm.x_test.reshape(Shape{fm.x_test.dim(0), 28, 28, 1});
  auto train = data::Dataset::from_tensor_slices({x_train, fm.y_train}).shuffle(10000).batch(64);
  auto test = data::Dataset::from_tensor_slices({x_test, fm.y_test}).batch(64);

  nn::Sequential model({
      nn::Conv2D(32, {3}, {.activation = "relu", .input_shape = Shape{28, 28, 1}}),
      nn::MaxPooling2D(),
      nn::Conv2D(64, {3}, {.activation = "relu"}),
      nn::MaxPooling2D(),
      nn::Flatten(),
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
  model.save(path);  // Keras HDF5: architecture, weights, optimizer state
  std::printf("saved %s\n", path.c_str());
  return 0;
}
