// Kernels for LSTM and GRU over whole sequences: the input projection of every step is one
// GEMM, each step one GEMM with the recurrent kernel plus one elementwise pass; the backward
// runs through time in reverse. Keras's gate layouts: LSTM columns (i, f, c, o), GRU (z, r, h).
// No autograd here (see dtrain/autograd/recurrent.h). Thread-safe for distinct outputs.
#pragma once

#include <cstdint>

#include "dtrain/core/tensor.h"
#include "dtrain/ops/tensor_ops.h"

namespace dtrain::ops {

enum class RecurrentCell {
  kLstm,            // c = f·c' + i·act(x Wc + h' Uc + bc), h = o·act(c)
  kGru,             // reset_after=True: hh = act(x Wh + bh + r·(h' Uh + rbh)); bias [2, 3u]
  kGruResetBefore,  // reset_after=False: hh = act(x Wh + (r·h') Uh + bh); bias [3u]
};

struct RecurrentSpec {
  RecurrentCell cell = RecurrentCell::kLstm;
  Activation activation = Activation::kTanh;               // linear, relu, sigmoid or tanh
  Activation recurrent_activation = Activation::kSigmoid;  // for the gates
  bool go_backwards = false;  // step s reads input time T − 1 − s (outputs stay in step order)
};

// What the forward keeps for the backward.
struct RecurrentForward {
  // LSTM: [B, T, 2u] (h_s then c_s after step s); GRU: [B, T, u] (h_s).
  Tensor states;
  // [B, T, 4u] at input time positions: LSTM the activated gates (i, f, g, o); GRU (z, r, hh)
  // and, for reset_after, the recurrent projection h'·Uh + rbh (else r·h').
  Tensor gates;
  // The mask the forward ran with (float32 [B, T] at input time positions) or undefined.
  Tensor mask;
};

// x [B, T, F], kernel [F, G·u], recurrent_kernel [u, G·u] (G = 4 for LSTM, 3 for GRU), bias
// [G·u] ([2, 3u] for kGru) or undefined. The initial state is zero. `mask` (optional, float32
// [B, T], indexed by input time): where it is 0 the step keeps the previous state, as Keras's
// masked rnn (the gradient passes through). Throws InvalidArgumentError naming `who` and the
// shapes when they do not fit.
RecurrentForward recurrent_forward(const RecurrentSpec& spec, const Tensor& x, const Tensor& kernel,
                                   const Tensor& recurrent_kernel, const Tensor& bias,
                                   const char* who, const Tensor& mask = Tensor());

struct RecurrentGradients {
  Tensor dx, dkernel, drecurrent_kernel, dbias;  // dx / dbias undefined when not asked for
};

// Backpropagation through time given d states (the shape of forward.states).
RecurrentGradients recurrent_backward(const RecurrentSpec& spec, const Tensor& x,
                                      const Tensor& kernel, const Tensor& recurrent_kernel,
                                      bool has_bias, const RecurrentForward& forward,
                                      const Tensor& d_states, bool need_dx);

}  // namespace dtrain::ops
