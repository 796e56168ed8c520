// LSTM and GRU forward and backward through time. Index conventions: B batch, T time, F input
// features, u units, G gates (4 LSTM, 3 GRU); step s reads input time tau(s) (reversed with
// go_backwards) and writes states at s; gates live at tau(s).
#include "dtrain/ops/recurrent.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/ops/gemm.h"

namespace dtrain::ops {
namespace {

inline float act(Activation a, float x) {
  switch (a) {
    case Activation::kTanh:
      return std::tanh(x);
    case Activation::kSigmoid:
      return x >= 0 ? 1.0f / (1.0f + std::exp(-x)) : std::exp(x) / (1.0f + std::exp(x));
    case Activation::kRelu:
      return x > 0 ? x : 0.0f;
    default:
      return x;
  }
}

// The derivative at the pre-activation, expressed through the output y = act(x).
inline float act_grad(Activation a, float y) {
  switch (a) {
    case Activation::kTanh:
      return 1.0f - y * y;
    case Activation::kSigmoid:
      return y * (1.0f - y);
    case Activation::kRelu:
      return y > 0 ? 1.0f : 0.0f;
    default:
      return 1.0f;
  }
}

int64_t gate_count(RecurrentCell c) { return c == RecurrentCell::kLstm ? 4 : 3; }

}  // namespace

RecurrentForward recurrent_forward(const RecurrentSpec& spec, const Tensor& x, const Tensor& kernel,
                                   const Tensor& recurrent_kernel, const Tensor& bias,
                                   const char* who, const Tensor& mask) {
  DTRAIN_CHECK(
      spec.activation != Activation::kSoftmax && spec.recurrent_activation != Activation::kSoftmax,
      who, ": softmax is not supported as a recurrent activation");
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() == 3, who,
               ": expected float32 inputs [batch, time, features], got ",
               x.defined() ? x.shape().to_string() : "undefined");
  const int64_t G = gate_count(spec.cell);
  const int64_t B = x.dim(0), T = x.dim(1), F = x.dim(2);
  const int64_t u = recurrent_kernel.dim(0);
  DTRAIN_CHECK(kernel.rank() == 2 && kernel.dim(0) == F && kernel.dim(1) == G * u &&
                   recurrent_kernel.rank() == 2 && recurrent_kernel.dim(1) == G * u,
               who, ": inputs ", x.shape().to_string(), " do not fit kernel ",
               kernel.shape().to_string(), " and recurrent kernel ",
               recurrent_kernel.shape().to_string());
  const bool split_bias = spec.cell == RecurrentCell::kGru;
  if (bias.defined()) {
    DTRAIN_CHECK(split_bias ? bias.shape() == (Shape{2, G * u}) : bias.shape() == (Shape{G * u}),
                 who, ": bias ", bias.shape().to_string(), " does not fit ", u, " units");
  }
  const int64_t GW = 4 * u;                                          // gates row width
  const int64_t SW = spec.cell == RecurrentCell::kLstm ? 2 * u : u;  // states row width
  if (mask.defined()) {
    DTRAIN_CHECK(mask.dtype() == DType::kFloat32 && mask.shape() == (Shape{B, T}), who,
                 ": the mask must be float32 [batch, time] = [", B, ", ", T, "], got ",
                 dtype_name(mask.dtype()), " ", mask.shape().to_string());
  }
  RecurrentForward out{Tensor(Shape{B, T, SW}), Tensor(Shape{B, T, GW}), mask};
  const float* pm = mask.defined() ? mask.data<float>() : nullptr;
  float* gates = out.gates.data<float>();
  float* states = out.states.data<float>();
  const float* W = kernel.data<float>();
  const float* U = recurrent_kernel.data<float>();
  const float* bias_in = bias.defined() ? bias.data<float>() : nullptr;
  const float* bias_rec = bias.defined() && split_bias ? bias_in + G * u : nullptr;
  // Every step's input projection in one GEMM (the bias rides in beta = 1).
  if (bias_in) {
    for (int64_t r = 0; r < B * T; ++r) std::copy_n(bias_in, G * u, gates + r * GW);
  }
  gemm(false, false, B * T, G * u, F, 1.0f, x.data<float>(), F, W, G * u, bias_in ? 1.0f : 0.0f,
       gates, GW);
  if (T == 0 || B == 0 || u == 0) return out;
  const std::vector<float> zeros(static_cast<size_t>(B * u), 0.0f);
  std::vector<float> rec(static_cast<size_t>(B * 3 * u));
  const Activation a = spec.activation, ra = spec.recurrent_activation;
  for (int64_t s = 0; s < T; ++s) {
    const int64_t tau = spec.go_backwards ? T - 1 - s : s;
    const float* hp = s == 0 ? zeros.data() : states + (s - 1) * SW;
    const int64_t hp_ld = s == 0 ? u : T * SW;
    float* z = gates + tau * GW;
    float* h = states + s * SW;
    switch (spec.cell) {
      case RecurrentCell::kLstm:
        gemm(false, false, B, 4 * u, u, 1.0f, hp, hp_ld, U, 4 * u, 1.0f, z, T * GW);
        for (int64_t b = 0; b < B; ++b) {
          float* zb = z + b * T * GW;
          float* hb = h + b * T * SW;
          const float* cpb = s == 0 ? zeros.data() + b * u : hb - SW + u;
          for (int64_t j = 0; j < u; ++j) {
            const float i = act(ra, zb[j]), f = act(ra, zb[u + j]);
            const float g = act(a, zb[2 * u + j]), o = act(ra, zb[3 * u + j]);
            const float c = f * cpb[j] + i * g;
            zb[j] = i;
            zb[u + j] = f;
            zb[2 * u + j] = g;
            zb[3 * u + j] = o;
            hb[j] = o * act(a, c);
            hb[u + j] = c;
          }
        }
        break;
      case RecurrentCell::kGru:
        gemm(false, false, B, 3 * u, u, 1.0f, hp, hp_ld, U, 3 * u, 0.0f, rec.data(), 3 * u);
        for (int64_t b = 0; b < B; ++b) {
          float* zb = z + b * T * GW;
          float* rb = rec.data() + b * 3 * u;
          const float* hpb = hp + b * hp_ld;
          float* hb = h + b * T * SW;
          if (bias_rec) {
            for (int64_t j = 0; j < 3 * u; ++j) rb[j] += bias_rec[j];
          }
          for (int64_t j = 0; j < u; ++j) {
            const float zz = act(ra, zb[j] + rb[j]);
            const float r = act(ra, zb[u + j] + rb[u + j]);
            const float hh = act(a, zb[2 * u + j] + r * rb[2 * u + j]);
            zb[j] = zz;
            zb[u + j] = r;
            zb[2 * u + j] = hh;
            zb[3 * u + j] = rb[2 * u + j];
            hb[j] = zz * hpb[j] + (1.0f - zz) * hh;
          }
        }
        break;
      case RecurrentCell::kGruResetBefore:
        gemm(false, false, B, 2 * u, u, 1.0f, hp, hp_ld, U, 3 * u, 1.0f, z, T * GW);
        for (int64_t b = 0; b < B; ++b) {
          float* zb = z + b * T * GW;
          const float* hpb = hp + b * hp_ld;
          for (int64_t j = 0; j < u; ++j) {
            zb[j] = act(ra, zb[j]);
            zb[u + j] = act(ra, zb[u + j]);
            zb[3 * u + j] = zb[u + j] * hpb[j];  // r·h'
          }
        }
        gemm(false, false, B, u, u, 1.0f, z + 3 * u, T * GW, U + 2 * u, 3 * u, 1.0f, z + 2 * u,
             T * GW);
        for (int64_t b = 0; b < B; ++b) {
          float* zb = z + b * T * GW;
          const float* hpb = hp + b * hp_ld;
          float* hb = h + b * T * SW;
          for (int64_t j = 0; j < u; ++j) {
            const float hh = act(a, zb[2 * u + j]);
            zb[2 * u + j] = hh;
            hb[j] = zb[j] * hpb[j] + (1.0f - zb[j]) * hh;
          }
        }
        break;
    }
    if (pm) {
      // A masked step keeps the previous state (and so the previous output), as Keras's rnn.
      for (int64_t b = 0; b < B; ++b) {
        if (pm[b * T + tau] != 0.0f) continue;
        float* hb = h + b * T * SW;
        if (s == 0) {
          std::fill_n(hb, SW, 0.0f);
        } else {
          std::copy_n(hb - SW, SW, hb);
        }
      }
    }
  }
  return out;
}

