// The second tutorial's multi-worker flow: a Sequential model (Dense 128 relu, Dense 10) under
// MultiWorkerMirroredStrategy, a dataset from tensors, shuffle, batch 64 (the global batch),
// compile / fit with validation data / evaluate, then model.save("mnist_model.h5") on the
// chief, with the tutorial's two options made real: report_tensorboard (TensorBoard event files
// under logs/) and save_checkpoints (exact recovery after a restart). The cluster comes from
// TF_CONFIG, Slurm, Open MPI or dtrain launch (docs/distributed.md):
//
//   build/dtrain launch --nproc-per-node 2 --max-restarts 3 --
//   build/examples/fashion_mnist_multi_worker
//
// With one process and no cluster environment it trains as a single worker.
#include <cstdio>
#include <cstdlib>

#include "dtrain/distribute/multi_worker_mirrored_strategy.h"
#include "dtrain/dtrain.h"
#include "dtrain/train/preemption.h"
#include "dtrain/train/saving.h"

using namespace dtrain;

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 5;
  // MultiWorkerMirroredStrategy(report_tensorboard=true): the chief writes TensorBoard files.
  distribute::MultiWorkerMirroredStrategy strategy({.report_tensorboard = true, .logdir = "logs"});
  auto scope = strategy.scope();
  set_random_seed(0);  // the same pipeline seeds on every worker: each takes its part of a batch

  data::FashionMnist fm = data::fashion_mnist::load_data();
  auto train = data::Dataset::from_tensor_slices({fm.x_train, fm.y_train}).shuffle(10000).batch(64);
  auto test = data::Dataset::from_tensor_slices({fm.x_test, fm.y_test}).batch(64);

  nn::Sequential model({
      nn::Flatten({.input_shape = Shape{28, 28}}),
      nn::Dense(128, {.activation = "relu"}),
      nn::Dense(10),
  });
  model.compile({.optimizer = "adam",
                 .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
                 .metrics = {"accuracy"}});
  // save_checkpoints=true: back up every 200 steps and resume exactly after a restart.
  try {
    model.fit(train, {.epochs = epochs,
                      .validation_data = test,
                      .verbose = strategy.is_chief() ? -1 : 0,
                      .save_checkpoints = true,
                      .checkpoint_dir = "fashion_mnist_backup",
                      .checkpoint_every = 200});
  } catch (const train::PreemptedError& e) {
    // SIGTERM: the state is backed up; the exit code (143) tells the job manager to retry.
    std::fprintf(stderr, "%s\n", e.what());
    return e.exit_code();
  }
  const nn::Logs result = model.evaluate(test, {});
  if (strategy.is_chief()) {
    std::printf("%d workers: test loss %.4f, test accuracy %.4f\n", strategy.num_workers(),
                result.at("loss"), result.at("accuracy"));
    model.save("mnist_model.h5");
    std::printf("saved mnist_model.h5\n");
  }
  return 0;
}
