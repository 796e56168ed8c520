// Differentiable attention ops: batched matmul, the fused masked/causal softmax, and the two
// products of multi-head attention computed on Keras's [batch, time, heads, dim] layout
// directly (strided GEMMs, no transposes; causal products skip the masked triangle). Thread-safe
// for distinct tensors.
#pragma once

#include "dtrain/core/tensor.h"
#include "dtrain/ops/attention.h"

namespace dtrain {

using ops::MaskedSoftmaxOptions;

// a [..., m, k] · b [..., k, n] with optional transposes (tf.linalg.matmul on batches). Batch
// dimensions equal, or one operand rank 2 (shared by every batch entry).
Tensor batch_matmul(const Tensor& a, const Tensor& b, bool transpose_a = false,
                    bool transpose_b = false);

// softmax(scale · x [+ mask]) over the last axis, with an optional selection or additive mask
// (broadcast to x as NumPy does; never differentiated) and a causal mask computed from the
// indices; see ops::masked_softmax. Differentiable with respect to x.
Tensor masked_softmax(const Tensor& x, const Tensor& mask = Tensor(),
                      const MaskedSoftmaxOptions& options = {});

// Attention scores per head: query [B, T, N, H], key [B, S, N, H] → [B, N, T, S] with
// scores[b, n, t, s] = Σ_h query[b, t, n, h] · key[b, s, n, h] (Keras's
// einsum("aecd,abcd->acbe", key, query)).
// With `causal` (T = S), only the causal part is computed: scores[b, n, t, s] = 0 for s > t, and
// their gradient is ignored (for a causal masked_softmax, which never reads them).
Tensor multihead_scores(const Tensor& query, const Tensor& key, bool causal = false);
// Weighted values: probs [B, N, T, S], value [B, S, N, H] → [B, T, N, H] with
// out[b, t, n, h] = Σ_s probs[b, n, t, s] · value[b, s, n, h] (Keras's
// einsum("acbe,aecd->abcd", probs, value)).
// With `causal` (T = S), probs[b, n, t, s] for s > t is taken as 0 and not read (a causal
// softmax's output), and gets a zero gradient.
Tensor multihead_combine(const Tensor& probs, const Tensor& value, bool causal = false);

struct FusedAttentionOptions {
  float scale = 1.0f;   // the scores are scale · q·k
  bool causal = false;  // key s is hidden from query t when s > t
};

// multihead_combine(masked_softmax(multihead_scores(query, key), mask), value) in one fused op
// (ops::fused_attention_forward): query [B, T, N, H], key [B, S, N, H], value [B, S, N, Hv] →
// [B, T, N, Hv], never materializing [B, N, T, S]. `key_mask` (optional) is [B, S], nonzero:
// attend. Differentiable with respect to query, key and value (the backward recomputes the
// probabilities). Every query row must see an unmasked key (ops::fused_attention_rows_have_keys):
// InvalidArgumentError otherwise, as for shapes that do not fit.
Tensor fused_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                       const Tensor& key_mask = Tensor(),
                       const FusedAttentionOptions& options = {});

}  // namespace dtrain
