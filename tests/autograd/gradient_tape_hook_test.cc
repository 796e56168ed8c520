// GradientTape::gradient's on_final hook (what the overlapped all-reduce starts from): every
// source is reported once, its gradient is final when reported, and a layer near the loss is
// reported while the layers before it are still being differentiated.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"

namespace dtrain {
namespace {

TEST(GradientTapeHook, ReportsEachSourceOnceWithItsFinalGradientLastLayerFirst) {
  Variable w1("w1", Tensor::from_vector<float>({0.5f, -1.0f, 2.0f}, Shape{3}));
  Variable w2("w2", Tensor::from_vector<float>({3.0f, 1.0f, -2.0f}, Shape{3}));
  Variable unused("unused", Tensor::from_vector<float>({1.0f}, Shape{1}));
  const Tensor x = Tensor::from_vector<float>({1.0f, 2.0f, 3.0f}, Shape{3});
  std::vector<Variable*> sources = {&w1, &w2, &unused};
  std::vector<Tensor> out;
  std::vector<size_t> order;
  std::vector<std::vector<float>> at_report(sources.size());
  const std::function<void(size_t)> on_final = [&](size_t k) {
    order.push_back(k);
    if (out[k].defined()) at_report[k] = out[k].to_vector<float>();
  };
  {
    GradientTape tape;
    // Layer 1 reads w1 twice (its gradient accumulates), layer 2 reads w2 once.
    const Tensor h = add(multiply(w1.value(), x), multiply(w1.value(), w1.value()));
    const Tensor loss = reduce_sum(multiply(h, w2.value()));
    tape.gradient(loss, sources, out, &on_final);
  }
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0], 2u);  // never read: final from the start
  EXPECT_EQ(order[1], 1u);  // w2, read after w1: final before w1's gradient is
  EXPECT_EQ(order[2], 0u);
  EXPECT_FALSE(out[2].defined());
  // d/dw1 = w2 * (x + 2 w1), d/dw2 = x*w1 + w1²: as reported, and unchanged afterwards.
  EXPECT_EQ(at_report[0], (std::vector<float>{3.0f * 2.0f, 1.0f * 0.0f, -2.0f * 7.0f}));
  EXPECT_EQ(at_report[1], (std::vector<float>{0.75f, -1.0f, 10.0f}));
  EXPECT_EQ(out[0].to_vector<float>(), at_report[0]);
  EXPECT_EQ(out[1].to_vector<float>(), at_report[1]);
}

TEST(GradientTapeHook, TargetNotOnTheTapeReportsEverySourceAsUndefined) {
  Variable w("w", Tensor::from_vector<float>({1.0f}, Shape{1}));
  std::vector<Variable*> sources = {&w};
  std::vector<Tensor> out;
  int reports = 0;
  const std::function<void(size_t)> on_final = [&](size_t) { ++reports; };
  GradientTape tape;
  tape.gradient(Tensor::from_vector<float>({1.0f}, Shape{1}), sources, out, &on_final);
  EXPECT_EQ(reports, 1);
  EXPECT_FALSE(out[0].defined());
}

}  // namespace
}  // namespace dtrain
