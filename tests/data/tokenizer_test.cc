#include "dtrain/data/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/data/fortunes.h"
#include "testutil/expect_throws.h"
#include "testutil/temp_dir.h"

namespace dtrain::data {
namespace {

using testutil::expect_throws;

TEST(CharTokenizer, VocabularyIsTheSortedUniqueCharacters) {
  const CharTokenizer tok = CharTokenizer::build(
      "b\xc3\xa9"
      "ab\n");  // "béab\n"
  EXPECT_EQ(tok.vocabulary(), (std::vector<uint32_t>{'\n', 'a', 'b', 0xE9}));
  EXPECT_EQ(tok.vocab_size(), 4);
  EXPECT_EQ(tok.encode("ab\xc3\xa9\n"), (std::vector<int32_t>{1, 2, 3, 0}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{3, 1, 0}),
            "\xc3\xa9"
            "a\n");
  const Tensor t = tok.encode_tensor("ba");
  EXPECT_EQ(t.dtype(), DType::kInt32);
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{2, 1}));
}

TEST(CharTokenizer, UnknownCharacterNamesItAndItsPosition) {
  const CharTokenizer tok = CharTokenizer::build("hello world");
  const std::string msg = expect_throws<InvalidArgumentError>([&] { tok.encode("hello, w"); });
  EXPECT_NE(msg.find("',' (U+002C)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte offset 5"), std::string::npos) << msg;
  const CharTokenizer skipping =
      CharTokenizer::build("hello world", {.unknown = CharTokenizerOptions::Unknown::kSkip});
  EXPECT_EQ(skipping.decode(skipping.encode("hello, w!")), "hello w");
  EXPECT_THROW(tok.encode("h\xff"), InvalidArgumentError);
  const std::string dmsg = expect_throws<InvalidArgumentError>([&] {
    tok.decode(std::vector<int32_t>{0, 99});
  });
  EXPECT_NE(dmsg.find("id 99 at position 1"), std::string::npos) << dmsg;
}

TEST(CharTokenizer, RejectsEmptyAndBinaryCorpora) {
  EXPECT_THROW(CharTokenizer::build(""), InvalidArgumentError);
  EXPECT_THROW(CharTokenizer::build(std::string("text\0bin", 8)), DataLossError);
  EXPECT_THROW(CharTokenizer::build("caf\xe9"), DataLossError);  // Latin-1, not UTF-8
  // The byte unit takes any bytes but NUL.
  const CharTokenizer bytes =
      CharTokenizer::build("caf\xe9", {.unit = CharTokenizerOptions::Unit::kByte});
  EXPECT_EQ(bytes.vocab_size(), 4);
  EXPECT_EQ(bytes.decode(bytes.encode("\xe9"
                                      "fac")),
            "\xe9"
            "fac");
  EXPECT_THROW(
      CharTokenizer::build(std::string("a\0", 2), {.unit = CharTokenizerOptions::Unit::kByte}),
      DataLossError);
}

TEST(CharTokenizer, SerializesToBytesAndBack) {
  for (const auto unit : {CharTokenizerOptions::Unit::kChar, CharTokenizerOptions::Unit::kByte}) {
    const CharTokenizer tok = CharTokenizer::build(
        "x\xc3\xa9y\"\\\n", {.unit = unit, .unknown = CharTokenizerOptions::Unknown::kSkip});
    const std::string bytes = tok.to_bytes();
    const std::unique_ptr<Tokenizer> back = tokenizer_from_bytes(bytes);
    ASSERT_EQ(back->class_name(), "CharTokenizer");
    const auto& c = dynamic_cast<const CharTokenizer&>(*back);
    EXPECT_EQ(c.vocabulary(), tok.vocabulary());
    EXPECT_EQ(c.options().unit, unit);
    EXPECT_EQ(c.options().unknown, CharTokenizerOptions::Unknown::kSkip);
    EXPECT_EQ(back->to_bytes(), bytes);
  }
  EXPECT_NE(CharTokenizer::build("ab").to_bytes().find("\"vocabulary\":[\"a\",\"b\"]"),
            std::string::npos);
}

TEST(TokenizerFromBytes, RejectsWhatIsNotATokenizer) {
  EXPECT_THROW(tokenizer_from_bytes("not json"), DataLossError);
  EXPECT_THROW(tokenizer_from_bytes("{\"format\": \"other\"}"), DataLossError);
  const std::string msg = expect_throws<DataLossError>([] {
    tokenizer_from_bytes(
        R"({"format": "dtrain.tokenizer", "version": 1, "class_name": "Wordpiece", "config": {}})");
  });
  EXPECT_NE(msg.find("Wordpiece"), std::string::npos) << msg;
  EXPECT_THROW(tokenizer_from_bytes(
                   R"({"format": "dtrain.tokenizer", "version": 1, "class_name": "CharTokenizer",
                       "config": {"unit": "char", "unknown": "error", "vocabulary": ["ab"]}})"),
               DataLossError);
  EXPECT_THROW(tokenizer_from_bytes(
                   R"({"format": "dtrain.tokenizer", "version": 1, "class_name": "CharTokenizer",
                       "config": {"unit": "char", "unknown": "error", "vocabulary": ["a", "a"]}})"),
               DataLossError);
  EXPECT_THROW(tokenizer_from_bytes(
                   R"({"format": "dtrain.tokenizer", "version": 1,
                       "class_name": "SentencePieceTokenizer", "config": {"model_proto": "!!!!"}})"),
               DataLossError);
  EXPECT_THROW(tokenizer_from_bytes(
                   R"({"format": "dtrain.tokenizer", "version": 1,
                       "class_name": "SentencePieceTokenizer", "config": {"model_proto": "AAAA"}})"),
               DataLossError);
  // Fields of the wrong JSON type (found by fuzzing: they escaped as nlohmann exceptions).
  for (
      const char* bad :
      {R"({"format": {"unit": "char"}, "version": 1, "class_name": "CharTokenizer", "config": {}})",
       R"({"format": "dtrain.tokenizer", "version": "1", "class_name": "CharTokenizer"})",
       R"({"format": "dtrain.tokenizer", "version": 1, "class_name": 7, "config": {}})",
       R"({"format": "dtrain.tokenizer", "version": 1, "class_name": "CharTokenizer",
            "config": {"unit": "char", "unknown": "skip", "vocabulary": "abc"}})"}) {
    EXPECT_THROW(tokenizer_from_bytes(bad), DataLossError) << bad;
  }
}

