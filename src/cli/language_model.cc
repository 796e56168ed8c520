// dtrain fit --arch gpt: corpus, tokenizer, windows and the model (language_model.h).
#include "language_model.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <tuple>

#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/data/fortunes.h"
#include "dtrain/data/text.h"

namespace dtrain::cli {

void add_lm_flags(CLI::App* cmd, LmFlags& f) {
  auto positive = CLI::Range(int64_t{1}, int64_t{1} << 20);
  cmd->add_option("--context", f.context,
                  "--arch gpt: tokens per training window (the model's "
                  "context, the longest sequence it takes)")
      ->capture_default_str()
      ->check(positive);
  cmd->add_option("--layers", f.layers, "--arch gpt: transformer blocks")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1024}));
  cmd->add_option("--d-model", f.d_model, "--arch gpt: width of the embeddings and blocks")
      ->capture_default_str()
      ->check(positive);
  cmd->add_option("--heads", f.heads, "--arch gpt: attention heads (must divide --d-model)")
      ->capture_default_str()
      ->check(positive);
  cmd->add_option("--dropout", f.dropout,
                  "--arch gpt: dropout on attention probabilities and residual branches")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  cmd->add_option("--tokenizer", f.tokenizer,
                  "--arch gpt: char (a character vocabulary of the corpus), bpe or unigram "
                  "(a SentencePiece model of --vocab-size pieces trained on the corpus), or the "
                  "path of a SentencePiece .model file")
      ->capture_default_str();
  cmd->add_option("--vocab-size", f.vocab_size,
                  "--arch gpt: pieces of the SentencePiece model --tokenizer bpe|unigram trains")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option(
      "--tokenizer-out", f.tokenizer_out,
      "--arch gpt: write the SentencePiece model --tokenizer bpe|unigram trains to this "
      ".model file (give it to --tokenizer next time: a restarted worker then loads "
      "it instead of training again)");
  cmd->add_option("--corpus", f.corpus,
                  "--arch gpt: UTF-8 text file to train on (default: the fortunes text, "
                  "/usr/share/games/fortunes)");
  cmd->add_option("--validation-split", f.validation_split,
                  "--arch gpt: fraction of the text (its end) held out for validation")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.9));
}

namespace {

// Windows of context + 1 tokens every `context` tokens of ids[begin, end), as x / y rows.
std::pair<Tensor, Tensor> windows(const std::vector<int32_t>& ids, size_t begin, size_t end,
                                  int64_t context) {
  const size_t t = static_cast<size_t>(context);
  const int64_t n = end - begin >= t + 1 ? static_cast<int64_t>((end - begin - 1) / t) : 0;
  Tensor x(DType::kInt32, Shape{n, context}), y(DType::kInt32, Shape{n, context});
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* src = ids.data() + begin + static_cast<size_t>(i) * t;
    std::copy(src, src + t, x.data<int32_t>() + i * context);
    std::copy(src + 1, src + t + 1, y.data<int32_t>() + i * context);
  }
  return {x, y};
}

}  // namespace

LmData load_lm_data(const LmFlags& f) {
  const bool trained_spm = f.tokenizer == "bpe" || f.tokenizer == "unigram";
  const bool spm_file =
      f.tokenizer.size() > 6 && f.tokenizer.compare(f.tokenizer.size() - 6, 6, ".model") == 0;
  DTRAIN_CHECK(f.tokenizer == "char" || trained_spm || spm_file, "--tokenizer ", f.tokenizer,
               ": unknown tokenizer (char, bpe, unigram, or a SentencePiece .model file)");
  DTRAIN_CHECK(f.tokenizer_out.empty() || trained_spm, "--tokenizer-out ", f.tokenizer_out,
               ": only a SentencePiece model trained here (--tokenizer bpe or unigram) is "
               "written");
  const std::string where = f.corpus.empty() ? std::string("the fortunes corpus") : f.corpus;
  const std::string text =
      f.corpus.empty() ? data::fortunes::load_text() : data::read_file(f.corpus);
  DTRAIN_CHECK(!text.empty(), "--corpus ", where, ": the file is empty");
  data::check_utf8_text(text, where);
  LmData d;
  if (f.tokenizer == "char") {
    d.tokenizer = std::make_shared<data::CharTokenizer>(data::CharTokenizer::build(text));
  } else if (spm_file) {
    d.tokenizer = std::make_shared<data::SentencePieceTokenizer>(
        data::SentencePieceTokenizer::load(f.tokenizer));
  } else {
    using Type = data::SentencePieceTrainOptions::ModelType;
    auto spm = std::make_shared<data::SentencePieceTokenizer>(data::SentencePieceTokenizer::train(
        text, {.model_type = f.tokenizer == "bpe" ? Type::kBpe : Type::kUnigram,
               .vocab_size = f.vocab_size}));
    // Every worker of a job trains the same bytes; each replaces the file whole.
    if (!f.tokenizer_out.empty()) write_file_atomically(f.tokenizer_out, spm->model_proto());
    d.tokenizer = spm;
  }
  const std::vector<int32_t> ids = d.tokenizer->encode(text);
  const size_t val = static_cast<size_t>(std::floor(ids.size() * f.validation_split));
  const size_t split = ids.size() - val;
  std::tie(d.x_train, d.y_train) = windows(ids, 0, split, f.context);
  DTRAIN_CHECK(d.x_train.dim(0) > 0, where, ": ", split,
               " training tokens are too few for one window of --context ", f.context, " + 1");
  if (val > 0) {
    std::tie(d.x_val, d.y_val) = windows(ids, split, ids.size(), f.context);
    DTRAIN_CHECK(d.x_val.dim(0) > 0, where, ": the validation split has ", val,
                 " tokens, too few for one window of --context ", f.context,
                 " + 1; lower --context or raise --validation-split");
  }
  return d;
}

std::unique_ptr<nn::GPT> make_gpt(const LmFlags& f, int64_t vocab_size) {
  DTRAIN_CHECK(f.d_model % f.heads == 0, "--heads ", f.heads, " must divide --d-model ", f.d_model);
  return std::make_unique<nn::GPT>(nn::GPTConfig{.vocab_size = vocab_size,
                                                 .context = f.context,
                                                 .num_layers = f.layers,
                                                 .d_model = f.d_model,
                                                 .num_heads = f.heads,
                                                 .dropout = static_cast<float>(f.dropout)});
}

}  // namespace dtrain::cli
