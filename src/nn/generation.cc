// GPTDecoder and generate().
#include "dtrain/nn/generation.h"

#include <algorithm>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/core/error.h"

namespace dtrain::nn {

GPTDecoder::GPTDecoder(GPT& lm) : lm_(lm), caches_(static_cast<size_t>(lm.num_blocks())) {}

void GPTDecoder::reset() {
  for (AttentionCache& c : caches_) c.clear();
  length_ = 0;
}

Tensor GPTDecoder::feed(std::span<const int32_t> ids) {
  NoGradGuard no_grad;
  const int64_t t = static_cast<int64_t>(ids.size());
  const int64_t context = lm_.config().context, d = lm_.config().d_model;
  DTRAIN_CHECK(t >= 1 && length_ + t <= context, "GPT '", lm_.name(), "': cannot decode ", t,
               " more tokens after ", length_, ": the context is ", context);
  Tensor tokens(DType::kInt32, Shape{1, t});
  std::copy(ids.begin(), ids.end(), tokens.data<int32_t>());
  // Token embeddings plus the position rows length_ .. length_ + t − 1.
  const Tensor& table = lm_.position_embedding().embeddings().value();
  Tensor positions(Shape{1, t, d});
  std::copy_n(table.data<float>() + length_ * d, t * d, positions.data<float>());
  Tensor h = add(lm_.token_embedding()(tokens), positions);
  for (size_t i = 0; i < caches_.size(); ++i) {
    TransformerBlock& b = lm_.block(static_cast<int64_t>(i));
    const Tensor r = add(h, b.attention().call_cached(b.ln1()(h), caches_[i]));
    h = add(r, b.ffn_down()(b.ffn_up()(b.ln2()(r))));
  }
  const Tensor logits = lm_.head()(lm_.final_norm()(h));  // [1, t, vocab]
  length_ += t;
  const int64_t vocab = logits.dim(2);
  Tensor last(Shape{vocab});
  std::copy_n(logits.data<float>() + (t - 1) * vocab, vocab, last.data<float>());
  return last;
}

namespace {

// The last-position logits of lm(window): the plain, uncached forward.
Tensor window_logits(GPT& lm, std::span<const int32_t> window) {
  NoGradGuard no_grad;
  const int64_t t = static_cast<int64_t>(window.size());
  Tensor tokens(DType::kInt32, Shape{1, t});
  std::copy(window.begin(), window.end(), tokens.data<int32_t>());
  const Tensor logits = lm(tokens);
  const int64_t vocab = logits.dim(2);
  Tensor last(Shape{vocab});
  std::copy_n(logits.data<float>() + (t - 1) * vocab, vocab, last.data<float>());
  return last;
}

}  // namespace

std::vector<int32_t> generate(GPT& lm, std::span<const int32_t> prompt,
                              const GenerateOptions& options) {
  const int64_t context = lm.config().context;
  const int64_t n = static_cast<int64_t>(prompt.size());
  DTRAIN_CHECK(n >= 1, "generate: the prompt is empty (at least one token is needed)");
  DTRAIN_CHECK(n <= context, "generate: the prompt has ", n,
               " tokens, more than the model's context of ", context,
               "; shorten the prompt to its last ", context, " tokens");
  DTRAIN_CHECK(options.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ",
               options.max_new_tokens);
  Sampler sampler(options.sampler);
  std::vector<int32_t> all(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(options.max_new_tokens));
  GPTDecoder decoder(lm);
  Tensor logits;
  for (int64_t k = 0; k < options.max_new_tokens; ++k) {
    const size_t size = all.size();
    const size_t begin = size > static_cast<size_t>(context) ? size - context : 0;
    const std::span<const int32_t> window(all.data() + begin, size - begin);
    if (!options.use_cache) {
      logits = window_logits(lm, window);
    } else if (k == 0) {
      logits = decoder.feed(window);
    } else if (decoder.length() < context) {
      logits = decoder.feed(window.last(1));
    } else {
      // The window slid: every position moved, so the cache starts over from the window.
      decoder.reset();
      logits = decoder.feed(window);
    }
    const int32_t next = sampler.sample(
        std::span<const float>(logits.data<float>(), static_cast<size_t>(logits.dim(0))));
    all.push_back(next);
    out.push_back(next);
    if (options.on_token) options.on_token(next);
  }
  return out;
}

}  // namespace dtrain::nn
