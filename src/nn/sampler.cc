// Sampler: greedy, temperature and top-k sampling.
#include "dtrain/nn/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dtrain/core/error.h"

namespace dtrain::nn {

Sampler::Sampler(SamplerOptions options) : options_(options), rng_(options.seed) {
  DTRAIN_CHECK(std::isfinite(options_.temperature) && options_.temperature >= 0.0f,
               "Sampler: temperature must be finite and >= 0, got ", options_.temperature);
  DTRAIN_CHECK(options_.top_k >= 0, "Sampler: top_k must be >= 0, got ", options_.top_k);
}

int32_t Sampler::sample(std::span<const float> logits) {
  DTRAIN_CHECK(!logits.empty(), "Sampler: empty logits");
  const int64_t n = static_cast<int64_t>(logits.size());
  for (int64_t i = 0; i < n; ++i) {
    DTRAIN_CHECK(!std::isnan(logits[i]) && logits[i] != INFINITY, "Sampler: logit ", i, " is ",
                 logits[i]);
  }
  // Larger logit first, then the lower id.
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (options_.temperature == 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i) {
      if (before(i, best)) best = i;
    }
    return best;
  }
  order_.resize(static_cast<size_t>(n));
  std::iota(order_.begin(), order_.end(), 0);
  size_t k = static_cast<size_t>(n);
  if (options_.top_k > 0 && options_.top_k < n) {
    k = static_cast<size_t>(options_.top_k);
    std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(k), order_.end(),
                      before);
    order_.resize(k);
  }
  // softmax(logits / T) over the candidates, in double, from the largest.
  float top = logits[order_[0]];
  for (int32_t id : order_) top = std::max(top, logits[id]);
  DTRAIN_CHECK(top != -INFINITY, "Sampler: every candidate logit is -inf");
  probs_.resize(k);
  double total = 0;
  for (size_t i = 0; i < k; ++i) {
    const double z = (static_cast<double>(logits[order_[i]]) - top) / options_.temperature;
    probs_[i] = std::exp(z);  // -inf logits give 0
    total += probs_[i];
  }
  const double u = static_cast<double>(rng_.uniform()) * total;
  double acc = 0;
  for (size_t i = 0; i < k; ++i) {
    acc += probs_[i];
    if (u < acc) return order_[i];
  }
  // Rounding: the last candidate with a nonzero probability.
  for (size_t i = k; i-- > 0;) {
    if (probs_[i] > 0) return order_[i];
  }
  return order_[0];
}

}  // namespace dtrain::nn
