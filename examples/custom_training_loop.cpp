// The first tutorial's model and training step in dtrain: a subclassed Keras-style model of
// Dense layers, Adam, and a custom step with a GradientTape. (Checkpointing after every step is
// in examples/checkpoint_sync.cpp once the checkpoint module is built.)
// Run: build/examples/custom_training_loop
#include <cstdio>

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

int main() {
  set_random_seed(1);
  // y = 3·x0 − 2·x1 + 1 with a little noise, 256 examples.
  Philox rng(7);
  Tensor x(Shape{256, 2}), y(Shape{256, 1});
  for (int64_t i = 0; i < 256; ++i) {
    const float a = rng.uniform(-1, 1), b = rng.uniform(-1, 1);
    x.data<float>()[2 * i] = a;
    x.data<float>()[2 * i + 1] = b;
    y.data<float>()[i] = 3 * a - 2 * b + 1 + 0.01f * rng.normal();
  }

  MyModel model;
  model.build(Shape{2});
  optim::Adam optimizer({.learning_rate = 0.01});
  nn::MeanSquaredError loss_fn;
  std::vector<Variable*> vars = model.trainable_variables();

  // @tf.function def train_step(x, y): with tf.GradientTape() as tape: ...
  auto train_step = [&](const Tensor& xb, const Tensor& yb) {
    GradientTape tape;
    const Tensor loss = loss_fn(yb, model(xb, /*training=*/true));
    const std::vector<Tensor> grads = tape.gradient(loss, vars);
    optimizer.apply_gradients(grads, vars);
    return loss.item();
  };

  auto ds = data::Dataset::from_tensor_slices({x, y}).shuffle(256).batch(32);
  for (int64_t epoch = 0; epoch < 30; ++epoch) {
    double total = 0;
    int64_t batches = 0;
    data::Element batch;
    for (auto it = ds.iterator(epoch); it.next(batch); ++batches)
      total += train_step(batch[0], batch[1]);
    if (epoch % 10 == 9)
      std::printf("epoch %lld: loss %.5f\n", static_cast<long long>(epoch + 1), total / batches);
  }
  return 0;
}
