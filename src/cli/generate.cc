// dtrain generate --model lm.keras --prompt TEXT [--tokens N] [--temperature T] [--top-k K]
// [--seed S] [--no-cache]: continues a prompt with a language model saved by
// `dtrain fit --arch gpt` (or train::save_model with its tokenizer), streaming the text to
// stdout as it is sampled. docs/language-model.md.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "dtrain/core/error.h"
#include "dtrain/data/tokenizer.h"
#include "dtrain/nn/generation.h"
#include "dtrain/nn/transformer.h"
#include "dtrain/train/saving.h"

namespace dtrain::cli {
namespace {

// More new tokens than any context would need; larger is a typo, and refused before loading.
constexpr int64_t kMaxNewTokens = 1'000'000;

struct GenerateFlags {
  std::string model;
  std::string prompt;
  int64_t tokens = 200;
  float temperature = 0.8f;
  int64_t top_k = 0;
  uint64_t seed = 0;
  bool no_cache = false;
};

int run_generate(const GenerateFlags& f) {
  std::unique_ptr<nn::Model> model = train::load_model(f.model, {.compile = false});
  auto* lm = dynamic_cast<nn::GPT*>(model.get());
  if (lm == nullptr) {
    throw InvalidArgumentError(str_cat("generate: ", f.model, " holds a ", model->class_name(),
                                       " model '", model->name(),
                                       "'; dtrain generate needs a language model saved by "
                                       "`dtrain fit --arch gpt` (class GPT)"));
  }
  std::unique_ptr<data::Tokenizer> tokenizer = train::load_tokenizer(f.model);
  DTRAIN_CHECK(tokenizer->vocab_size() == lm->config().vocab_size, "generate: ", f.model,
               ": the saved tokenizer has ", tokenizer->vocab_size(),
               " ids but the model's vocabulary has ", lm->config().vocab_size);
  std::vector<int32_t> prompt;
  try {
    prompt = tokenizer->encode(f.prompt);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(str_cat("generate: --prompt: ", e.what()));
  }
  DTRAIN_CHECK(!prompt.empty(), "generate: --prompt is empty; give at least one character");
  const int64_t context = lm->config().context;
  DTRAIN_CHECK(static_cast<int64_t>(prompt.size()) <= context, "generate: --prompt has ",
               prompt.size(), " tokens, more than the model's context of ", context,
               "; shorten it to its last ", context, " tokens");
  std::fputs(f.prompt.c_str(), stdout);
  std::fflush(stdout);
  // Streams by decoding everything sampled so far and printing what is new, so that tokenizers
  // whose pieces decode differently in context (SentencePiece's leading spaces) print right.
  std::vector<int32_t> sampled;
  size_t printed = 0;
  auto on_token = [&](int32_t id) {
    sampled.push_back(id);
    const std::string text = tokenizer->decode(sampled);
    if (text.size() > printed) {
      std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
      std::fflush(stdout);
      printed = text.size();
    }
  };
  nn::generate(*lm, prompt,
               {.max_new_tokens = f.tokens,
                .sampler = {.temperature = f.temperature, .top_k = f.top_k, .seed = f.seed},
                .use_cache = !f.no_cache,
                .on_token = on_token});
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, std::function<int()>& run) {
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Continue a prompt with a language model saved by `dtrain fit --arch gpt`");
  cmd->add_option("--model", flags->model, "The saved language model (.keras or .h5)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--prompt", flags->prompt, "The text to continue")->required();
  cmd->add_option("--tokens", flags->tokens, "How many tokens to sample")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, kMaxNewTokens));
  cmd->add_option("--temperature", flags->temperature,
                  "Softmax temperature; 0 picks the most likely token every time")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", flags->top_k, "Sample among the K most likely tokens; 0: all")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  cmd->add_option("--seed", flags->seed, "Seed of the sampler")->capture_default_str();
  cmd->add_flag("--no-cache", flags->no_cache,
                "Recompute the whole window for every token instead of using the key/value cache");
  cmd->callback([flags, &run] { run = [flags] { return run_generate(*flags); }; });
}

}  // namespace dtrain::cli
