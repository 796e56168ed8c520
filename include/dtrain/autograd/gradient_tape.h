// GradientTape, like tf.GradientTape: while a tape is alive on a thread, differentiable ops
// (dtrain/autograd/functions.h) whose inputs come from trainable variables or watched tensors
// are recorded on it; gradient() then runs reverse-mode differentiation over the recording.
//
//   dtrain::GradientTape tape;
//   Tensor loss = loss_fn(y, model(x, /*training=*/true));
//   std::vector<Tensor> grads = tape.gradient(loss, model.trainable_variables());
//
// Tapes are per thread: each thread records on the innermost tape it created (replica threads
// each make their own). Ops are recorded on the innermost live tape only; nested tapes for
// higher-order gradients are not supported. A tape reuses its node storage from the previous
// tape on the same thread, so a training loop does not allocate per step. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/core/tensor.h"

namespace dtrain {

namespace detail {
class Tape;
}

class GradientTape {
 public:
  // A non-persistent tape allows one gradient() call, then frees what it recorded, as in TF.
  explicit GradientTape(bool persistent = false);
  ~GradientTape();
  GradientTape(const GradientTape&) = delete;
  GradientTape& operator=(const GradientTape&) = delete;

  // Makes `t` a differentiation source: later ops on it are recorded. Modifies the handle.
  void watch(Tensor& t);
  // Records reads of a variable even if it is not trainable.
  void watch(const Variable& v);

  // d target / d source for each source; an undefined Tensor where target does not depend on
  // the source (TF returns None). A non-scalar target is summed first, as TF does. Throws
  // FailedPreconditionError when a non-persistent tape is asked twice.
  std::vector<Tensor> gradient(const Tensor& target, std::span<Variable* const> sources);
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Variable*>& sources) {
    return gradient(target, std::span<Variable* const>(sources));
  }
  // The same, writing into `out` (resized to sources.size()) so a loop can reuse its storage.
  void gradient(const Tensor& target, std::span<Variable* const> sources, std::vector<Tensor>& out);
  // The same, calling (*on_final)(k) on this thread as soon as out[k] is final, while the
  // backward pass goes on (fit's replicated step starts the gradient all-reduce from it:
  // DDP's autograd hook). out[k] is not written again after the call.
  void gradient(const Tensor& target, std::span<Variable* const> sources, std::vector<Tensor>& out,
                const std::function<void(size_t k)>* on_final);
  // Gradients with respect to watched tensors.
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Tensor>& sources);
  Tensor gradient(const Tensor& target, const Tensor& source);

  // Stops recording on this tape until resume_recording(); like tape.stop_recording().
  void stop_recording();
  void resume_recording();

 private:
  std::unique_ptr<detail::Tape> tape_;
};

// While alive, ops on this thread are not recorded on any tape (like tf.stop_gradient scopes
// and torch.no_grad). Used by evaluate() and predict().
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;
};

// Returns a tensor with the same value that is never differentiated through.
Tensor stop_gradient(const Tensor& t);

}  // namespace dtrain
