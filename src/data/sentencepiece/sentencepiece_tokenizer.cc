// SentencePieceTokenizer: training and encoding through libsentencepiece, whose headers stay in
// this file (Impl hides the processor from include/).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "data/tokenizer_format.h"
#include "dtrain/core/error.h"
#include "dtrain/data/text.h"
#include "dtrain/data/tokenizer.h"

namespace dtrain::data {

struct SentencePieceTokenizer::Impl {
  std::string model_proto;
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

// The lines of the corpus, one sentence each (empty lines skipped), for the trainer.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::string_view corpus) : corpus_(corpus) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (pos_ < corpus_.size()) {
      size_t end = corpus_.find('\n', pos_);
      if (end == std::string_view::npos) end = corpus_.size();
      line_.assign(corpus_.substr(pos_, end - pos_));
      pos_ = end + 1;
      if (!line_.empty()) return;
    }
    done_ = true;
  }

  std::string_view corpus_;
  size_t pos_ = 0;
  std::string line_;
  bool done_ = false;
};

// SentencePiece's trainer and its random generator are process-wide.
std::mutex& trainer_mutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept =
    default;
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

SentencePieceTokenizer SentencePieceTokenizer::train(std::string_view corpus,
                                                     const SentencePieceTrainOptions& options) {
  DTRAIN_CHECK(corpus.find_first_not_of("\r\n") != std::string_view::npos,
               "SentencePieceTokenizer.train: the corpus is empty");
  check_utf8_text(corpus, "SentencePieceTokenizer.train: the corpus");
  DTRAIN_CHECK(options.vocab_size >= 1,
               "SentencePieceTokenizer.train: vocab_size must be >= 1, got ", options.vocab_size);
  DTRAIN_CHECK(options.character_coverage > 0.0 && options.character_coverage <= 1.0,
               "SentencePieceTokenizer.train: character_coverage must be in (0, 1], got ",
               options.character_coverage);
  // Deterministic training: one thread, every sentence (no sampling, no shuffling), a fixed
  // seed. Identity normalization and kept whitespace, so decode(encode(text)) == text for text
  // made of the corpus's characters. "\n" and "\t" are user-defined pieces: sentences are lines,
  // so the trainer never sees "\n", and SentencePiece keeps tabs out of learned pieces.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type",
       options.model_type == SentencePieceTrainOptions::ModelType::kBpe ? "bpe" : "unigram"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"user_defined_symbols", "\n,\t"},
      {"hard_vocab_limit", "true"},
      {"minloglevel", "2"},
  };
  auto impl = std::make_unique<Impl>();
  {
    std::lock_guard<std::mutex> lock(trainer_mutex());
    sentencepiece::SetRandomGeneratorSeed(20240607u);
    LineIterator lines(corpus);
    const sentencepiece::util::Status status =
        sentencepiece::SentencePieceTrainer::Train(args, &lines, &impl->model_proto);
    if (!status.ok()) {
      throw InvalidArgumentError(str_cat(
          "SentencePieceTokenizer.train: SentencePiece's trainer failed: ", status.ToString()));
    }
  }
  return from_model_proto(std::move(impl->model_proto));
}

SentencePieceTokenizer SentencePieceTokenizer::load(const std::string& model_path) {
  std::string bytes;
  try {
    bytes = read_file(model_path);
  } catch (const NotFoundError&) {
    throw NotFoundError(
        str_cat("SentencePieceTokenizer.load: ", model_path, ": no such SentencePiece model file"));
  }
  try {
    return from_model_proto(std::move(bytes));
  } catch (const DataLossError& e) {
    throw DataLossError(str_cat("SentencePieceTokenizer.load: ", model_path, ": ", e.what()));
  }
}

SentencePieceTokenizer SentencePieceTokenizer::from_model_proto(std::string model_proto) {
  auto impl = std::make_unique<Impl>();
  impl->model_proto = std::move(model_proto);
  const sentencepiece::util::Status status =
      impl->processor.LoadFromSerializedProto(impl->model_proto);
  if (!status.ok() || impl->processor.GetPieceSize() <= 0) {
    throw DataLossError(str_cat("not a SentencePiece model (", impl->model_proto.size(),
                                " bytes): ", status.ToString()));
  }
  return SentencePieceTokenizer(std::move(impl));
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->processor.GetPieceSize(); }

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const sentencepiece::util::Status status = impl_->processor.Encode(text, &ids);
  if (!status.ok()) {
    throw InvalidArgumentError(str_cat("SentencePieceTokenizer.encode: ", status.ToString()));
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  const int64_t n = vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    DTRAIN_CHECK(ids[i] >= 0 && ids[i] < n, "SentencePieceTokenizer.decode: id ", ids[i],
                 " at position ", i, " is out of range [0, ", n, ")");
  }
  std::string out;
  const sentencepiece::util::Status status =
      impl_->processor.Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  if (!status.ok()) {
    throw InvalidArgumentError(str_cat("SentencePieceTokenizer.decode: ", status.ToString()));
  }
  return out;
}

std::string SentencePieceTokenizer::to_bytes() const {
  const nlohmann::json j = {
      {"format", detail::kTokenizerFormat},
      {"version", detail::kTokenizerVersion},
      {"class_name", class_name()},
      {"config", {{"model_proto", detail::base64_encode(impl_->model_proto)}}},
  };
  return j.dump();
}

const std::string& SentencePieceTokenizer::model_proto() const { return impl_->model_proto; }

namespace detail {
// The strong definition of tokenizer.cc's weak reference.
std::unique_ptr<Tokenizer> sentencepiece_from_model_proto(std::string model_proto) {
  return std::make_unique<SentencePieceTokenizer>(
      SentencePieceTokenizer::from_model_proto(std::move(model_proto)));
}
}  // namespace detail

}  // namespace dtrain::data
