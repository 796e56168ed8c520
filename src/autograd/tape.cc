// Tape recording and the reverse pass; GradientTape, NoGradGuard and Variable on top of it.
#include "tape.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/core/parallel_for.h"
#include "dtrain/ops/tensor_ops.h"

namespace dtrain::detail {
namespace {

std::atomic<uint64_t> g_next_tape_id{1};

// The thread's stack of live tapes (null = no-grad scope) and its finished tapes, kept so that
// steady-state training reuses them with their vectors' capacity.
struct ThreadState {
  std::vector<Tape*> stack;
  std::vector<std::unique_ptr<Tape>> pool;
};
thread_local ThreadState t_state;

constexpr size_t kMaxPooledTapes = 4;

}  // namespace

Tape::Tape(bool persistent)
    : id_(g_next_tape_id.fetch_add(1, std::memory_order_relaxed)), persistent_(persistent) {}

Tape::~Tape() = default;

std::unique_ptr<Tape> Tape::acquire(bool persistent) {
  auto& pool = t_state.pool;
  if (pool.empty()) return std::make_unique<Tape>(persistent);
  std::unique_ptr<Tape> t = std::move(pool.back());
  pool.pop_back();
  t->id_ = g_next_tape_id.fetch_add(1, std::memory_order_relaxed);
  t->persistent_ = persistent;
  t->recording_ = true;
  t->used_ = false;
  return t;
}

void Tape::release(std::unique_ptr<Tape> tape) {
  tape->nodes_.clear();
  tape->grads_.clear();
  tape->variable_leaves_.clear();
  tape->watched_variables_.clear();
  auto& pool = t_state.pool;
  if (pool.size() < kMaxPooledTapes) pool.push_back(std::move(tape));
}

Tape* Tape::current() {
  auto& s = t_state.stack;
  if (s.empty() || s.back() == nullptr || !s.back()->recording_) return nullptr;
  return s.back();
}

void push_tape(Tape* tape) { t_state.stack.push_back(tape); }

void pop_tape(Tape* tape) {
  auto& s = t_state.stack;
  // Tapes normally die in LIFO order; tolerate otherwise by removing the last matching entry.
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (*it == tape) {
      s.erase(std::next(it).base());
      return;
    }
  }
}

Node& Tape::record(BackwardFn fn, Tensor& out, int32_t in0, int32_t in1, int32_t in2) {
  Node& n = nodes_.emplace_back();
  n.backward = fn;
  n.in[0] = in0;
  n.in[1] = in1;
  n.in[2] = in2;
  out.set_tape_ref({id_, static_cast<int32_t>(nodes_.size() - 1)});
  return n;
}

int32_t Tape::variable_leaf(const Variable& v, bool create) {
  for (const auto& [vid, node] : variable_leaves_) {
    if (vid == v.id()) return node;
  }
  if (!create && std::find(watched_variables_.begin(), watched_variables_.end(), v.id()) ==
                     watched_variables_.end()) {
    return -1;
  }
  nodes_.emplace_back();
  const auto node = static_cast<int32_t>(nodes_.size() - 1);
  variable_leaves_.emplace_back(v.id(), node);
  return node;
}

void Tape::watch_variable(const Variable& v) { watched_variables_.push_back(v.id()); }

void Tape::watch_tensor(Tensor& t) {
  if (node_of(t) >= 0) return;
  nodes_.emplace_back();
  t.set_tape_ref({id_, static_cast<int32_t>(nodes_.size() - 1)});
}

void Tape::accumulate(int32_t node, Tensor g) {
  if (node < 0) return;
  Tensor& slot = grads_[node];
  if (!slot.defined()) {
    g.set_tape_ref({});
    slot = std::move(g);
    return;
  }
  if (slot.use_count() == 1) {
    // Sole owner: add in place (shapes match: every backward reduces to its input's shape).
    float* dst = slot.data<float>();
    const float* src = g.data<float>();
    parallel_for(slot.num_elements(), kParallelGrainElements, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dst[i] += src[i];
    });
  } else {
    slot = ops::binary(ops::BinaryOp::kAdd, slot, g);
  }
}

