// keras.layers.MultiHeadAttention. Thread-safety as for Layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dtrain/nn/layer.h"
#include "dtrain/nn/layers.h"

namespace dtrain::nn {

struct MultiHeadAttentionOptions {
  std::optional<int64_t> value_dim = std::nullopt;     // per-head value size; default key_dim
  float dropout = 0.0f;                                // on the attention probabilities
  bool use_bias = true;                                // biases on the four projections
  std::optional<int64_t> output_shape = std::nullopt;  // output features; default: query's
  std::string kernel_initializer = "glorot_uniform";   // Keras identifier or config JSON
  std::string bias_initializer = "zeros";
  std::optional<uint64_t> seed = std::nullopt;  // kernel initializer and dropout seed
  std::string name = {};                        // default "multi_head_attention", ...
};

// The optional arguments of a call (Keras's call keywords).
struct AttentionCallOptions {
  Tensor key = {};               // [batch, S, key features]; default: the value
  Tensor attention_mask = {};    // [batch, T, S] (or broadcastable: [T, S], [batch, 1, S], ...),
                                 // nonzero where query t may attend to key s
  bool use_causal_mask = false;  // query t attends to keys s <= t (combined with the mask)
  // Keras masks ([batch, T] for the query, [batch, S] for the value and key; nonzero: a real
  // step), combined with the masks above as Keras's _compute_attention_mask does: query t
  // attends to key s only where query_mask[t], value_mask[s] and key_mask[s] are set. A
  // Sequential or Functional model passes the masks that Embedding(mask_zero) made.
  Tensor query_mask = {};
  Tensor value_mask = {};
  Tensor key_mask = {};
  bool training = false;  // dropout on the probabilities
  // When set, receives the attention probabilities [batch, heads, T, S] (before dropout), as
  // Keras's return_attention_scores.
  Tensor* attention_scores = nullptr;
};

// The projected keys and values of the positions decoded so far, for incremental causal
// self-attention (MultiHeadAttention::call_cached). One cache per layer and sequence batch.
struct AttentionCache {
  Tensor keys;    // [batch, length, num_heads, key_dim]; undefined while empty
  Tensor values;  // [batch, length, num_heads, value_dim]
  int64_t length() const { return keys.defined() ? keys.dim(1) : 0; }
  void clear() { keys = values = Tensor(); }
};

// Multi-head scaled dot-product attention with Keras's weights and names: query/kernel
// [q_features, num_heads, key_dim], query/bias [num_heads, key_dim], key/kernel and key/bias
// alike, value/kernel [v_features, num_heads, value_dim], value/bias [num_heads, value_dim],
// attention_output/kernel [num_heads, value_dim, out], attention_output/bias [out].
//
//   out = attention_output(softmax(q·kᵀ / sqrt(key_dim) + mask) · v)
//
// Inputs are rank 3 ([batch, time, features]; Keras's attention_axes over more axes is not
// supported). Masked positions get −1e9 added before the softmax, as Keras does (a fully
// masked row is uniform). Weights are built on the first call from the query, value and key
// feature sizes; sequence lengths may change between calls.
class MultiHeadAttention : public Layer {
 public:
  MultiHeadAttention(int64_t num_heads, int64_t key_dim, MultiHeadAttentionOptions options = {});
  std::string class_name() const override { return "MultiHeadAttention"; }

  using Layer::operator();
  // mha(query, value, {.use_causal_mask = true}).
  Tensor operator()(const Tensor& query, const Tensor& value,
                    const AttentionCallOptions& options = {});
  // Self-attention: call(x) = mha(x, x).
  Tensor call(const Tensor& x, bool training) override;
  // Self-attention with x's mask as the query, value and key masks; the output keeps the mask.
  Tensor call_with_mask(const Tensor& x, const Tensor& mask, bool training) override;
  bool supports_masking() const override { return true; }

