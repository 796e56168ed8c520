// A character-level GPT on the fortunes text (docs/language-model.md): build the tokenizer and
// next-token windows, nn::GPT, compile with AdamW + global_clipnorm, fit a few steps, report the
// validation loss, save lm.keras with its tokenizer and load both back. Run:
// build/examples/char_lm [steps] [output.keras]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dtrain/data/fortunes.h"
#include "dtrain/data/text.h"
#include "dtrain/data/tokenizer.h"
#include "dtrain/dtrain.h"
#include "dtrain/nn/transformer.h"
#include "dtrain/train/saving.h"

using namespace dtrain;

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 50;
  const std::string out = argc > 2 ? argv[2] : "lm.keras";
  set_random_seed(0);
  constexpr int64_t kContext = 64;

  // The corpus as ids, the last 10% held out.
  const std::string text = data::fortunes::load_text();
  const data::CharTokenizer tok = data::CharTokenizer::build(text);
  const Tensor ids = tok.encode_tensor(text);
  const int64_t split = ids.num_elements() * 9 / 10;
  auto windows = [&](int64_t begin, int64_t end) {
    Tensor part = Tensor::from_vector<int32_t>(
        std::vector<int32_t>(ids.data<int32_t>() + begin, ids.data<int32_t>() + end),
        Shape{end - begin});
    return data::token_windows(part, {.sequence_length = kContext, .stride = kContext});
  };
  auto train = windows(0, split).shuffle(10000).batch(32).repeat();
  auto val = windows(split, ids.num_elements()).take(20 * 16).batch(16);

  nn::GPT lm({.vocab_size = tok.vocab_size(),
              .context = kContext,
              .num_layers = 2,
              .d_model = 64,
              .num_heads = 4,
              .dropout = 0.1f});
  lm.summary();
  lm.compile({.optimizer = std::make_shared<optim::AdamW>(
                  optim::AdamWOptions{.learning_rate = 3e-3, .global_clipnorm = 1.0}),
              .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
              .metrics = {"accuracy"}});
  lm.fit(train, {.epochs = 1, .validation_data = val, .steps_per_epoch = steps});

  train::save_model(lm, out, {.tokenizer = &tok});
  std::unique_ptr<nn::Model> back = train::load_model(out);
  std::unique_ptr<data::Tokenizer> back_tok = train::load_tokenizer(out);
  const nn::Logs logs = back->evaluate(val, {});
  std::printf("saved %s (vocabulary %lld); reloaded: val loss %.4f, accuracy %.4f\n", out.c_str(),
              static_cast<long long>(back_tok->vocab_size()), logs.at("loss"), logs.at("accuracy"));
  return 0;
}