// A small corpus with enough repetition for a vocabulary of a few hundred pieces.
std::string small_corpus() {
  if (std::filesystem::exists(fortunes::kDefaultDir)) {
    return fortunes::load_text().substr(0, 40'000);
  }
  std::string text;
  for (int i = 0; i < 2000; ++i) {
    text += "the quick brown fox " + std::to_string(i % 37) + " jumps over the lazy dog\n";
  }
  return text;
}

TEST(SentencePieceTokenizer, TrainsDeterministicallyAndRoundTrips) {
  const std::string corpus = small_corpus();
  for (const auto type : {SentencePieceTrainOptions::ModelType::kBpe,
                          SentencePieceTrainOptions::ModelType::kUnigram}) {
    const SentencePieceTrainOptions options{.model_type = type, .vocab_size = 300};
    const SentencePieceTokenizer a = SentencePieceTokenizer::train(corpus, options);
    const SentencePieceTokenizer b = SentencePieceTokenizer::train(corpus, options);
    EXPECT_EQ(a.vocab_size(), 300);
    EXPECT_EQ(a.model_proto(), b.model_proto()) << "two trainings gave different models";
    const std::string text = corpus.substr(0, 500);
    const std::vector<int32_t> ids = a.encode(text);
    EXPECT_LT(ids.size(), text.size());  // pieces are longer than characters on average
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 300);
    }
    EXPECT_EQ(a.decode(ids), text);
  }
}

TEST(SentencePieceTokenizer, SerializesAndLoadsModelFiles) {
  const SentencePieceTokenizer tok =
      SentencePieceTokenizer::train(small_corpus(), {.vocab_size = 200});
  const std::unique_ptr<Tokenizer> back = tokenizer_from_bytes(tok.to_bytes());
  ASSERT_EQ(back->class_name(), "SentencePieceTokenizer");
  EXPECT_EQ(dynamic_cast<const SentencePieceTokenizer&>(*back).model_proto(), tok.model_proto());
  const std::string text = "the lazy dog\nand the fox";
  EXPECT_EQ(back->encode(text), tok.encode(text));

  testutil::TempDir dir("dtrain_spm_test");
  testutil::write_bytes(dir.file("m.model"), tok.model_proto());
  const SentencePieceTokenizer loaded = SentencePieceTokenizer::load(dir.file("m.model"));
  EXPECT_EQ(loaded.encode(text), tok.encode(text));
  EXPECT_THROW(SentencePieceTokenizer::load(dir.file("absent.model")), NotFoundError);
  testutil::write_bytes(dir.file("bad.model"), "this is not a model");
  const std::string msg =
      expect_throws<DataLossError>([&] { SentencePieceTokenizer::load(dir.file("bad.model")); });
  EXPECT_NE(msg.find("bad.model"), std::string::npos) << msg;
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), InvalidArgumentError);
}

TEST(SentencePieceTokenizer, RejectsBadCorporaAndOptions) {
  EXPECT_THROW(SentencePieceTokenizer::train("\n\n"), InvalidArgumentError);
  EXPECT_THROW(SentencePieceTokenizer::train(std::string("ab\0c\n", 5)), DataLossError);
  // More pieces than the corpus can make: SentencePiece's own message.
  const std::string msg = expect_throws<InvalidArgumentError>(
      [] { SentencePieceTokenizer::train("ab ab\nba\n", {.vocab_size = 5000}); });
  EXPECT_NE(msg.find("SentencePiece"), std::string::npos) << msg;
}

// Damaged model bytes (truncated, bytes flipped, as a half-written or corrupt .model file) either
// load or are a DataLossError; a model that loads encodes and decodes without crashing.
TEST(SentencePieceTokenizer, DamagedModelsAreDataLossOrStillWork) {
  const std::string good =
      SentencePieceTokenizer::train(small_corpus(), {.vocab_size = 120}).model_proto();
  std::mt19937 rng(12);
  int loaded = 0, rejected = 0;
  for (int i = 0; i < 300; ++i) {
    std::string bad = good;
    if (i % 3 == 0) {
      bad.resize(std::uniform_int_distribution<size_t>(0, good.size() - 1)(rng));
    } else {
      for (int k = 0; k < 1 + i % 4; ++k) {
        const size_t at = std::uniform_int_distribution<size_t>(0, bad.size() - 1)(rng);
        bad[at] = static_cast<char>(bad[at] ^ (1 << (rng() % 8)));
      }
    }
    try {
      const SentencePieceTokenizer tok = SentencePieceTokenizer::from_model_proto(bad);
      ++loaded;
      try {
        const std::vector<int32_t> ids = tok.encode("the quick brown fox");
        tok.decode(ids);
      } catch (const InvalidArgumentError&) {
      }
    } catch (const DataLossError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  std::printf("%d damaged models loaded, %d rejected\n", loaded, rejected);
}

}  // namespace
}  // namespace dtrain::data
