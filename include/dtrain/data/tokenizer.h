// Tokenizers: text <-> int32 token ids. Two kinds: CharTokenizer, a character (Unicode code
// point) or byte vocabulary built from a corpus, and SentencePieceTokenizer, a BPE or unigram
// model trained in-process by SentencePiece's trainer or loaded from a .model file. Each
// serializes to bytes (to_bytes / tokenizer_from_bytes) so it can be saved next to a model.
//
// Serialized format (docs/text-data.md): a UTF-8 JSON object
//   {"format": "dtrain.tokenizer", "version": 1, "class_name": "CharTokenizer", "config": {...}}
// CharTokenizer's config: {"unit": "char"|"byte", "vocabulary": [s0, s1, ...] (the token of id i,
// as a UTF-8 string; for bytes, a one-byte string or "\u00XX"), "unknown": "error"|"skip"};
// SentencePieceTokenizer's config: {"model_proto": "<base64 of the .model file bytes>"}.
//
// Tokenizers are immutable after construction and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "CharTokenizer", "SentencePieceTokenizer".
  virtual std::string class_name() const = 0;
  // Number of ids; every id encode() returns is in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;
  // The ids of `text`. Throws InvalidArgumentError for text the tokenizer cannot represent
  // (see each kind).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of `ids`. Throws InvalidArgumentError naming an id outside [0, vocab_size()) and its
  // position.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The serialized tokenizer (format above); tokenizer_from_bytes() rebuilds an equal one.
  virtual std::string to_bytes() const = 0;

  // encode() as an int32 [n] tensor, ready for token_windows().
  Tensor encode_tensor(std::string_view text) const;
};

// Rebuilds a tokenizer from to_bytes(). Throws DataLossError naming what is wrong (not JSON,
// another format, an unknown class, a malformed config).
std::unique_ptr<Tokenizer> tokenizer_from_bytes(std::string_view bytes);

// ---- CharTokenizer -----------------------------------------------------------------------------

struct CharTokenizerOptions {
  // kChar: tokens are Unicode code points of UTF-8 text (the corpus and every text must be
  // valid UTF-8). kByte: tokens are bytes (any input except NUL bytes in the corpus).
  enum class Unit { kChar, kByte };
  // What encode() does with a character that is not in the vocabulary: kError throws
  // InvalidArgumentError naming the character (and its code point) and its byte offset; kSkip
  // drops it.
  enum class Unknown { kError, kSkip };
  Unit unit = Unit::kChar;
  Unknown unknown = Unknown::kError;
};

// A vocabulary of the sorted unique characters (or bytes) of a corpus: id i is the i-th smallest
// code point (byte value) present.
class CharTokenizer final : public Tokenizer {
 public:
  // Builds the vocabulary from `corpus`. Throws InvalidArgumentError for an empty corpus and
  // DataLossError (via check_utf8_text) for NUL bytes or, with kChar, invalid UTF-8.
  static CharTokenizer build(std::string_view corpus, const CharTokenizerOptions& options = {});
  // A tokenizer over an explicit vocabulary of distinct code points (bytes with kByte: < 256),
  // in id order.
  CharTokenizer(std::vector<uint32_t> vocabulary, const CharTokenizerOptions& options = {});

  std::string class_name() const override { return "CharTokenizer"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(vocabulary_.size()); }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string to_bytes() const override;

  // The code points (bytes) in id order.
  const std::vector<uint32_t>& vocabulary() const { return vocabulary_; }
  const CharTokenizerOptions& options() const { return options_; }

 private:
  std::vector<uint32_t> vocabulary_;
  std::vector<int32_t> ids_;  // by code point, -1 when absent (size max code point + 1)
  CharTokenizerOptions options_;
};

// ---- SentencePieceTokenizer --------------------------------------------------------------------

// SentencePiece's trainer arguments dtrain exposes; training is deterministic (one thread, fixed
// seed, no sentence sampling or shuffling), so two trainings on one corpus give identical
// models.
struct SentencePieceTrainOptions {
  enum class ModelType { kBpe, kUnigram };
  ModelType model_type = ModelType::kBpe;
  int64_t vocab_size = 1000;
  // Fraction of characters the model must cover; rarer ones map to <unk>.
  double character_coverage = 1.0;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Trains a model on `corpus` (lines of text) in-process, in memory (no files). Throws
  // InvalidArgumentError for an empty corpus or a vocab_size SentencePiece rejects (its message
  // included), DataLossError for a binary corpus. SentencePiece runs in a link-map namespace of
  // its own, so this works beside gRPC (docs/text-data.md, "Linking"); FailedPreconditionError
  // when its shim cannot be loaded (every SentencePieceTokenizer function).
  static SentencePieceTokenizer train(std::string_view corpus,
                                      const SentencePieceTrainOptions& options = {});
  // Loads a .model file. Throws NotFoundError for a missing file, DataLossError for one that is
  // not a SentencePiece model.
  static SentencePieceTokenizer load(const std::string& model_path);
  // From the bytes of a .model file (a serialized ModelProto).
  static SentencePieceTokenizer from_model_proto(std::string model_proto);

  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;
  ~SentencePieceTokenizer() override;

  std::string class_name() const override { return "SentencePieceTokenizer"; }
  int64_t vocab_size() const override;
  // Text SentencePiece cannot split into known pieces encodes to its <unk> id (as SentencePiece
  // does); encode() throws only for invalid UTF-8.
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string to_bytes() const override;

  // The .model file's bytes.
  const std::string& model_proto() const;

 private:
  struct Impl;
  explicit SentencePieceTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::data
