// Per-step checkpointing as the first tutorial does it (issue 3), the dtrain side of
// bench/checkpoint_per_step.sh: the Fashion-MNIST MLP (784-128-10, batch 64, Adam 1e-3) trained
// with a GradientTape step, and an async checkpoint (model, optimizer with its two slots, step)
// saved through a CheckpointManager(max_to_keep = 3) every N steps. Prints the epoch times, the
// checkpoint's size, how many were saved and how long save() blocked the loop, as "key value"
// lines. One training thread; the async saves add the checkpoint's writer threads (up to
// max_in_flight saves written concurrently, committed in order).
//
// Usage: bench_checkpoint_per_step DIR EVERY_N_STEPS(0: no checkpoints) [epochs=3]
//        [max_in_flight=CheckpointOptions' default; 1: each save waits for the previous one]
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/checkpoint_manager.h"
#include "dtrain/dtrain.h"

using namespace dtrain;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

uint64_t checkpoint_bytes(const std::string& prefix) {
  uint64_t total = 0;
  struct stat st;
  if (::stat((prefix + ".index").c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
  if (::stat((prefix + ".data-00000-of-00001").c_str(), &st) == 0) {
    total += static_cast<uint64_t>(st.st_size);
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s DIR EVERY_N_STEPS [epochs=3] [max_in_flight]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t every = std::atoll(argv[2]);
  const int epochs = argc > 3 ? std::atoi(argv[3]) : 3;
  checkpoint::CheckpointOptions options{.enable_async = true};
  if (argc > 4) options.max_in_flight = std::atoi(argv[4]);
  ops::set_num_threads(1);
  set_random_seed(0);
  const data::FashionMnist fm = data::fashion_mnist::load_data();

  nn::Sequential model({nn::Flatten({.input_shape = Shape{28, 28}}),
                        nn::Dense(128, {.activation = "relu"}), nn::Dense(10)});
  optim::Adam optimizer({.learning_rate = 1e-3});
  nn::SparseCategoricalCrossentropy loss_fn({.from_logits = true});
  std::vector<Variable*> vars = model.trainable_variables();
  optimizer.build(vars);  // the slots exist from the first checkpoint on, as after one step
  int64_t step = 0;

  // checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
  // manager = tf.train.CheckpointManager(checkpoint, dir, max_to_keep=3)
  fs::remove_all(dir);
  checkpoint::Checkpoint ckpt({{"model", model}, {"optimizer", optimizer}, {"step", step}},
                              options);
  checkpoint::CheckpointManager manager(ckpt, dir, {.max_to_keep = 3});

  auto ds = data::Dataset::from_tensor_slices({fm.x_train, fm.y_train})
                .shuffle(60000, uint64_t{0})
                .batch(64);
  std::vector<double> epoch_seconds, blocked;
  int64_t saves = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const auto t0 = Clock::now();
    data::Element batch;
    for (auto it = ds.iterator(epoch); it.next(batch);) {
      {
        GradientTape tape;
        const Tensor loss = loss_fn(batch[1], model(batch[0], /*training=*/true));
        const std::vector<Tensor> grads = tape.gradient(loss, vars);
        optimizer.apply_gradients(grads, vars);
      }
      ++step;
      if (every > 0 && step % every == 0) {
        const auto s0 = Clock::now();
        manager.save(step);
        blocked.push_back(seconds_since(s0));
        ++saves;
      }
    }
    epoch_seconds.push_back(seconds_since(t0));
  }
  const auto s0 = Clock::now();
  manager.sync();
  const double final_sync = seconds_since(s0);

  std::vector<double> steady(epoch_seconds.begin() + (epoch_seconds.size() > 1 ? 1 : 0),
                             epoch_seconds.end());
  std::sort(steady.begin(), steady.end());
  for (size_t i = 0; i < epoch_seconds.size(); ++i) {
    std::printf("epoch_%zu_seconds %.4f\n", i + 1, epoch_seconds[i]);
  }
  std::printf("epoch_seconds_median %.4f\n", steady[steady.size() / 2]);
  std::printf("steps %lld\n", static_cast<long long>(step));
  std::printf("max_in_flight %d\n", options.max_in_flight);
  std::printf("checkpoints_saved %lld\n", static_cast<long long>(saves));
  if (saves > 0) {
    std::sort(blocked.begin(), blocked.end());
    std::printf("checkpoint_bytes %llu\n",
                static_cast<unsigned long long>(checkpoint_bytes(*manager.latest_checkpoint())));
    std::printf("save_blocking_ms_median %.3f\n", 1e3 * blocked[blocked.size() / 2]);
    std::printf("save_blocking_ms_p90 %.3f\n", 1e3 * blocked[blocked.size() * 9 / 10]);
    std::printf("final_sync_ms %.3f\n", 1e3 * final_sync);
    std::printf("checkpoints_kept %zu\n", manager.checkpoints().size());
  }
  fs::remove_all(dir);
  return 0;
}
