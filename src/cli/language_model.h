// dtrain fit --arch gpt: the language-model flags, the corpus as next-token windows and the GPT
// (private to src/cli; docs/language-model.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dtrain/core/tensor.h"
#include "dtrain/data/tokenizer.h"
#include "dtrain/nn/transformer.h"

namespace CLI {
class App;
}

namespace dtrain::cli {

struct LmFlags {
  int64_t context = 128;
  int64_t layers = 4;
  int64_t d_model = 128;
  int64_t heads = 4;
  double dropout = 0.0;
  // char, bpe or unigram (a SentencePiece model trained on the corpus), or the path of a
  // SentencePiece .model file.
  std::string tokenizer = "char";
  int64_t vocab_size = 1000;  // --vocab-size: of a SentencePiece model trained here
  std::string tokenizer_out;  // --tokenizer-out: where to write that model (a .model file)
  std::string corpus;         // empty: the fortunes text (data/fortunes.h)
  double validation_split = 0.1;
};

// Registers --context, --layers, --d-model, --heads, --dropout, --tokenizer, --vocab-size,
// --tokenizer-out, --corpus and --validation-split on `cmd`.
void add_lm_flags(CLI::App* cmd, LmFlags& f);

// The corpus cut into next-token windows: x, y int32 [n, context], windows of context + 1
// tokens taken every `context` tokens (no overlap), the last validation_split of the text held
// out for validation.
struct LmData {
  std::shared_ptr<const data::Tokenizer> tokenizer;
  Tensor x_train, y_train, x_val, y_val;  // x_val undefined when validation_split is 0
};

// Reads the corpus (or the fortunes), builds the tokenizer and the windows. Throws
// InvalidArgumentError for an unknown --tokenizer, a vocabulary SentencePiece cannot train or a
// corpus too short for one window per split, NotFoundError / DataLossError for a missing, empty
// or binary corpus or .model file.
LmData load_lm_data(const LmFlags& f);

// The GPT of the flags for a vocabulary of `vocab_size`.
std::unique_ptr<nn::GPT> make_gpt(const LmFlags& f, int64_t vocab_size);

}  // namespace dtrain::cli
