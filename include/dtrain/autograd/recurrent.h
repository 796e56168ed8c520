// Differentiable recurrent sequences (LSTM, GRU) and the slicing that takes outputs and final
// states out of them. Thread-safe for distinct tensors.
#pragma once

#include <cstdint>

#include "dtrain/core/tensor.h"
#include "dtrain/ops/recurrent.h"

namespace dtrain {

// Runs an LSTM or GRU over x [B, T, F] from a zero state (see ops::recurrent_forward) and
// returns its states: LSTM [B, T, 2u] (h then c per step), GRU [B, T, u]. Differentiable with
// respect to x, the kernels and the bias (backpropagation through time). `who` names the layer
// in errors. `mask` (optional float32 [B, T]): masked steps keep the previous state.
Tensor recurrent_sequence(const ops::RecurrentSpec& spec, const Tensor& x, const Tensor& kernel,
                          const Tensor& recurrent_kernel, const Tensor& bias, const char* who,
                          const Tensor& mask = Tensor());

// x [B, T, F] → x[:, t_begin:t_end, f_begin:f_end] (a copy); differentiable.
Tensor slice_sequence(const Tensor& x, int64_t t_begin, int64_t t_end, int64_t f_begin,
                      int64_t f_end);

// a [..., m] ++ b [..., n] → [..., m + n] (equal leading dimensions); differentiable. (A
// minimal concat for Bidirectional's merge; the Functional API brings a general one.)
Tensor concat_last_axis(const Tensor& a, const Tensor& b);

// Reverses x [B, T, ...] along time; differentiable.
Tensor reverse_sequence(const Tensor& x);

}  // namespace dtrain