  // Incremental causal self-attention, for decoding (inference only: no dropout, nothing
  // recorded for gradients): x [batch, t, features] are the next t positions; their keys and
  // values are appended to `cache`, and position i of x attends to every cached position and to
  // the new positions up to i. Decoding a sequence in pieces through one cache gives the rows of
  // one call with use_causal_mask = true (up to float rounding). Throws InvalidArgumentError
  // naming the layer when x does not fit the weights or the cache's batch.
  Tensor call_cached(const Tensor& x, AttentionCache& cache);

  // The Functional API's call: inputs {query, value[, key[, attention_mask]]}; outputs {out}
  // or {out, scores} when return_attention_scores is set (set_functional_call_args).
  std::vector<Tensor> call_list(std::span<const Tensor> inputs, bool training) override;
  // The same with the inputs' masks (query, value, key); the output's mask is the query's.
  std::vector<Tensor> call_list_masked(std::span<const Tensor> inputs,
                                       std::span<const Tensor> masks, bool training) override;
  std::vector<Tensor> compute_masks(std::span<const Tensor> inputs, std::span<const Tensor> masks,
                                    size_t num_outputs) const override;
  void build_list(std::span<const Shape> input_shapes) override;
  std::vector<Shape> compute_output_shapes(std::span<const Shape> input_shapes) const override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  // Keras call keywords a Functional graph records with the call.
  void set_functional_call_args(bool use_causal_mask, bool return_attention_scores) {
    functional_causal_ = use_causal_mask;
    functional_scores_ = return_attention_scores;
  }

  std::string config_json() const override;

  int64_t num_heads() const { return num_heads_; }
  int64_t key_dim() const { return key_dim_; }
  int64_t value_dim() const { return value_dim_; }
  // The dropout applied to the probabilities (its RNG state is checkpointable like Dropout's).
  Dropout& dropout_layer() { return dropout_; }

 protected:
  void build_impl(const Shape& input_shape) override;
  // Self-attention through Layer::operator(): any length with the built features.
  bool accepts_input_shape(const Shape& built_for, const Shape& input_shape) const override {
    return same_rank_and_trailing(built_for, input_shape, 1);
  }

 private:
  // Creates the weights for query, value and key feature sizes.
  void build_for(int64_t query_features, int64_t value_features, int64_t key_features);
  Tensor attend(const Tensor& query, const Tensor& value, const AttentionCallOptions& options);
  // The Keras masks and attention_mask (already checked, rank 2 or [B|1, 1, T|1, S|1]) as one
  // selection mask [batch, 1, T, S].
  Tensor combined_mask(const AttentionCallOptions& options, const Tensor& attention_mask,
                       int64_t batch, int64_t t_len, int64_t s_len) const;
  // Whether the Keras masks allow the fused kernel (no query masked; every query sees an
  // unmasked key); sets *key_padding to value_mask ∧ key_mask as [batch, S] (undefined: none).
  bool fusable_masks(const AttentionCallOptions& options, int64_t batch, int64_t t_len,
                     int64_t s_len, Tensor* key_padding) const;
  // context [B, T, N, Hv] through the output dense → [B, T, output features].
  Tensor output_projection(const Tensor& context, int64_t batch, int64_t t_len) const;

  int64_t num_heads_;
  int64_t key_dim_;
  int64_t value_dim_;
  float dropout_rate_;
  bool use_bias_;
  std::optional<int64_t> output_shape_;
  std::shared_ptr<Initializer> kernel_init_;
  std::shared_ptr<Initializer> bias_init_;
  std::optional<uint64_t> seed_;
  Dropout dropout_;
  bool functional_causal_ = false;
  bool functional_scores_ = false;
  bool weights_built_ = false;
  int64_t query_features_ = 0, value_features_ = 0, key_features_ = 0, out_features_ = 0;
  Variable* wq_ = nullptr;
  Variable* bq_ = nullptr;
  Variable* wk_ = nullptr;
  Variable* bk_ = nullptr;
  Variable* wv_ = nullptr;
  Variable* bv_ = nullptr;
  Variable* wo_ = nullptr;
  Variable* bo_ = nullptr;
};

}  // namespace dtrain::nn
