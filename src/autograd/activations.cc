// Differentiable activations: forward through ops/activations.h, backward recorded on the tape.
#include "dtrain/autograd/activations.h"

#include <algorithm>
#include <cstring>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "tape.h"

namespace dtrain {

using detail::Node;
using detail::Tape;
using ops::Activation;

namespace {

Tensor writable(Tensor g) { return g.use_count() == 1 ? std::move(g) : g.clone(); }

int64_t cols_of(const Tensor& t) { return t.rank() == 0 ? 1 : std::max<int64_t>(t.dim(-1), 1); }

// out = act(x); i[0] = act, f[0] = α; saved[0] = x when the derivative needs it, saved[1] = out.
void activation_backward(Tape& t, const Node& n, Tensor g) {
  Tensor dz = writable(std::move(g));
  const auto act = static_cast<Activation>(n.i[0]);
  const Tensor& x = n.saved[0];
  const Tensor& y = n.saved[1];
  const Tensor& ref = x.defined() ? x : y;
  const int64_t cols = cols_of(ref);
  ops::activation_backward_inplace(act, y.defined() ? y.data<float>() : nullptr,
                                   x.defined() ? x.data<float>() : nullptr, dz.data<float>(),
                                   ref.num_elements() / cols, cols, n.f[0]);
  t.accumulate(n.in[0], std::move(dz));
}

// out = relu_general(x; f[0] = max_value, f[1] = negative_slope, i[0] = bits of threshold);
// saved[0] = x.
void relu_general_backward(Tape& t, const Node& n, Tensor g) {
  Tensor dz = writable(std::move(g));
  float threshold;
  const auto bits = static_cast<uint32_t>(n.i[0]);
  std::memcpy(&threshold, &bits, sizeof threshold);
  ops::relu_general_backward(n.saved[0].data<float>(), dz.data<float>(), dz.num_elements(), n.f[0],
                             n.f[1], threshold);
  t.accumulate(n.in[0], std::move(dz));
}

Tape* recording_tape(const Tensor& x) {
  Tape* t = Tape::current();
  return t != nullptr && t->node_of(x) >= 0 ? t : nullptr;
}

void check_input(const Tensor& x, const char* what) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32, what, ": expected a float32 tensor",
               x.defined() ? std::string(", got ") + dtype_name(x.dtype()) : std::string());
}

}  // namespace

Tensor activation(const Tensor& x, Activation act, float alpha) {
  check_input(x, ops::activation_name(act));
  if (act == Activation::kLinear) return x;
  Tensor out = x.clone();
  const int64_t cols = cols_of(x);
  ops::activation_inplace(act, out.data<float>(), x.num_elements() / cols, cols, alpha);
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  const bool from_input = ops::activation_needs_input(act);
  Tensor saved_out = from_input ? Tensor() : stop_gradient(out);
  Node& n = t->record(activation_backward, out, t->node_of(x));
  if (from_input) n.saved[0] = stop_gradient(x);
  n.saved[1] = std::move(saved_out);
  n.i[0] = static_cast<int64_t>(act);
  n.f[0] = alpha;
  return out;
}

Tensor activation(const Tensor& x, Activation act) {
  return activation(x, act, ops::default_activation_alpha(act));
}

Tensor relu(const Tensor& x) { return activation(x, Activation::kRelu); }
Tensor sigmoid(const Tensor& x) { return activation(x, Activation::kSigmoid); }
Tensor tanh(const Tensor& x) { return activation(x, Activation::kTanh); }
Tensor softmax(const Tensor& x) { return activation(x, Activation::kSoftmax); }
Tensor gelu(const Tensor& x, bool approximate) {
  return activation(x, approximate ? Activation::kGeluTanh : Activation::kGelu);
}
Tensor swish(const Tensor& x) { return activation(x, Activation::kSwish); }
Tensor leaky_relu(const Tensor& x, float negative_slope) {
  return activation(x, Activation::kLeakyRelu, negative_slope);
}
Tensor elu(const Tensor& x, float alpha) { return activation(x, Activation::kElu, alpha); }
Tensor selu(const Tensor& x) { return activation(x, Activation::kSelu); }
Tensor softplus(const Tensor& x) { return activation(x, Activation::kSoftplus); }
Tensor softsign(const Tensor& x) { return activation(x, Activation::kSoftsign); }
Tensor hard_sigmoid(const Tensor& x) { return activation(x, Activation::kHardSigmoid); }
Tensor exponential(const Tensor& x) { return activation(x, Activation::kExponential); }
Tensor relu6(const Tensor& x) { return activation(x, Activation::kRelu6); }

Tensor relu(const Tensor& x, float negative_slope, float max_value, float threshold) {
  check_input(x, "relu");
  if (negative_slope == 0.0f && max_value < 0.0f && threshold == 0.0f) return relu(x);
  Tensor out(x.shape());
  ops::relu_general(x.data<float>(), out.data<float>(), x.num_elements(), max_value, negative_slope,
                    threshold);
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  Node& n = t->record(relu_general_backward, out, t->node_of(x));
  n.saved[0] = stop_gradient(x);
  n.f[0] = max_value;
  n.f[1] = negative_slope;
  uint32_t bits;
  std::memcpy(&bits, &threshold, sizeof bits);
  n.i[0] = bits;
  return out;
}

}  // namespace dtrain