void Tape::gradient(const Tensor& target, const int32_t* leaves, size_t n, std::vector<Tensor>& out,
                    const std::function<void(size_t)>* on_final) {
  if (used_ && !persistent_) {
    throw FailedPreconditionError(
        "GradientTape.gradient can only be called once on a non-persistent tape; create it "
        "with persistent=true to compute several gradients");
  }
  used_ = true;
  out.resize(n);
  for (auto& t : out) t = Tensor();
  const int32_t root = node_of(target);
  // A leaf's gradient is final once every node recorded after it has been differentiated (its
  // consumers come after it: a leaf is created at the first read), so the pass below hands out
  // leaves in decreasing node order; sources not on the tape are final (undefined) at once.
  final_order_.clear();
  for (size_t k = 0; k < n; ++k) final_order_.emplace_back(root < 0 ? -1 : leaves[k], k);
  // Decreasing node order, sources without a leaf (-1) first; ties in source order. (std::sort:
  // no allocation.)
  const auto key = [](int32_t node) { return node < 0 ? INT32_MAX : node; };
  std::sort(final_order_.begin(), final_order_.end(), [&](const auto& a, const auto& b) {
    return key(a.first) != key(b.first) ? key(a.first) > key(b.first) : a.second < b.second;
  });
  size_t next = 0;
  // Hands out every leaf at or above `node` not handed out yet (node -1: all of them).
  auto finalize_from = [&](int32_t node) {
    for (; next < final_order_.size() && key(final_order_[next].first) >= node; ++next) {
      const auto [leaf, k] = final_order_[next];
      if (leaf >= 0) out[k] = grads_[leaf];
      if (on_final != nullptr) (*on_final)(k);
    }
  };
  if (root < 0) {
    finalize_from(-1);
    return;
  }
  DTRAIN_CHECK(target.dtype() == DType::kFloat32, "GradientTape.gradient: target must be float32");
  grads_.assign(nodes_.size(), Tensor());
  grads_[root] = Tensor::ones(target.shape());
  // Leaves recorded after the target have no path to it.
  finalize_from(root + 1);
  for (int32_t i = root; i >= 0; --i) {
    if (on_final != nullptr) finalize_from(i);  // every node above i is done
    if (!grads_[i].defined() || nodes_[i].backward == nullptr) continue;
    Tensor g = std::move(grads_[i]);
    grads_[i] = Tensor();
    nodes_[i].backward(*this, nodes_[i], std::move(g));
  }
  finalize_from(-1);
  grads_.clear();
  if (!persistent_) {
    // Free the saved activations now, as TF does, and retire the id so that tensors recorded
    // so far no longer refer to this tape.
    nodes_.clear();
    variable_leaves_.clear();
    id_ = g_next_tape_id.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace dtrain::detail

namespace dtrain {

using detail::Tape;

GradientTape::GradientTape(bool persistent) : tape_(Tape::acquire(persistent)) {
  detail::push_tape(tape_.get());
}

GradientTape::~GradientTape() {
  detail::pop_tape(tape_.get());
  Tape::release(std::move(tape_));
}

void GradientTape::watch(Tensor& t) {
  DTRAIN_CHECK(t.defined() && t.dtype() == DType::kFloat32,
               "GradientTape.watch: only float32 tensors can be watched");
  tape_->watch_tensor(t);
}

void GradientTape::watch(const Variable& v) { tape_->watch_variable(v); }

void GradientTape::gradient(const Tensor& target, std::span<Variable* const> sources,
                            std::vector<Tensor>& out) {
  gradient(target, sources, out, nullptr);
}

void GradientTape::gradient(const Tensor& target, std::span<Variable* const> sources,
                            std::vector<Tensor>& out, const std::function<void(size_t)>* on_final) {
  // Leaf lookup without allocating: at most a few dozen variables per model in practice.
  constexpr size_t kInline = 64;
  int32_t inline_leaves[kInline];
  std::vector<int32_t> heap_leaves;
  int32_t* leaves = inline_leaves;
  if (sources.size() > kInline) {
    heap_leaves.resize(sources.size());
    leaves = heap_leaves.data();
  }
  for (size_t k = 0; k < sources.size(); ++k) {
    DTRAIN_CHECK(sources[k] != nullptr, "GradientTape.gradient: source ", k, " is null");
    leaves[k] = tape_->variable_leaf(*sources[k], /*create=*/false);
  }
  const bool was_recording = tape_->recording();
  tape_->set_recording(false);
  tape_->gradient(target, leaves, sources.size(), out, on_final);
  tape_->set_recording(was_recording);
}

std::vector<Tensor> GradientTape::gradient(const Tensor& target,
                                           std::span<Variable* const> sources) {
  std::vector<Tensor> out;
  gradient(target, sources, out);
  return out;
}

std::vector<Tensor> GradientTape::gradient(const Tensor& target,
                                           const std::vector<Tensor>& sources) {
  std::vector<int32_t> leaves(sources.size());
  for (size_t k = 0; k < sources.size(); ++k) leaves[k] = tape_->node_of(sources[k]);
  std::vector<Tensor> out;
  const bool was_recording = tape_->recording();
  tape_->set_recording(false);
  tape_->gradient(target, leaves.data(), leaves.size(), out);
  tape_->set_recording(was_recording);
  return out;
}

Tensor GradientTape::gradient(const Tensor& target, const Tensor& source) {
  return gradient(target, std::vector<Tensor>{source})[0];
}

void GradientTape::stop_recording() { tape_->set_recording(false); }
void GradientTape::resume_recording() { tape_->set_recording(true); }

NoGradGuard::NoGradGuard() { detail::push_tape(nullptr); }
NoGradGuard::~NoGradGuard() { detail::pop_tape(nullptr); }

Tensor stop_gradient(const Tensor& t) {
  Tensor out = t;
  out.set_tape_ref({});
  return out;
}

namespace {
std::atomic<int64_t> g_next_variable_id{1};
std::atomic<uint64_t> g_variables_destroyed{0};
}  // namespace

Variable::Variable(std::string name, Tensor initial, bool trainable)
    : name_(std::move(name)),
      value_(std::move(initial)),
      trainable_(trainable),
      id_(g_next_variable_id.fetch_add(1, std::memory_order_relaxed)) {
  DTRAIN_CHECK(value_.defined(), "Variable '", name_, "': initial value is undefined");
  value_.set_tape_ref({});
}

Variable::~Variable() { g_variables_destroyed.fetch_add(1, std::memory_order_relaxed); }

uint64_t Variable::lifetime_events() {
  return static_cast<uint64_t>(g_next_variable_id.load(std::memory_order_relaxed)) +
         g_variables_destroyed.load(std::memory_order_relaxed);
}

Tensor Variable::value() const {
  Tensor v = value_;
  if (Tape* tape = Tape::current()) {
    const int32_t leaf = tape->variable_leaf(*this, trainable_);
    if (leaf >= 0) v.set_tape_ref({tape->id(), leaf});
  }
  return v;
}

void Variable::assign(const Tensor& v) {
  DTRAIN_CHECK(v.defined() && v.dtype() == value_.dtype() && v.shape() == value_.shape(),
               "Variable '", name_, "': cannot assign ", v.defined() ? dtype_name(v.dtype()) : "",
               v.shape().to_string(), " to a variable of ", dtype_name(value_.dtype()),
               value_.shape().to_string());
  value_.copy_from(v);
}

void Variable::assign_add(const Tensor& v) {
  DTRAIN_CHECK(v.defined() && v.shape() == value_.shape(), "Variable '", name_,
               "': assign_add of shape ", v.shape().to_string(), " to ",
               value_.shape().to_string());
  float* d = value_.data<float>();
  const float* s = v.data<float>();
  for (int64_t i = 0, n = value_.num_elements(); i < n; ++i) d[i] += s[i];
}

void Variable::assign_sub(const Tensor& v) {
  DTRAIN_CHECK(v.defined() && v.shape() == value_.shape(), "Variable '", name_,
               "': assign_sub of shape ", v.shape().to_string(), " to ",
               value_.shape().to_string());
  float* d = value_.data<float>();
  const float* s = v.data<float>();
  for (int64_t i = 0, n = value_.num_elements(); i < n; ++i) d[i] -= s[i];
}

}  // namespace dtrain
