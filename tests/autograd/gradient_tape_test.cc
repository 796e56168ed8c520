#include "dtrain/autograd/gradient_tape.h"

#include <gtest/gtest.h>

#include "dtrain/autograd/functions.h"

namespace dtrain {
namespace {

TEST(GradientTape, TrainableVariablesAreWatchedAutomatically) {
  Variable w("w", Tensor::from_vector<float>({1, 2, 3}, Shape{3}));
  Variable frozen("frozen", Tensor::from_vector<float>({4, 5, 6}, Shape{3}), false);
  GradientTape tape;
  const Tensor loss = reduce_sum(multiply(w.value(), frozen.value()));
  const auto grads = tape.gradient(loss, std::vector<Variable*>{&w, &frozen});
  ASSERT_TRUE(grads[0].defined());
  EXPECT_EQ(grads[0].to_vector<float>(), (std::vector<float>{4, 5, 6}));
  EXPECT_FALSE(grads[1].defined());  // not trainable, not watched: None in TF
}

TEST(GradientTape, WatchedNonTrainableVariableGetsAGradient) {
  Variable v("v", Tensor::from_vector<float>({3}, Shape{1}), false);
  GradientTape tape;
  tape.watch(v);
  const Tensor y = square(v.value());
  EXPECT_FLOAT_EQ(tape.gradient(y, std::vector<Variable*>{&v})[0].item(), 6.0);
}

TEST(GradientTape, GradientsOfSharedInputsAccumulate) {
  Variable x("x", Tensor::from_vector<float>({2}, Shape{1}));
  GradientTape tape;
  const Tensor xv = x.value();
  const Tensor y = add(multiply(xv, xv), xv);  // x² + x → 2x + 1
  EXPECT_FLOAT_EQ(tape.gradient(y, std::vector<Variable*>{&x})[0].item(), 5.0);
}

TEST(GradientTape, NonPersistentTapeAnswersOnce) {
  Variable x("x", Tensor::scalar(1.0f));
  GradientTape tape;
  const Tensor y = square(x.value());
  tape.gradient(y, std::vector<Variable*>{&x});
  EXPECT_THROW(tape.gradient(y, std::vector<Variable*>{&x}), FailedPreconditionError);
}

TEST(GradientTape, PersistentTapeAnswersTwice) {
  Variable x("x", Tensor::scalar(3.0f));
  GradientTape tape(/*persistent=*/true);
  const Tensor y = square(x.value());
  const Tensor z = multiply(y, y);  // x⁴
  EXPECT_FLOAT_EQ(tape.gradient(y, std::vector<Variable*>{&x})[0].item(), 6.0);
  EXPECT_FLOAT_EQ(tape.gradient(z, std::vector<Variable*>{&x})[0].item(), 108.0);
}

TEST(GradientTape, StopRecordingAndNoGrad) {
  Variable x("x", Tensor::scalar(3.0f));
  GradientTape tape;
  Tensor y = square(x.value());
  tape.stop_recording();
  const Tensor ignored = multiply(y, y);
  tape.resume_recording();
  {
    NoGradGuard no_grad;
    EXPECT_EQ(multiply(y, y).tape_ref().node, -1);
  }
  EXPECT_FALSE(tape.gradient(ignored, std::vector<Variable*>{&x})[0].defined());
}

TEST(GradientTape, StopGradientBlocksThePath) {
  Variable x("x", Tensor::scalar(3.0f));
  GradientTape tape;
  const Tensor xv = x.value();
  const Tensor y = add(square(xv), stop_gradient(square(xv)));
  EXPECT_FLOAT_EQ(tape.gradient(y, std::vector<Variable*>{&x})[0].item(), 6.0);
}

TEST(GradientTape, NonScalarTargetIsSummed) {
  Variable x("x", Tensor::from_vector<float>({1, 2}, Shape{2}));
  GradientTape tape;
  const Tensor y = scale(x.value(), 3.0f);
  EXPECT_EQ(tape.gradient(y, std::vector<Variable*>{&x})[0].to_vector<float>(),
            (std::vector<float>{3, 3}));
}

TEST(GradientTape, SteadyStateStepsAllocateNoNewBuffers) {
  Variable w("w", Tensor::full(Shape{8, 4}, 0.1));
  Variable b("b", Tensor::zeros(Shape{4}));
  const Tensor x = Tensor::full(Shape{16, 8}, 0.5);
  const Tensor labels = Tensor::from_vector<int64_t>(std::vector<int64_t>(16, 1), Shape{16});
  std::vector<Variable*> vars{&w, &b};
  std::vector<Tensor> grads;
  auto step = [&] {
    GradientTape tape;
    const Tensor logits = dense(x, w.value(), b.value(), Activation::kRelu);
    const Tensor loss = reduce_mean(sparse_softmax_cross_entropy_with_logits(labels, logits));
    tape.gradient(loss, vars, grads);
  };
  step();
  step();
  const auto before = allocator_stats();
  for (int i = 0; i < 10; ++i) step();
  EXPECT_EQ(allocator_stats().system_allocations, before.system_allocations);
}

}  // namespace
}  // namespace dtrain
