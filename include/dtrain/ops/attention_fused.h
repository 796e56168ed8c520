// Fused multi-head attention (flash-attention style): softmax(scale · Q·Kᵀ + mask)·V per
// (batch, head) and block of queries, with an online softmax over blocks of keys, so the
// [B, N, T, S] scores and probabilities never exist; the forward saves each query row's
// log-sum-exp and the backward recomputes the probabilities block by block from it. Masks: a
// causal one (key s hidden from query t when s > t) and/or a key padding mask. Every query row
// must see at least one key (see fused_attention_rows_have_keys). AVX2/FMA through
// ops::small_gemm and vector_math.h's exp. No autograd here (dtrain/autograd/attention.h).
//
// Both kernels work on a range [begin, end) of (batch, head) pairs, p = b·heads + n, writing
// only those pairs' slices of their outputs, so disjoint ranges may run on different threads.
// Scratch is per thread and grows once. No allocation per call after the first.
#pragma once

#include <cstdint>

namespace dtrain::ops {

struct FusedAttentionArgs {
  int64_t batch = 0, t = 0, s = 0, heads = 0;
  int64_t key_dim = 0;              // H: query and key features per head
  int64_t value_dim = 0;            // Hv: value features per head
  const float* query = nullptr;     // [B, T, N, H]
  const float* key = nullptr;       // [B, S, N, H]
  const float* value = nullptr;     // [B, S, N, Hv]
  const float* key_mask = nullptr;  // [B, S], nonzero: attend; null for none
  float scale = 1.0f;               // the scores are scale · q·k
  bool causal = false;              // key s is hidden from query t when s > t
};

// out [B, T, N, Hv] and lse [B, N, T] (each row's max + log Σ exp of its scaled, masked
// scores) for the pairs [begin, end).
void fused_attention_forward(const FusedAttentionArgs& a, float* out, float* lse, int64_t begin,
                             int64_t end);

// Given the forward's out and lse and d_out [B, T, N, Hv], overwrites the pairs' slices of
// d_query [B, T, N, H], d_key [B, S, N, H] and d_value [B, S, N, Hv].
void fused_attention_backward(const FusedAttentionArgs& a, const float* out, const float* lse,
                              const float* d_out, float* d_query, float* d_key, float* d_value,
                              int64_t begin, int64_t end);

// Whether every query row sees at least one unmasked key: S > 0 and, per batch row, the key
// mask (null: none) has a nonzero entry — at s = 0 when causal. (Keras makes a fully masked row
// uniform over every key, which the fused kernel does not reproduce; callers take the unfused
// path then.)
bool fused_attention_rows_have_keys(const float* key_mask, int64_t batch, int64_t s, bool causal);

}  // namespace dtrain::ops
