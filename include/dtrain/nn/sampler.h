// Picking the next token from a language model's logits: greedy, or sampling with a temperature
// and top-k from a seeded Philox stream (so a seed gives the same text every run). Not
// thread-safe (the RNG advances on each sample).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/core/random.h"

namespace dtrain::nn {

struct SamplerOptions {
  float temperature = 1.0f;  // 0: greedy (the largest logit, the lowest id on ties)
  int64_t top_k = 0;         // sample among the k largest logits; 0: all
  uint64_t seed = 0;         // the Philox stream's seed
};

class Sampler {
 public:
  // Throws InvalidArgumentError for a negative or non-finite temperature or a negative top_k.
  explicit Sampler(SamplerOptions options = {});
  // An id in [0, logits.size()) drawn from softmax(logits / temperature) restricted to the top_k
  // largest logits (ties broken towards the lower id), or the argmax at temperature 0. One
  // uniform draw per sample. Throws InvalidArgumentError for empty logits, a NaN or +inf logit, or
  // only -inf ones.
  int32_t sample(std::span<const float> logits);

  const SamplerOptions& options() const { return options_; }

 private:
  SamplerOptions options_;
  Philox rng_;
  std::vector<int32_t> order_;  // scratch: candidate ids
  std::vector<double> probs_;   // scratch
};

}  // namespace dtrain::nn