RecurrentGradients recurrent_backward(const RecurrentSpec& spec, const Tensor& x,
                                      const Tensor& kernel, const Tensor& recurrent_kernel,
                                      bool has_bias, const RecurrentForward& forward,
                                      const Tensor& d_states, bool need_dx) {
  const int64_t G = gate_count(spec.cell);
  const int64_t B = x.dim(0), T = x.dim(1), F = x.dim(2);
  const int64_t u = recurrent_kernel.dim(0), Gu = G * u;
  const int64_t GW = 4 * u, SW = spec.cell == RecurrentCell::kLstm ? 2 * u : u;
  const Activation a = spec.activation, ra = spec.recurrent_activation;
  const float* U = recurrent_kernel.data<float>();
  const float* gates = forward.gates.data<float>();
  const float* states = forward.states.data<float>();
  const float* dS = d_states.data<float>();
  Tensor dZ = Tensor::zeros(Shape{B, T, Gu});  // pre-activation gradients at tau
  RecurrentGradients out;
  out.drecurrent_kernel = Tensor::zeros(recurrent_kernel.shape());
  float* dU = out.drecurrent_kernel.data<float>();
  std::vector<float> db_rec(static_cast<size_t>(3 * u), 0.0f);
  std::vector<float> dh_next(static_cast<size_t>(B * u), 0.0f), dc_next(dh_next.size(), 0.0f);
  std::vector<float> tmp(static_cast<size_t>(B * 3 * u));
  const std::vector<float> zeros(static_cast<size_t>(B * u), 0.0f);
  float* dz_all = dZ.data<float>();
  const float* pm = forward.mask.defined() ? forward.mask.data<float>() : nullptr;
  // A masked step passed its state through: its gradient goes straight to the previous step.
  std::vector<float> carry_h, carry_c;
  if (pm) {
    carry_h.resize(dh_next.size());
    carry_c.resize(dc_next.size());
  }
  for (int64_t s = T - 1; s >= 0; --s) {
    const int64_t tau = spec.go_backwards ? T - 1 - s : s;
    const float* hp = s == 0 ? zeros.data() : states + (s - 1) * SW;
    const int64_t hp_ld = s == 0 ? u : T * SW;
    const float* z = gates + tau * GW;
    float* dz = dz_all + tau * Gu;
    const float* ds = dS + s * SW;
    auto masked = [&](int64_t b) { return pm != nullptr && pm[b * T + tau] == 0.0f; };
    if (pm) {
      for (int64_t b = 0; b < B; ++b) {
        if (!masked(b)) continue;
        const float* dsb = ds + b * T * SW;
        for (int64_t j = 0; j < u; ++j) {
          carry_h[b * u + j] = dsb[j] + dh_next[b * u + j];
          if (spec.cell == RecurrentCell::kLstm) {
            carry_c[b * u + j] = dsb[u + j] + dc_next[b * u + j];
          }
        }
      }
    }
    switch (spec.cell) {
      case RecurrentCell::kLstm:
        for (int64_t b = 0; b < B; ++b) {
          if (masked(b)) continue;
          const float* zb = z + b * T * GW;
          float* dzb = dz + b * T * Gu;
          const float* dsb = ds + b * T * SW;
          const float* sb = states + (b * T + s) * SW;
          const float* cpb = s == 0 ? zeros.data() + b * u : sb - SW + u;
          for (int64_t j = 0; j < u; ++j) {
            const float i = zb[j], f = zb[u + j], g = zb[2 * u + j], o = zb[3 * u + j];
            const float tc = act(a, sb[u + j]);
            const float dh = dsb[j] + dh_next[b * u + j];
            const float dc = dsb[u + j] + dc_next[b * u + j] + dh * o * act_grad(a, tc);
            dzb[j] = dc * g * act_grad(ra, i);
            dzb[u + j] = dc * cpb[j] * act_grad(ra, f);
            dzb[2 * u + j] = dc * i * act_grad(a, g);
            dzb[3 * u + j] = dh * tc * act_grad(ra, o);
            dc_next[b * u + j] = dc * f;
          }
        }
        gemm(false, true, B, u, 4 * u, 1.0f, dz, T * Gu, U, 4 * u, 0.0f, dh_next.data(), u);
        if (s > 0) gemm(true, false, u, 4 * u, B, 1.0f, hp, hp_ld, dz, T * Gu, 1.0f, dU, 4 * u);
        break;
      case RecurrentCell::kGru:
        for (int64_t b = 0; b < B; ++b) {
          float* tb = tmp.data() + b * 3 * u;
          if (masked(b)) {
            std::fill_n(tb, 3 * u, 0.0f);
            continue;
          }
          const float* zb = z + b * T * GW;
          float* dzb = dz + b * T * Gu;
          const float* hpb = hp + b * hp_ld;
          const float* dsb = ds + b * T * SW;
          for (int64_t j = 0; j < u; ++j) {
            const float zz = zb[j], r = zb[u + j], hh = zb[2 * u + j], rh = zb[3 * u + j];
            const float dh = dsb[j] + dh_next[b * u + j];
            const float dah = dh * (1.0f - zz) * act_grad(a, hh);
            const float daz = dh * (hpb[j] - hh) * act_grad(ra, zz);
            const float dar = dah * rh * act_grad(ra, r);
            dzb[j] = daz;
            dzb[u + j] = dar;
            dzb[2 * u + j] = dah;
            tb[j] = daz;
            tb[u + j] = dar;
            tb[2 * u + j] = dah * r;
            dh_next[b * u + j] = dh * zz;
          }
        }
        gemm(false, true, B, u, 3 * u, 1.0f, tmp.data(), 3 * u, U, 3 * u, 1.0f, dh_next.data(), u);
        if (s > 0) {
          gemm(true, false, u, 3 * u, B, 1.0f, hp, hp_ld, tmp.data(), 3 * u, 1.0f, dU, 3 * u);
        }
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t j = 0; j < 3 * u; ++j) db_rec[j] += tmp[b * 3 * u + j];
        }
        break;
      case RecurrentCell::kGruResetBefore:
        for (int64_t b = 0; b < B; ++b) {
          if (masked(b)) continue;
          const float* zb = z + b * T * GW;
          float* dzb = dz + b * T * Gu;
          const float* hpb = hp + b * hp_ld;
          const float* dsb = ds + b * T * SW;
          for (int64_t j = 0; j < u; ++j) {
            const float zz = zb[j], hh = zb[2 * u + j];
            const float dh = dsb[j] + dh_next[b * u + j];
            dzb[2 * u + j] = dh * (1.0f - zz) * act_grad(a, hh);
            dzb[j] = dh * (hpb[j] - hh) * act_grad(ra, zz);
            dh_next[b * u + j] = dh * zz;
          }
        }
        // d(r·h') = dah · Uhᵀ
        gemm(false, true, B, u, u, 1.0f, dz + 2 * u, T * Gu, U + 2 * u, 3 * u, 0.0f, tmp.data(), u);
        for (int64_t b = 0; b < B; ++b) {
          if (masked(b)) continue;
          const float* zb = z + b * T * GW;
          float* dzb = dz + b * T * Gu;
          const float* hpb = hp + b * hp_ld;
          for (int64_t j = 0; j < u; ++j) {
            const float r = zb[u + j], drh = tmp[b * u + j];
            dzb[u + j] = drh * hpb[j] * act_grad(ra, r);
            dh_next[b * u + j] += drh * r;
          }
        }
        gemm(false, true, B, u, 2 * u, 1.0f, dz, T * Gu, U, 3 * u, 1.0f, dh_next.data(), u);
        if (s > 0) gemm(true, false, u, 2 * u, B, 1.0f, hp, hp_ld, dz, T * Gu, 1.0f, dU, 3 * u);
        gemm(true, false, u, u, B, 1.0f, z + 3 * u, T * GW, dz + 2 * u, T * Gu, 1.0f, dU + 2 * u,
             3 * u);
        break;
    }
    if (pm) {
      for (int64_t b = 0; b < B; ++b) {
        if (!masked(b)) continue;
        std::copy_n(carry_h.data() + b * u, u, dh_next.data() + b * u);
        if (spec.cell == RecurrentCell::kLstm) {
          std::copy_n(carry_c.data() + b * u, u, dc_next.data() + b * u);
        }
      }
    }
  }
  // The input projection's gradients, each one GEMM over every step.
  out.dkernel = Tensor(kernel.shape());
  gemm(true, false, F, Gu, B * T, 1.0f, x.data<float>(), F, dz_all, Gu, 0.0f,
       out.dkernel.data<float>(), Gu);
  if (has_bias) {
    out.dbias =
        spec.cell == RecurrentCell::kGru ? Tensor::zeros(Shape{2, Gu}) : Tensor::zeros(Shape{Gu});
    float* db = out.dbias.data<float>();
    column_sum(dz_all, B * T, Gu, db);
    if (spec.cell == RecurrentCell::kGru) std::copy(db_rec.begin(), db_rec.end(), db + Gu);
  }
  if (need_dx) {
    out.dx = Tensor(x.shape());
    gemm(false, true, B * T, F, Gu, 1.0f, dz_all, Gu, kernel.data<float>(), Gu, 0.0f,
         out.dx.data<float>(), F);
  }
  return out;
}

}  // namespace dtrain::ops
