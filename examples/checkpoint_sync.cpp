// The first tutorial in dtrain: model synchronization through checkpoints. A subclassed model of
// Dense layers and an Adam optimizer are created inside a MirroredStrategy scope; a custom
// training step runs on every replica with a GradientTape; after every step
// checkpoint.save("<dir>/model.ckpt") writes a TensorFlow-format checkpoint; another process
// calls checkpoint.restore(latest_checkpoint(dir)) and holds exactly the same variables.
//
//   build/examples/checkpoint_sync train /tmp/sync 20     # trains 20 steps, saving after each
//   build/examples/checkpoint_sync restore /tmp/sync      # a second process restores the latest
//
// Both print a CRC-32C of every variable, so the two outputs can be compared line by line.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/core/crc32c.h"
#include "dtrain/distribute/mirrored_strategy.h"
#include "dtrain/dtrain.h"

using namespace dtrain;

// class MyModel(tf.keras.Model): Dense(10, relu) → Dense(10, relu) → Dense(1)
class MyModel : public nn::Model {
 public:
  MyModel() : Model("my_model") {}
  Tensor call(const Tensor& x, bool training) override {
    return dense3_(dense2_(dense1_(x, training), training), training);
  }

 private:
  nn::Dense& dense1_ = add("dense1", nn::Dense(10, {.activation = "relu"}));
  nn::Dense& dense2_ = add("dense2", nn::Dense(10, {.activation = "relu"}));
  nn::Dense& dense3_ = add("dense3", nn::Dense(1));
};

void print_variables(MyModel& model, optim::Optimizer& optimizer) {
  for (Variable* v : model.variables()) {
    std::printf("%-24s crc32c %08x\n", v->name().c_str(),
                crc32c::value(v->tensor().raw_data(), v->tensor().nbytes()));
  }
  std::printf("optimizer iterations %lld\n", static_cast<long long>(optimizer.iterations()));
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s train DIR [STEPS] | restore DIR\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  const int steps = argc > 3 ? std::atoi(argv[3]) : 20;

  // with strategy.scope(): model = MyModel(); optimizer = Adam(); checkpoint = Checkpoint(...)
  distribute::MirroredStrategy strategy(2);
  auto scope = strategy.scope();
  set_random_seed(mode == "train" ? 1 : 2);  // the restoring process starts from other weights
  MyModel model;
  model.build(Shape{4});
  optim::Adam optimizer;
  checkpoint::Checkpoint checkpoint({{"model", model}, {"optimizer", optimizer}});

  if (mode == "restore") {
    // checkpoint.restore(tf.train.latest_checkpoint("./"))
    const std::optional<std::string> latest = checkpoint::latest_checkpoint(dir);
    if (!latest) {
      std::fprintf(stderr, "no checkpoint in %s\n", dir.c_str());
      return 1;
    }
    checkpoint.restore(*latest).assert_consumed();
    std::printf("restored %s\n", latest->c_str());
    print_variables(model, optimizer);
    return 0;
  }

  // y = sum(x) with noise; a global batch of 32 split across the replicas.
  Philox rng(3);
  Tensor x(Shape{32, 4}), y(Shape{32, 1});
  std::vector<Variable*> vars = model.trainable_variables();
  nn::MeanSquaredError loss_fn;
  std::vector<std::vector<Tensor>> grads(strategy.num_local_replicas());
  for (int step = 0; step < steps; ++step) {
    for (int64_t i = 0; i < 32; ++i) {
      float s = 0;
      for (int64_t j = 0; j < 4; ++j) s += x.data<float>()[i * 4 + j] = rng.uniform(-1, 1);
      y.data<float>()[i] = s + 0.01f * rng.normal();
    }
    // strategy.run(train_step): each replica differentiates its slice's loss, scaled by
    // (replica rows / global batch), on its own tape.
    strategy.run([&](int r) {
      const Tensor xr = x.slice(r * 16, (r + 1) * 16), yr = y.slice(r * 16, (r + 1) * 16);
      GradientTape tape;
      const Tensor loss = scale(loss_fn(yr, model(xr, /*training=*/true)), 16.0f / 32.0f);
      grads[r] = tape.gradient(loss, vars);
    });
    // strategy.reduce(SUM, grads): summed in replica order (split over the replica threads) into
    // replica 0's list, then one update of the mirrored variables.
    strategy.reduce_gradients(grads, grads[0], distribute::ReduceOp::kSum);
    optimizer.apply_gradients(grads[0], vars);
    checkpoint.save(dir + "/model.ckpt");  // model.ckpt-1, model.ckpt-2, ...
  }
  std::printf("trained %d steps, saved %s-%lld\n", steps, (dir + "/model.ckpt").c_str(),
              static_cast<long long>(checkpoint.save_counter()));
  print_variables(model, optimizer);
  return 0;
}
