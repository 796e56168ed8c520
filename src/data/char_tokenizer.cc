// CharTokenizer: a code-point (or byte) vocabulary, with an id table indexed by code point.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"
#include "dtrain/data/text.h"
#include "dtrain/data/tokenizer.h"
#include "tokenizer_format.h"

namespace dtrain::data {
namespace {

using Unit = CharTokenizerOptions::Unit;
using Unknown = CharTokenizerOptions::Unknown;

// Calls fn(code point or byte, byte offset) for each unit of `text`, which must be valid UTF-8
// when unit is kChar; throws InvalidArgumentError naming the offset otherwise.
template <class Fn>
void for_each_unit(std::string_view text, Unit unit, const char* op, Fn&& fn) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t at = pos;
    uint32_t cp;
    if (unit == Unit::kByte) {
      cp = static_cast<uint8_t>(text[pos++]);
    } else if (!detail::next_code_point(text, &pos, &cp)) {
      throw InvalidArgumentError(
          str_cat("CharTokenizer.", op, ": invalid UTF-8 at byte offset ", at));
    }
    fn(cp, at);
  }
}

}  // namespace

CharTokenizer CharTokenizer::build(std::string_view corpus, const CharTokenizerOptions& options) {
  DTRAIN_CHECK(!corpus.empty(), "CharTokenizer.build: the corpus is empty");
  if (options.unit == Unit::kChar) {
    check_utf8_text(corpus, "CharTokenizer.build: the corpus");
  } else if (const size_t nul = corpus.find('\0'); nul != std::string_view::npos) {
    throw DataLossError(str_cat("CharTokenizer.build: the corpus has a NUL byte at offset ", nul,
                                " (a binary file?)"));
  }
  std::vector<bool> seen;
  for_each_unit(corpus, options.unit, "build", [&](uint32_t cp, size_t) {
    if (cp >= seen.size()) seen.resize(cp + 1, false);
    seen[cp] = true;
  });
  std::vector<uint32_t> vocabulary;
  for (uint32_t cp = 0; cp < seen.size(); ++cp) {
    if (seen[cp]) vocabulary.push_back(cp);
  }
  return CharTokenizer(std::move(vocabulary), options);
}

CharTokenizer::CharTokenizer(std::vector<uint32_t> vocabulary, const CharTokenizerOptions& options)
    : vocabulary_(std::move(vocabulary)), options_(options) {
  DTRAIN_CHECK(!vocabulary_.empty(), "CharTokenizer: the vocabulary is empty");
  const uint32_t limit = options_.unit == Unit::kByte ? 0xFF : 0x10FFFF;
  const uint32_t max = *std::max_element(vocabulary_.begin(), vocabulary_.end());
  DTRAIN_CHECK(max <= limit, "CharTokenizer: vocabulary entry ", max, " exceeds ", limit);
  ids_.assign(max + 1, -1);
  for (size_t i = 0; i < vocabulary_.size(); ++i) {
    int32_t& id = ids_[vocabulary_[i]];
    DTRAIN_CHECK(id < 0, "CharTokenizer: ", detail::describe_code_point(vocabulary_[i]),
                 " appears twice in the vocabulary (ids ", id, " and ", i, ")");
    id = static_cast<int32_t>(i);
  }
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size());
  for_each_unit(text, options_.unit, "encode", [&](uint32_t cp, size_t at) {
    const int32_t id = cp < ids_.size() ? ids_[cp] : -1;
    if (id >= 0) {
      out.push_back(id);
    } else if (options_.unknown == Unknown::kError) {
      throw InvalidArgumentError(str_cat(
          "CharTokenizer.encode: ",
          options_.unit == Unit::kByte ? str_cat("byte ", cp) : detail::describe_code_point(cp),
          " at byte offset ", at, " is not in the vocabulary of ", vocabulary_.size(),
          " characters"));
    }
  });
  return out;
}

std::string CharTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    DTRAIN_CHECK(id >= 0 && id < vocab_size(), "CharTokenizer.decode: id ", id, " at position ", i,
                 " is out of range [0, ", vocab_size(), ")");
    const uint32_t cp = vocabulary_[static_cast<size_t>(id)];
    if (options_.unit == Unit::kByte) {
      out.push_back(static_cast<char>(cp));
    } else {
      detail::append_utf8(cp, out);
    }
  }
  return out;
}

std::string CharTokenizer::to_bytes() const {
  nlohmann::json vocabulary = nlohmann::json::array();
  for (uint32_t cp : vocabulary_) {
    // A byte >= 0x80 is written as the code point of the same value, so the JSON stays UTF-8.
    std::string s;
    detail::append_utf8(cp, s);
    vocabulary.push_back(std::move(s));
  }
  nlohmann::json j = {
      {"format", detail::kTokenizerFormat},
      {"version", detail::kTokenizerVersion},
      {"class_name", class_name()},
      {"config",
       {{"unit", options_.unit == Unit::kChar ? "char" : "byte"},
        {"unknown", options_.unknown == Unknown::kError ? "error" : "skip"},
        {"vocabulary", std::move(vocabulary)}}},
  };
  return j.dump();
}

}  // namespace dtrain::data
