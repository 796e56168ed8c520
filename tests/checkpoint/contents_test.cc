// Checkpoint::contents(): what a layout writer (the in-memory snapshots) gets at every call,
// with the object graph's walk reused between calls only while it is current.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/nn/model.h"
#include "dtrain/optim/adam.h"
#include "testutil/small_model.h"

namespace dtrain::checkpoint {
namespace {

nn::Sequential make_model() {
  nn::clear_session();  // layer names "dense", "dense_1"
  return testutil::small_model();
}

std::vector<std::string> keys_of(const Checkpoint::Contents& c) {
  std::vector<std::string> out;
  for (const auto& [key, t] : c.tensors) out.push_back(key);
  return out;
}

const Tensor* find(const Checkpoint::Contents& c, const std::string& key) {
  for (const auto& [k, t] : c.tensors) {
    if (k == key) return &t;
  }
  return nullptr;
}

// The values come afresh at every call: the variable's current buffer, not a copy of an earlier
// one, and the save counter as counted.
TEST(CheckpointContents, ValuesAreReadAfreshAtEveryCall) {
  nn::Sequential model = make_model();
  optim::Adam opt;
  testutil::constant_gradient_step(model, opt, 0.5f);
  Checkpoint ckpt({{"model", model}, {"optimizer", opt}});
  const Checkpoint::Contents first = ckpt.contents(/*count_save=*/true);
  testutil::constant_gradient_step(model, opt, 0.25f);
  const Checkpoint::Contents second = ckpt.contents(/*count_save=*/true);
  EXPECT_EQ(first.graph, second.graph);
  EXPECT_EQ(keys_of(first), keys_of(second));
  Variable* kernel = model.trainable_variables()[0];
  const std::string kernel_key = "model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE";
  const Tensor* k = find(second, kernel_key);
  ASSERT_NE(k, nullptr) << "no " << kernel_key;
  EXPECT_TRUE(k->shares_buffer_with(kernel->tensor()));
  const Tensor* counter = find(second, "save_counter/.ATTRIBUTES/VARIABLE_VALUE");
  ASSERT_NE(counter, nullptr);
  EXPECT_EQ(counter->data<int64_t>()[0], 2);
  const Tensor* iterations = find(second, "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE");
  ASSERT_NE(iterations, nullptr);
  EXPECT_EQ(iterations->data<int64_t>()[0], 2);
  // No handle stays behind in the checkpoint: the variable's buffer is shared only by `k`.
  const long uses = kernel->tensor().use_count();
  { const Checkpoint::Contents third = ckpt.contents(false); }
  EXPECT_EQ(kernel->tensor().use_count(), uses);
}

// Slots the optimizer creates after a call are in the next call's graph and values, and slots it
// frees are gone from it (a reused walk would name freed variables).
TEST(CheckpointContents, TheGraphFollowsVariablesThatComeAndGo) {
  nn::Sequential model = make_model();
  optim::Adam opt;
  model.trainable_variables();  // built
  Checkpoint ckpt({{"model", model}, {"optimizer", opt}});
  const Checkpoint::Contents before = ckpt.contents(/*count_save=*/false);
  testutil::constant_gradient_step(model, opt, 0.5f);  // creates m and v for every variable
  const Checkpoint::Contents with_slots = ckpt.contents(/*count_save=*/false);
  EXPECT_NE(before.graph, with_slots.graph);
  const std::vector<Variable*> vars = model.trainable_variables();
  EXPECT_EQ(with_slots.tensors.size(), before.tensors.size() + 2 * vars.size());
  const std::vector<std::string> keys = keys_of(with_slots);
  EXPECT_TRUE(std::any_of(keys.begin(), keys.end(), [](const std::string& k) {
    return k.find("/.OPTIMIZER_SLOT/optimizer/m/") != std::string::npos;
  })) << "no slot m among the keys";

  opt.drop_slots(vars);
  const Checkpoint::Contents dropped = ckpt.contents(/*count_save=*/false);
  EXPECT_EQ(dropped.tensors.size(), before.tensors.size());
  EXPECT_EQ(keys_of(dropped), keys_of(before));
}

}  // namespace
}  // namespace dtrain::checkpoint
