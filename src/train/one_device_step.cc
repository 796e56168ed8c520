// The step of fit() without a strategy: forward under a tape, loss, gradients and the update,
// all on the calling thread.
#include <tuple>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/nn/output_mask.h"
#include "dtrain/ops/tensor_ops.h"
#include "dtrain/train/preemption.h"
#include "train_step.h"

namespace dtrain::train {
namespace {

class OneDeviceStep final : public TrainStep {
 public:
  OneDeviceStep(nn::Model& model, TrainingState& s, bool skip_nonfinite)
      : model_(model), s_(s), skip_nonfinite_(skip_nonfinite) {}

  void begin() override { trainable_ = model_.trainable_variables(); }

  StepOutcome run(std::span<const StepInput> steps) override {
    const Tensor& x = (*steps[0].batch)[0];
    const Tensor& y = (*steps[0].batch)[1];
    Tensor y_pred, mask;  // mask: the output's Keras mask, which the loss and metrics weight by
    Tensor loss;
    {
      GradientTape tape;
      std::tie(y_pred, mask) = nn::call_with_output_mask(model_, x, /*training=*/true);
      loss = (*s_.loss)(y, y_pred, mask);
      tape.gradient(loss, trainable_, grads_);
    }
    StepOutcome out;
    // The same rule as the replicated step: a non-finite loss or gradient skips the update.
    out.applied = !skip_nonfinite_ || (ops::all_finite(loss) && all_finite(grads_));
    out.stop = preemption_requested();
    if (!out.applied) return out;
    s_.optimizer->apply_gradients(grads_, trainable_);
    const double batch = x.rank() > 0 ? static_cast<double>(x.dim(0)) : 1.0;
    s_.loss_tracker.update_state(loss.item(), batch);
    const Tensor pred = stop_gradient(y_pred);
    for (const auto& m : s_.metrics) m->update_state(y, pred, mask);
    return out;
  }

 private:
  nn::Model& model_;
  TrainingState& s_;
  const bool skip_nonfinite_;
  std::vector<Variable*> trainable_;
  std::vector<Tensor> grads_;  // reused every step
};

}  // namespace

bool all_finite(std::span<const Tensor> grads) {
  for (const Tensor& g : grads) {
    if (g.defined() && !ops::all_finite(g)) return false;
  }
  return true;
}

std::unique_ptr<TrainStep> make_one_device_step(nn::Model& model, TrainingState& s,
                                                const FitOptions& options) {
  return std::make_unique<OneDeviceStep>(model, s, options.skip_nonfinite);
}

}  // namespace dtrain::train
