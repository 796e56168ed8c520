// The recording behind GradientTape: a vector of nodes in creation order (which is a
// topological order), each with a backward function, up to three input node indices and the
// tensors its backward needs. Private to the autograd layer. Not thread-safe: one tape belongs
// to one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/core/tensor.h"

namespace dtrain::detail {

class Tape;
struct Node;

// Differentiates one recorded op: given d target / d output (owned, may be modified in place),
// accumulates d target / d input into the tape for every input with a node.
using BackwardFn = void (*)(Tape& tape, const Node& node, Tensor grad);

struct Node {
  BackwardFn backward = nullptr;  // null for leaves (variables, watched tensors)
  int32_t in[3] = {-1, -1, -1};   // input nodes on this tape; -1: not differentiated
  Tensor saved[3];
  Shape shape[2];
  float f[2] = {0, 0};
  int64_t i[2] = {0, 0};
  // Attributes an op needs beyond the fields above (a convolution's strides and padding),
  // shared with whoever owns them (a layer keeps one shared_ptr and every node copies it, so
  // recording does not allocate).
  std::shared_ptr<const void> attrs;
};

class Tape {
 public:
  explicit Tape(bool persistent);
  ~Tape();

  // A tape from this thread's pool of finished tapes (their vectors keep their capacity, so a
  // training loop that makes one tape per step does not allocate), or a new one.
  static std::unique_ptr<Tape> acquire(bool persistent);
  // Clears the recording and returns the tape to this thread's pool.
  static void release(std::unique_ptr<Tape> tape);

  // The innermost recording tape of this thread, or null.
  static Tape* current();

  uint64_t id() const { return id_; }
  // The node that produced `t` on this tape, or -1.
  int32_t node_of(const Tensor& t) const {
    return t.tape_ref().tape == id_ ? t.tape_ref().node : -1;
  }
  // Appends a node for an op with the given inputs and marks `out` as its output. The
  // reference is valid until the next record().
  Node& record(BackwardFn fn, Tensor& out, int32_t in0, int32_t in1 = -1, int32_t in2 = -1);
  // The leaf node for reads of `v` (created on first read when `create`), or -1.
  int32_t variable_leaf(const Variable& v, bool create);
  void watch_variable(const Variable& v);
  // Makes `t` a leaf of this tape.
  void watch_tensor(Tensor& t);

  // Adds g into the gradient of `node` (ignored for node < 0).
  void accumulate(int32_t node, Tensor g);

  // Runs the backward pass from `target` and returns the gradient for each node in `leaves`
  // (undefined where none reached it). `on_final`, when set, is called on this thread with k as
  // soon as out[k] is final (every node recorded after leaf k has been differentiated), while
  // the pass goes on; out[k] is not written again afterwards.
  void gradient(const Tensor& target, const int32_t* leaves, size_t n, std::vector<Tensor>& out,
                const std::function<void(size_t)>* on_final = nullptr);

  bool recording() const { return recording_; }
  void set_recording(bool r) { recording_ = r; }

 private:
  uint64_t id_;
  bool persistent_;
  bool recording_ = true;
  bool used_ = false;
  std::vector<Node> nodes_;
  std::vector<Tensor> grads_;
  std::vector<std::pair<int64_t, int32_t>> variable_leaves_;  // (variable id, node)
  std::vector<int64_t> watched_variables_;
  std::vector<std::pair<int32_t, size_t>> final_order_;  // (leaf node, k), gradient()'s scratch
};

// Pushes/pops the thread's tape stack; a null entry suspends recording (NoGradGuard).
void push_tape(Tape* tape);
void pop_tape(Tape* tape);

}  // namespace dtrain::detail
