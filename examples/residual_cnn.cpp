// A Functional residual CNN on Fashion-MNIST under MultiWorkerMirroredStrategy: Conv2D →
// BatchNormalization → ReLU blocks joined by Add() skip connections, GlobalAveragePooling2D,
// Dense(10). The batch norm layers are synchronized (Keras's synchronized=True): in training they
// normalize with the moments of the global batch, all-reduced over every replica of every
// worker, so two workers × 32 train as one process with batch 64 does. The chief saves the
// model as a Keras 3 .keras file. The cluster comes from TF_CONFIG, Slurm, Open MPI or dtrain
// launch (docs/distributed.md):
//
//   build/dtrain launch --nproc-per-node 2 -- build/examples/residual_cnn 1 2000
//
// Arguments: epochs (default 1) and the number of training images used (default all 60000).
// With one process and no cluster environment it trains as a single worker.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "dtrain/distribute/multi_worker_mirrored_strategy.h"
#include "dtrain/dtrain.h"
#include "dtrain/nn/activations.h"
#include "dtrain/nn/convolutional.h"
#include "dtrain/nn/functional.h"
#include "dtrain/nn/merging.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/nn/pooling.h"
#include "dtrain/train/saving.h"

using namespace dtrain;

// Conv2D(16, 3×3, same, no bias) → SyncBatchNormalization.
nn::KerasTensor conv_bn(const nn::KerasTensor& x) {
  nn::KerasTensor h = nn::call(nn::Conv2D(16, {3, 3}, {.padding = "same", .use_bias = false}), x);
  return nn::call(nn::BatchNormalization({.synchronized = true}), h);
}

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 1;
  distribute::MultiWorkerMirroredStrategy strategy;
  auto scope = strategy.scope();
  set_random_seed(0);  // the same initial weights and pipeline on every worker

  data::FashionMnist fm = data::fashion_mnist::load_data();
  const int64_t n =
      argc > 2 ? std::min<int64_t>(std::atoll(argv[2]), fm.x_train.dim(0)) : fm.x_train.dim(0);
  const Tensor x_train = fm.x_train.slice(0, n).reshape(Shape{n, 28, 28, 1});
  const Tensor y_train = fm.y_train.slice(0, n);
  const Tensor x_test = fm.x_test.reshape(Shape{fm.x_test.dim(0), 28, 28, 1});
  auto train = data::Dataset::from_tensor_slices({x_train, y_train}).shuffle(10000).batch(64);
  auto test = data::Dataset::from_tensor_slices({x_test, fm.y_test}).batch(256);

  nn::KerasTensor inputs = nn::Input(Shape{28, 28, 1});
  nn::KerasTensor h = nn::call(nn::ReLU(), conv_bn(inputs));
  for (int block = 0; block < 2; ++block) {
    nn::KerasTensor r = conv_bn(nn::call(nn::ReLU(), conv_bn(h)));
    h = nn::call(nn::ReLU(), nn::call(nn::Add(), {h, r}));  // the skip connection
  }
  nn::KerasTensor outputs = nn::call(nn::Dense(10), nn::call(nn::GlobalAveragePooling2D(), h));
  nn::Functional model({inputs}, {outputs}, {.name = "residual_cnn"});
  if (strategy.is_chief()) model.summary();

  model.compile({.optimizer = "adam",
                 .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
                 .metrics = {"accuracy"}});
  model.fit(train, {.epochs = epochs, .verbose = strategy.is_chief() ? -1 : 0});
  const nn::Logs result = model.evaluate(test, {});
  if (strategy.is_chief()) {
    std::printf("%d workers: test loss %.4f, test accuracy %.4f\n", strategy.num_workers(),
                result.at("loss"), result.at("accuracy"));
    model.save("residual_cnn.keras");
    std::printf("saved residual_cnn.keras\n");
  }
  return 0;
}
