// The issue-12 workload: the built-in CNN (Conv2D(32,3,relu) → MaxPooling2D → Conv2D(64,3,relu)
// → MaxPooling2D → Flatten → Dense(128,relu) → Dense(10)) on Fashion-MNIST [28, 28, 1], batch 64,
// Adam 1e-3. Prints the time of each epoch, evaluate() over the test set, system allocations
// after the first epoch, and peak memory, as "key value" lines for bench/cnn_epoch.sh.
// Usage: bench_cnn_epoch [epochs] [threads] [seed] [steps_per_epoch]
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/core/random.h"
#include "dtrain/data/fashion_mnist.h"
#include "dtrain/nn/convolutional.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/pooling.h"
#include "dtrain/ops/gemm.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/training.h"

using namespace dtrain;
using Clock = std::chrono::steady_clock;

// The process's CPU time (all threads), which a loaded machine changes less than wall time.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The GEMM floor: the GEMMs of one training step as dtrain's im2col lowering issues them (conv1
// forward and dW — its dx is not needed —, conv2 forward, dW and dx, both Dense layers' three),
// timed alone for 938 steps (one epoch), best of three rounds.
double gemm_floor_seconds() {
  struct G {
    bool ta, tb;
    int64_t m, n, k;
  };
  const G gemms[] = {{false, false, 43264, 32, 9},  {true, false, 9, 32, 43264},   // conv1
                     {false, false, 7744, 64, 288}, {true, false, 288, 64, 7744},  // conv2
                     {false, true, 7744, 288, 64},                                 // conv2 dx
                     {false, false, 64, 128, 1600}, {true, false, 1600, 128, 64},  // dense
                     {false, true, 64, 1600, 128},  {false, false, 64, 10, 128},
                     {true, false, 128, 10, 64},    {false, true, 64, 128, 10}};
  std::vector<std::vector<float>> a, b, c;
  for (const G& g : gemms) {
    a.emplace_back(static_cast<size_t>(g.m * g.k), 0.01f);
    b.emplace_back(static_cast<size_t>(g.k * g.n), 0.01f);
    c.emplace_back(static_cast<size_t>(g.m * g.n), 0.0f);
  }
  auto step = [&] {
    for (size_t i = 0; i < std::size(gemms); ++i) {
      const G& g = gemms[i];
      ops::gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a[i].data(), g.ta ? g.m : g.k, b[i].data(),
                g.tb ? g.k : g.n, 0.0f, c[i].data(), g.n);
    }
  };
  for (int i = 0; i < 20; ++i) step();
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
    for (int i = 0; i < 938; ++i) step();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 3;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  const uint64_t seed = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 0;
  const int64_t steps = argc > 4 ? std::atoll(argv[4]) : 0;
  ops::set_num_threads(threads);
  set_random_seed(seed);
  data::FashionMnist fm = data::fashion_mnist::load_data();
  fm.x_train = fm.x_train.reshape(Shape{fm.x_train.dim(0), 28, 28, 1});
  fm.x_test = fm.x_test.reshape(Shape{fm.x_test.dim(0), 28, 28, 1});

  nn::Sequential model(
      {nn::Conv2D(32, {3}, {.activation = "relu", .input_shape = Shape{28, 28, 1}}),
       nn::MaxPooling2D(), nn::Conv2D(64, {3}, {.activation = "relu"}), nn::MaxPooling2D(),
       nn::Flatten(), nn::Dense(128, {.activation = "relu"}), nn::Dense(10)});
  model.compile(
      {.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 1e-3}),
       .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
       .metrics = {"accuracy"}});

  std::vector<double> epoch_seconds, epoch_cpu_seconds;
  Clock::time_point start;
  double cpu_start = 0;
  uint64_t sys_allocs_after_first = 0;
  auto timer = std::make_shared<train::LambdaCallback>(train::LambdaCallbackOptions{
      .on_epoch_begin =
          [&](int64_t, const nn::Logs&) {
            start = Clock::now();
            cpu_start = process_cpu_seconds();
          },
      .on_epoch_end =
          [&](int64_t e, const nn::Logs&) {
            epoch_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
            epoch_cpu_seconds.push_back(process_cpu_seconds() - cpu_start);
            if (e == 0) sys_allocs_after_first = allocator_stats().system_allocations;
          }});
  const auto h =
      model.fit(fm.x_train, fm.y_train,
                {.epochs = epochs,
                 .batch_size = 64,
                 .steps_per_epoch = steps > 0 ? std::optional<int64_t>(steps) : std::nullopt,
                 .verbose = 0,
                 .callbacks = {timer}});
  const uint64_t sys_allocs_later = allocator_stats().system_allocations - sys_allocs_after_first;

  // CNN_SKIP_EVALUATE: training steps only (for profiles).
  const bool skip_evaluate = std::getenv("CNN_SKIP_EVALUATE") != nullptr;
  const auto e0 = Clock::now();
  const nn::Logs test = skip_evaluate ? nn::Logs{{"accuracy", 0.0}}
                                      : model.evaluate(fm.x_test, fm.y_test, {.batch_size = 64});
  const double eval_seconds = std::chrono::duration<double>(Clock::now() - e0).count();

  std::vector<double> steady(epoch_seconds.begin() + (epoch_seconds.size() > 1 ? 1 : 0),
                             epoch_seconds.end());
  std::sort(steady.begin(), steady.end());
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  for (size_t i = 0; i < epoch_seconds.size(); ++i) {
    std::printf("epoch_%zu_seconds %.4f\n", i + 1, epoch_seconds[i]);
    std::printf("epoch_%zu_cpu_seconds %.4f\n", i + 1, epoch_cpu_seconds[i]);
  }
  std::printf("epoch_seconds_median %.4f\n", steady[steady.size() / 2]);
  std::vector<double> steady_cpu(epoch_cpu_seconds.begin() + (epoch_cpu_seconds.size() > 1 ? 1 : 0),
                                 epoch_cpu_seconds.end());
  std::sort(steady_cpu.begin(), steady_cpu.end());
  std::printf("epoch_cpu_seconds_median %.4f\n", steady_cpu[steady_cpu.size() / 2]);
  std::printf("evaluate_seconds %.4f\n", eval_seconds);
  std::printf("test_accuracy %.4f\n", test.at("accuracy"));
  std::printf("train_loss_last_epoch %.4f\n", h.last("loss"));
  std::printf("system_allocations_after_epoch_1 %llu\n",
              static_cast<unsigned long long>(sys_allocs_later));
  std::printf("peak_rss_mib %.1f\n", ru.ru_maxrss / 1024.0);
  if (std::getenv("CNN_SKIP_FLOOR") == nullptr) {
    std::printf("gemm_floor_seconds %.4f\n", gemm_floor_seconds());
  }
  return 0;
}
