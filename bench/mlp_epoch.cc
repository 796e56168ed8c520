// The issue-2 workload: the 784-128-10 MLP on Fashion-MNIST, batch 64, Adam 1e-3, one thread.
// Prints the time of each epoch, evaluate() over the test set, system allocations after the
// first epoch, and peak memory, as "key value" lines for bench/mlp_epoch.sh.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dtrain/core/random.h"
#include "dtrain/data/fashion_mnist.h"
#include "dtrain/nn/layers.h"
#include "dtrain/ops/gemm.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/training.h"

using namespace dtrain;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 3;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  ops::set_num_threads(threads);
  set_random_seed(0);
  const data::FashionMnist fm = data::fashion_mnist::load_data();

  nn::Sequential model({nn::Flatten({.input_shape = Shape{28, 28}}),
                        nn::Dense(128, {.activation = "relu"}), nn::Dense(10)});
  model.compile(
      {.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 1e-3}),
       .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
       .metrics = {"accuracy"}});

  std::vector<double> epoch_seconds;
  Clock::time_point start;
  uint64_t sys_allocs_after_first = 0;
  auto timer = std::make_shared<train::LambdaCallback>(train::LambdaCallbackOptions{
      .on_epoch_begin = [&](int64_t, const nn::Logs&) { start = Clock::now(); },
      .on_epoch_end =
          [&](int64_t e, const nn::Logs&) {
            epoch_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
            if (e == 0) sys_allocs_after_first = allocator_stats().system_allocations;
          }});
  const auto h =
      model.fit(fm.x_train, fm.y_train,
                {.epochs = epochs, .batch_size = 64, .verbose = 0, .callbacks = {timer}});
  const uint64_t sys_allocs_later = allocator_stats().system_allocations - sys_allocs_after_first;

  const auto e0 = Clock::now();
  const nn::Logs test = model.evaluate(fm.x_test, fm.y_test, {.batch_size = 64});
  const double eval_seconds = std::chrono::duration<double>(Clock::now() - e0).count();

  std::vector<double> steady(epoch_seconds.begin() + (epoch_seconds.size() > 1 ? 1 : 0),
                             epoch_seconds.end());
  std::sort(steady.begin(), steady.end());
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  for (size_t i = 0; i < epoch_seconds.size(); ++i) {
    std::printf("epoch_%zu_seconds %.4f\n", i + 1, epoch_seconds[i]);
  }
  std::printf("epoch_seconds_median %.4f\n", steady[steady.size() / 2]);
  std::printf("evaluate_seconds %.4f\n", eval_seconds);
  std::printf("test_accuracy %.4f\n", test.at("accuracy"));
  std::printf("train_loss_last_epoch %.4f\n", h.last("loss"));
  std::printf("system_allocations_after_epoch_1 %llu\n",
              static_cast<unsigned long long>(sys_allocs_later));
  std::printf("peak_rss_mib %.1f\n", ru.ru_maxrss / 1024.0);
  return 0;
}
