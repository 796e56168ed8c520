// Text generation with nn::GPT: a key/value-cached incremental forward (GPTDecoder) and the
// sampling loop (generate). Uses only GPT's public sub-layer accessors, so the model class
// stays a plain Keras model. Inference only (no dropout, nothing recorded for gradients). Not
// thread-safe: a decoder holds its caches, and it reads the model's weights as they are.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/nn/attention.h"
#include "dtrain/nn/sampler.h"
#include "dtrain/nn/transformer.h"

namespace dtrain::nn {

// The GPT's forward one piece at a time: feed() runs new tokens at the next positions through
// every block, appending their keys and values to one AttentionCache per block, and returns the
// logits of the last one. Feeding a sequence in any pieces gives the last rows of lm(sequence)
// (up to float rounding).
class GPTDecoder {
 public:
  explicit GPTDecoder(GPT& lm);
  // Logits [vocab_size] of the last of `ids` (1 <= size, length() + size <= context). Throws
  // InvalidArgumentError naming the model when the tokens do not fit the context, or the token
  // embedding and the id for an id outside the vocabulary.
  Tensor feed(std::span<const int32_t> ids);
  // Positions fed so far.
  int64_t length() const { return length_; }
  // Forgets every position.
  void reset();

 private:
  GPT& lm_;
  std::vector<AttentionCache> caches_;
  int64_t length_ = 0;
};

struct GenerateOptions {
  int64_t max_new_tokens = 100;
  SamplerOptions sampler = {};
  // false: recompute the whole window for every token (the plain loop; a reference for tests
  // and benchmarks).
  bool use_cache = true;
  // Called with each token as it is sampled (streaming).
  std::function<void(int32_t)> on_token = nullptr;
};

// Continues `prompt` by max_new_tokens sampled tokens and returns them. The prompt must be 1 to
// context tokens long (InvalidArgumentError naming both lengths otherwise). Once prompt and
// output pass the context, the window slides: each next token sees the last `context` tokens
// (recomputed from scratch, as the plain loop does; docs/decisions.md).
std::vector<int32_t> generate(GPT& lm, std::span<const int32_t> prompt,
                              const GenerateOptions& options);

}  // namespace dtrain::nn
