// Training is bitwise independent of the thread count (ops::set_num_threads: GEMMs in fixed row
// blocks and parallel_for's kernels on one OpenMP team): a few fit() steps of the built-in CNN,
// of a convolutional model with BatchNormalization, and of a small GPT (LayerNormalization, GELU,
// embeddings, AdamW with global_clipnorm) leave every weight with the same bits under 1, 2 and 3
// threads. The shapes are large enough that every parallel_for on the step's path splits. The
// convolutions run on both backends: im2col for 1, 2 and 3 threads; oneDNN (the default) for 1
// and 2 threads only — its jit:avx2 convolutions split their sums by the team size at 3 threads
// (docs/decisions.md), which dtrain does not control.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "dtrain/core/random.h"
#include "dtrain/nn/convolutional.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/losses.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/nn/pooling.h"
#include "dtrain/nn/transformer.h"
#include "dtrain/ops/convolution.h"
#include "dtrain/ops/gemm.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/training.h"

namespace dtrain::train {
namespace {

Tensor normal_images(int64_t n, int64_t h, int64_t w, int64_t c, uint64_t seed) {
  Philox rng(seed);
  std::vector<float> v(static_cast<size_t>(n * h * w * c));
  for (float& x : v) x = rng.normal();
  return Tensor::from_vector(v, Shape{n, h, w, c});
}

Tensor labels(int64_t n, int64_t classes, uint64_t seed, Shape shape = {}) {
  Philox rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& y : v) y = static_cast<int32_t>(rng.uniform_int(static_cast<uint64_t>(classes)));
  return Tensor::from_vector(v, shape.rank() > 0 ? shape : Shape{n});
}

// Every weight's bytes (trainable and not: BatchNormalization's moving statistics too).
std::vector<std::vector<char>> weight_bytes(nn::Model& model) {
  std::vector<std::vector<char>> out;
  for (Variable* v : model.weights()) {
    const Tensor t = v->value();
    const char* p = static_cast<const char*>(t.raw_data());
    out.emplace_back(p, p + t.nbytes());
  }
  return out;
}

// Builds a fresh model (`build`) under each thread count, checks that it starts from the same
// weights, fits it (`train`) and compares the weights with the one-thread run's, bit for bit.
void expect_same_bits_for_every_thread_count(
    const std::function<std::unique_ptr<nn::Model>()>& build,
    const std::function<void(nn::Model&)>& train, std::vector<int> counts = {1, 2, 3}) {
  const int previous = ops::num_threads();
  std::vector<std::vector<char>> initial, reference;
  for (int threads : counts) {
    ops::set_num_threads(threads);
    set_random_seed(7);
    std::unique_ptr<nn::Model> model = build();
    if (threads == 1) {
      initial = weight_bytes(*model);
    } else {
      ASSERT_TRUE(weight_bytes(*model) == initial) << "the models must start alike";
    }
    train(*model);
    std::vector<std::vector<char>> bytes = weight_bytes(*model);
    if (threads == 1) {
      reference = std::move(bytes);
      ASSERT_FALSE(reference.empty());
      ASSERT_FALSE(reference == initial) << "training must change the weights";
      continue;
    }
    ASSERT_EQ(bytes.size(), reference.size());
    const std::vector<Variable*> vars = model->weights();
    for (size_t i = 0; i < bytes.size(); ++i) {
      EXPECT_TRUE(bytes[i] == reference[i])
          << vars[i]->name() << " differs between 1 and " << threads << " threads";
    }
  }
  ops::set_num_threads(previous);
}

// Runs `test` with the im2col convolutions for 1, 2 and 3 threads, then with oneDNN's for 1 and 2.
void on_both_conv_backends(const std::function<void(std::vector<int>)>& test) {
  const ops::ConvBackend previous = ops::conv_backend();
  ops::set_conv_backend(ops::ConvBackend::kIm2col);
  {
    SCOPED_TRACE("im2col convolutions");
    test({1, 2, 3});
  }
  ops::set_conv_backend(ops::ConvBackend::kOnednn);
  {
    SCOPED_TRACE("oneDNN convolutions");
    test({1, 2});
  }
  ops::set_conv_backend(previous);
}

FitOptions few_steps(int64_t batch, int64_t steps) {
  return {
      .epochs = 1, .batch_size = batch, .steps_per_epoch = steps, .shuffle = false, .verbose = 0};
}

TEST(ThreadCountBitwise, TheBuiltInCnnTrainsToTheSameBitsWithOneTwoAndThreeThreads) {
  const Tensor x = normal_images(192, 28, 28, 1, 1);
  const Tensor y = labels(192, 10, 2);
  auto build = [] {
    auto model = std::make_unique<nn::Sequential>(std::initializer_list<nn::LayerRef>{
        nn::Conv2D(32, {3}, {.activation = "relu", .input_shape = Shape{28, 28, 1}}),
        nn::MaxPooling2D(), nn::Conv2D(64, {3}, {.activation = "relu"}), nn::MaxPooling2D(),
        nn::Flatten(), nn::Dense(128, {.activation = "relu"}), nn::Dense(10)});
    model->compile(
        {.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 1e-3}),
         .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
    return model;
  };
  on_both_conv_backends([&](std::vector<int> counts) {
    expect_same_bits_for_every_thread_count(
        build, [&](nn::Model& model) { model.fit(x, y, few_steps(64, 3)); }, counts);
  });
}

TEST(ThreadCountBitwise, BatchNormalizationAndPoolingTrainToTheSameBits) {
  const Tensor x = normal_images(128, 16, 16, 3, 3);
  const Tensor y = labels(128, 5, 4);
  auto build = [] {
    auto model = std::make_unique<nn::Sequential>(std::initializer_list<nn::LayerRef>{
        nn::Conv2D(32, {3}, {.padding = "same", .input_shape = Shape{16, 16, 3}}),
        nn::BatchNormalization(), nn::Activation("gelu"),
        nn::AveragePooling2D({.pool_size = {2, 2}}), nn::Conv2D(32, {3}, {.activation = "tanh"}),
        nn::BatchNormalization(), nn::GlobalAveragePooling2D(), nn::Dense(5)});
    model->compile({.optimizer = std::make_shared<optim::Adam>(),
                    .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
    return model;
  };
  on_both_conv_backends([&](std::vector<int> counts) {
    expect_same_bits_for_every_thread_count(
        build, [&](nn::Model& model) { model.fit(x, y, few_steps(64, 2)); }, counts);
  });
}

TEST(ThreadCountBitwise, ASmallGptTrainsToTheSameBitsWithOneTwoAndThreeThreads) {
  constexpr int64_t kVocab = 57, kContext = 32, kBatch = 16, kSteps = 3;
  const Tensor x = labels(kBatch * kSteps * kContext, kVocab, 5, Shape{kBatch * kSteps, kContext});
  const Tensor y = labels(kBatch * kSteps * kContext, kVocab, 6, Shape{kBatch * kSteps, kContext});
  expect_same_bits_for_every_thread_count(
      [&] {
        auto lm = std::make_unique<nn::GPT>(nn::GPTConfig{.vocab_size = kVocab,
                                                          .context = kContext,
                                                          .num_layers = 2,
                                                          .d_model = 64,
                                                          .num_heads = 4,
                                                          .seed = 11});
        lm->compile({.optimizer = std::make_shared<optim::AdamW>(
                         optim::AdamWOptions{.learning_rate = 3e-4, .global_clipnorm = 1.0}),
                     .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
        return lm;
      },
      [&](nn::Model& model) { model.fit(x, y, few_steps(kBatch, kSteps)); });
}

}  // namespace
}  // namespace dtrain::train
