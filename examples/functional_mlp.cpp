// The Functional API on Fashion-MNIST: a two-branch MLP (a wide relu branch and a narrow tanh
// branch, each with a residual Add, joined by Concatenate), compile / fit / evaluate, then
// model.save("functional_mlp.h5") and load_model back. Run:
// build/examples/functional_mlp [epochs]
#include <cstdio>
#include <cstdlib>

#include "dtrain/dtrain.h"
#include "dtrain/train/saving.h"

using namespace dtrain;

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 3;
  set_random_seed(0);

  data::FashionMnist fm = data::fashion_mnist::load_data();
  auto train = data::Dataset::from_tensor_slices({fm.x_train, fm.y_train}).shuffle(10000).batch(64);
  auto test = data::Dataset::from_tensor_slices({fm.x_test, fm.y_test}).batch(64);

  // inputs = keras.Input(shape=(28, 28))
  nn::KerasTensor inputs = nn::Input(Shape{28, 28});
  nn::KerasTensor flat = nn::call(nn::Flatten(), inputs);
  // Branch a: Dense(128, relu) and a residual Dense(128, relu) on top of it.
  nn::KerasTensor a = nn::call(nn::Dense(128, {.activation = "relu"}), flat);
  a = nn::call(nn::Add(), {a, nn::call(nn::Dense(128, {.activation = "relu"}), a)});
  // Branch b: Dense(32, tanh).
  nn::KerasTensor b = nn::call(nn::Dense(32, {.activation = "tanh"}), flat);
  nn::KerasTensor joined = nn::call(nn::Concatenate(), {a, b});
  nn::KerasTensor outputs = nn::call(nn::Dense(10), joined);
  nn::Functional model({inputs}, {outputs}, {.name = "two_branch_mlp"});
  model.summary();

  model.compile({.optimizer = "adam",
                 .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
                 .metrics = {"accuracy"}});
  model.fit(train, {.epochs = epochs, .validation_data = test});
  const nn::Logs result = model.evaluate(test, {});
  std::printf("test loss %.4f, test accuracy %.4f\n", result.at("loss"), result.at("accuracy"));

  model.save("functional_mlp.h5");
  auto loaded = train::load_model("functional_mlp.h5");
  const nn::Logs again = loaded->evaluate(test, {.verbose = 0});
  std::printf("reloaded from functional_mlp.h5: test accuracy %.4f\n", again.at("accuracy"));
  return 0;
}
