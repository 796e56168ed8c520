// A GPT-style decoder language model as a subclassed Model (docs/language-model.md):
//
//   nn::GPT lm({.vocab_size = 113, .context = 128, .num_layers = 4, .d_model = 128,
//               .num_heads = 4, .dropout = 0.1f});
//   Tensor logits = lm(tokens);  // int32 [B, T], T <= 128 → float32 [B, T, 113]
//
// token + learned position embeddings, num_layers pre-norm TransformerBlocks, a final
// LayerNormalization and a Dense head to the vocabulary. The sub-layers are public through
// accessors (token_embedding(), blocks(), head(), ...) so that code outside the class (KV-cached
// generation) can run the same weights step by step; those accessors are stable. Thread-safety
// as for Layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/nn/attention.h"
#include "dtrain/nn/embedding.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/model.h"
#include "dtrain/nn/normalization.h"

namespace dtrain::nn {

struct TransformerBlockOptions {
  int64_t d_model = 128;
  int64_t num_heads = 4;
  float dropout = 0.0f;   // attention probabilities and both residual branches
  float epsilon = 1e-5f;  // of both LayerNormalizations (GPT-2's)
  std::optional<uint64_t> seed = std::nullopt;  // initializers and dropout
  std::string name = {};                        // default "transformer_block", ...
};

// One pre-norm decoder block on [batch, T, d_model]:
//   h = x + dropout1(attention(ln1(x), ln1(x), causal))
//   y = h + dropout2(ffn_down(ffn_up(ln2(h))))      ffn_up: Dense(4·d, gelu), ffn_down: Dense(d)
// Sub-layers are named "<block>/ln1", "<block>/attention", "<block>/ln2", "<block>/ffn_up",
// "<block>/ffn_down", "<block>/dropout1", "<block>/dropout2" and tracked under the attributes
// ln1, attention, ln2, ffn_up, ffn_down, dropout1, dropout2. Built at construction; takes any
// T (the causal mask is applied inside the attention).
class TransformerBlock : public Model {
 public:
  explicit TransformerBlock(TransformerBlockOptions options = {});
  std::string class_name() const override { return "TransformerBlock"; }
  Tensor call(const Tensor& x, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }
  std::string config_json() const override;
  const TransformerBlockOptions& options() const { return options_; }

  LayerNormalization& ln1() { return *ln1_; }
  MultiHeadAttention& attention() { return *attention_; }
  LayerNormalization& ln2() { return *ln2_; }
  Dense& ffn_up() { return *ffn_up_; }      // Dense(4·d_model, gelu)
  Dense& ffn_down() { return *ffn_down_; }  // Dense(d_model)
  Dropout& dropout1() { return *dropout1_; }
  Dropout& dropout2() { return *dropout2_; }

 private:
  TransformerBlockOptions options_;
  LayerNormalization* ln1_ = nullptr;
  MultiHeadAttention* attention_ = nullptr;
  LayerNormalization* ln2_ = nullptr;
  Dense* ffn_up_ = nullptr;
  Dense* ffn_down_ = nullptr;
  Dropout* dropout1_ = nullptr;
  Dropout* dropout2_ = nullptr;
};

struct GPTConfig {
  int64_t vocab_size = 0;  // token ids are in [0, vocab_size)
  int64_t context = 128;   // the longest sequence (rows of the position embedding)
  int64_t num_layers = 4;
  int64_t d_model = 128;
  int64_t num_heads = 4;  // d_model must be a multiple of it; key_dim = d_model / num_heads
  float dropout = 0.0f;
  std::optional<uint64_t> seed = std::nullopt;  // derives every sub-layer's seed
  std::string name = {};                        // default "gpt", "gpt_1", ...
};

// The decoder language model. Input: token ids [batch, T] (int32, or any dtype Embedding takes),
// 1 <= T <= context; output: logits float32 [batch, T, vocab_size]. A longer sequence, an input of
// another rank, or an id outside [0, vocab_size) throws InvalidArgumentError naming the model (or
// the token embedding and the id). Sub-layers, named as their checkpoint attributes:
// token_embedding (Embedding(vocab, d)), position_embedding (Embedding(context, d); rows 0..T-1
// are added), block_<i> (TransformerBlock), final_norm (LayerNormalization), head (Dense(vocab),
// linear: the logits). Variables are "<sub-layer>/<weight>" ("block_0/attention/query/kernel").
// Built at construction.
// Serializes: config_json()/to_json() give the config ({"vocab_size", "context", "num_layers",
// "d_model", "num_heads", "dropout", "seed"}; Keras 3 registered name "dtrain>GPT") and
// model_from_json / load_model rebuild it.
class GPT : public Model {
 public:
  explicit GPT(GPTConfig config);
  std::string class_name() const override { return "GPT"; }
  Tensor call(const Tensor& tokens, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string config_json() const override;
  // Keras's model JSON: {"class_name": "GPT", "config": config_json(), "keras_version", ...}.
  std::string to_json() const override;
  // Rebuilds from the "config" object of to_json() (also Keras 3's with "registered_name").
  // Throws InvalidArgumentError naming `where` and the field.
  static std::unique_ptr<GPT> from_config(const std::string& config_json,
                                          const std::string& where = "GPT config");

  const GPTConfig& config() const { return config_; }
  Embedding& token_embedding() { return *token_embedding_; }
  Embedding& position_embedding() { return *position_embedding_; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  TransformerBlock& block(int64_t i) { return *blocks_.at(static_cast<size_t>(i)); }
  const std::vector<TransformerBlock*>& blocks() const { return blocks_; }
  LayerNormalization& final_norm() { return *final_norm_; }
  Dense& head() { return *head_; }

 private:
  GPTConfig config_;
  Embedding* token_embedding_ = nullptr;
  Embedding* position_embedding_ = nullptr;
  std::vector<TransformerBlock*> blocks_;
  LayerNormalization* final_norm_ = nullptr;
  Dense* head_ = nullptr;
};

}  // namespace dtrain::nn
