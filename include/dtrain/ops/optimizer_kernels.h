// Fused optimizer updates: each function makes one pass over contiguous float32 arrays of n
// elements, reading the gradient and updating the variable and its slots in place, with Keras's
// (TF 2.11+ "new optimizer") arithmetic. The optimizers in dtrain/optim compute the per-step
// scalars (learning rate, bias corrections) and call these per variable. Arrays passed to one
// call must not overlap. Thread-safe for disjoint arrays; no allocation, no exceptions.
#pragma once

#include <cstdint>

namespace dtrain::ops {

// var ← var − var·wd_lr, Keras's decoupled weight decay (wd_lr = weight_decay · learning_rate),
// applied before the optimizer's own update. var [n].
void weight_decay_update(float* var, int64_t n, float wd_lr);

// Plain SGD: var ← var − lr·g. var, g [n].
void sgd_update(float* var, const float* g, int64_t n, float lr);

// SGD with momentum: m ← momentum·m − lr·g; var ← var + m. var, m, g [n].
void sgd_momentum_update(float* var, float* m, const float* g, int64_t n, float lr, float momentum);

// SGD with Nesterov momentum: m ← momentum·m − lr·g; var ← var + momentum·m − lr·g (with the
// new m). var, m, g [n].
void sgd_nesterov_update(float* var, float* m, const float* g, int64_t n, float lr, float momentum);

// Adam (and AdamW when wd_lr > 0), Keras's form with ε outside the bias correction:
//   var ← var − var·wd_lr
//   m ← m + (g − m)·one_minus_beta_1;  v ← v + (g² − v)·one_minus_beta_2
//   var ← var − lr_t·m / (√v + ε),  lr_t = lr·√(1 − β2^t) / (1 − β1^t) computed by the caller.
// The caller passes 1 − β computed in double and rounded once, as Keras does: 1 − float(0.999)
// is off by 1.3e-5 relative. var, m, v, g [n].
void adam_update(float* var, float* m, float* v, const float* g, int64_t n, float lr_t,
                 float one_minus_beta_1, float one_minus_beta_2, float epsilon, float wd_lr = 0.0f);

// Adam with AMSGrad: as adam_update, with v̂ ← max(v̂, v) used in place of v in the step.
// var, m, v, vhat, g [n].
void adam_amsgrad_update(float* var, float* m, float* v, float* vhat, const float* g, int64_t n,
                         float lr_t, float beta_1, float beta_2, float epsilon, float wd_lr = 0.0f);

// RMSprop, Keras's form with ε inside the square root:
//   v ← ρ·v + one_minus_rho·g²   (1 − ρ computed in double by the caller, see adam_update)
//   centered:  a ← ρ·a + one_minus_rho·g;  d = v − a² + ε;   otherwise d = v + ε
//   inc = lr·g / √d
//   with momentum (mom != nullptr): mom ← momentum·mom + inc; var ← var − mom
//   otherwise: var ← var − inc
// var, v, g [n]; mom and avg_grad [n] or nullptr (no momentum / not centered).
void rmsprop_update(float* var, float* v, float* mom, float* avg_grad, const float* g, int64_t n,
                    float lr, float rho, float one_minus_rho, float momentum, float epsilon);

}  // namespace dtrain::ops
