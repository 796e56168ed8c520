// Shared by the saving tests (saving_test.cc, saving_errors_test.cc): a small data set, a small
// compiled model, fit with per-batch losses, and comparisons of weights and optimizer state.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/nn/layers.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/training.h"

namespace dtrain::train::saving_fixture {

// 256 examples of 8 features in 3 classes given by a fixed random linear teacher (`seed`).
struct Data {
  Tensor x, y;
};

inline Data make_data(uint32_t seed = 1234) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int n = 256, d = 8, k = 3;
  std::vector<float> teacher(d * k), xs(n * d), ys(n);
  for (float& w : teacher) w = normal(gen);
  for (int i = 0; i < n; ++i) {
    float best = -INFINITY;
    for (int j = 0; j < d; ++j) xs[i * d + j] = normal(gen);
    for (int c = 0; c < k; ++c) {
      float s = 0;
      for (int j = 0; j < d; ++j) s += xs[i * d + j] * teacher[j * k + c];
      if (s > best) {
        best = s;
        ys[i] = static_cast<float>(c);
      }
    }
  }
  return {Tensor::from_vector(xs, Shape{n, d}), Tensor::from_vector(ys, Shape{n})};
}

// A fresh model (random initial weights; see same_start for reproducible ones).
inline std::unique_ptr<nn::Sequential> make_model() {
  auto m = std::make_unique<nn::Sequential>(std::initializer_list<nn::LayerRef>{
      nn::Dense(16, {.activation = "relu", .input_shape = Shape{8}}),
      nn::Dense(3, {.activation = "softmax"})});
  return m;
}

// Two fresh models that start from the same weights: the second loads the first's initial
// weights through save_weights/load_weights (model_from_json keeps no initializer seeds, so
// seeded initializers would not survive a save/load round trip of the config).
inline std::pair<std::unique_ptr<nn::Sequential>, std::unique_ptr<nn::Sequential>> same_start(
    const std::string& init_path) {
  auto a = make_model();
  auto c = make_model();
  a->save_weights(init_path);
  c->load_weights(init_path);
  return {std::move(a), std::move(c)};
}

inline void compile_adam(nn::Model& m) {
  m.compile({.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.05}),
             .loss = "sparse_categorical_crossentropy",
             .metrics = {"accuracy"}});
}

// Per-batch losses of each epoch, recovered from the running means fit() reports (every batch
// has the same size here, so loss_k = mean_k·(k+1) − mean_{k−1}·k).
class BatchLosses : public Callback {
 public:
  void on_epoch_begin(int64_t epoch, const Logs&) override {
    epochs.push_back(epoch);
    losses.emplace_back();
    prev_mean_ = 0;
  }
  void on_train_batch_end(int64_t batch, const Logs& logs) override {
    const double mean = logs.at("loss");
    losses.back().push_back(mean * static_cast<double>(batch + 1) -
                            prev_mean_ * static_cast<double>(batch));
    prev_mean_ = mean;
  }
  std::vector<int64_t> epochs;
  std::vector<std::vector<double>> losses;

 private:
  double prev_mean_ = 0;
};

inline History fit_epochs(nn::Model& m, const Data& d, int64_t epochs, int64_t initial_epoch,
                          std::shared_ptr<BatchLosses> recorder) {
  return m.fit(d.x, d.y,
               {.epochs = epochs,
                .batch_size = 32,
                .initial_epoch = initial_epoch,
                .seed = 7,
                .verbose = 0,
                .callbacks = {recorder}});
}

// Compares optimizer state; slot names only when `same_names` (models built separately in one
// process get different default layer names).
inline void expect_same_optimizer_state(nn::Model& a, nn::Model& b, bool same_names = true) {
  optim::Optimizer* oa = a.optimizer();
  optim::Optimizer* ob = b.optimizer();
  ASSERT_NE(oa, nullptr);
  ASSERT_NE(ob, nullptr);
  EXPECT_EQ(oa->iterations(), ob->iterations());
  const auto va = a.trainable_variables();
  const auto vb = b.trainable_variables();
  ASSERT_EQ(va.size(), vb.size());
  ASSERT_EQ(oa->slot_names(), ob->slot_names());
  for (size_t i = 0; i < va.size(); ++i) {
    for (const std::string& s : oa->slot_names()) {
      Variable* sa = oa->slot(*va[i], s);
      Variable* sb = ob->slot(*vb[i], s);
      ASSERT_NE(sa, nullptr) << va[i]->name() << " " << s;
      ASSERT_NE(sb, nullptr) << vb[i]->name() << " " << s;
      if (same_names) {
        EXPECT_EQ(sa->name(), sb->name());
      }
      EXPECT_TRUE(sa->tensor().equals(sb->tensor())) << sa->name();
    }
  }
  const optim::OptimizerConfig ca = oa->get_config();
  const optim::OptimizerConfig cb = ob->get_config();
  EXPECT_EQ(ca.class_name, cb.class_name);
  if (same_names) {
    EXPECT_EQ(ca.name, cb.name);
  }
  EXPECT_EQ(ca.hyperparameters, cb.hyperparameters);
  EXPECT_EQ(ca.learning_rate_schedule != nullptr, cb.learning_rate_schedule != nullptr);
  if (ca.learning_rate_schedule && cb.learning_rate_schedule) {
    EXPECT_EQ(ca.learning_rate_schedule->class_name, cb.learning_rate_schedule->class_name);
    EXPECT_EQ(ca.learning_rate_schedule->scalars, cb.learning_rate_schedule->scalars);
    EXPECT_EQ(ca.learning_rate_schedule->lists, cb.learning_rate_schedule->lists);
    const auto& na = ca.learning_rate_schedule->schedules;
    const auto& nb = cb.learning_rate_schedule->schedules;
    ASSERT_EQ(na.size(), nb.size());
    for (size_t i = 0; i < na.size(); ++i) {
      EXPECT_EQ(na[i].first, nb[i].first);
      EXPECT_EQ(na[i].second.class_name, nb[i].second.class_name);
      EXPECT_EQ(na[i].second.scalars, nb[i].second.scalars);
    }
  }
}

inline void expect_same_weights(nn::Model& a, nn::Model& b, bool same_names = true) {
  const auto wa = a.weights();
  const auto wb = b.weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    if (same_names) {
      EXPECT_EQ(wa[i]->name(), wb[i]->name());
    }
    EXPECT_TRUE(wa[i]->tensor().equals(wb[i]->tensor())) << wa[i]->name();
  }
}

}  // namespace dtrain::train::saving_fixture
