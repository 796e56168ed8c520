// The Tokenizer base, the serialized envelope (tokenizer_from_bytes) and the UTF-8 and base64
// helpers the tokenizer kinds share.
#include "dtrain/data/tokenizer.h"

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"
#include "tokenizer_format.h"

namespace dtrain::data {

Tensor Tokenizer::encode_tensor(std::string_view text) const {
  const std::vector<int32_t> ids = encode(text);
  return Tensor::from_vector<int32_t>(ids, Shape{static_cast<int64_t>(ids.size())});
}

namespace {

// The tokenizer a parsed envelope describes; throws DataLossError, and json exceptions for fields
// of the wrong JSON type.
std::unique_ptr<Tokenizer> from_json(const nlohmann::json& j) {
  if (!j.is_object() || j.value("format", "") != detail::kTokenizerFormat) {
    throw DataLossError(
        str_cat("tokenizer_from_bytes: not a serialized tokenizer (expected a JSON "
                "object with \"format\": \"",
                detail::kTokenizerFormat, "\")"));
  }
  if (j.value("version", 0) != detail::kTokenizerVersion) {
    throw DataLossError(str_cat("tokenizer_from_bytes: unsupported tokenizer format version ",
                                j.value("version", 0), " (this dtrain reads version ",
                                detail::kTokenizerVersion, ")"));
  }
  const std::string class_name = j.value("class_name", "");
  if (!j.contains("config") || !j["config"].is_object()) {
    throw DataLossError("tokenizer_from_bytes: the tokenizer has no \"config\" object");
  }
  const nlohmann::json& config = j["config"];
  try {
    if (class_name == "CharTokenizer") {
      CharTokenizerOptions options;
      const std::string unit = config.at("unit").get<std::string>();
      const std::string unknown = config.at("unknown").get<std::string>();
      if (unit != "char" && unit != "byte") {
        throw DataLossError(str_cat("tokenizer_from_bytes: CharTokenizer unit '", unit,
                                    "' is neither 'char' nor 'byte'"));
      }
      if (unknown != "error" && unknown != "skip") {
        throw DataLossError(str_cat("tokenizer_from_bytes: CharTokenizer unknown policy '", unknown,
                                    "' is neither 'error' nor 'skip'"));
      }
      options.unit =
          unit == "char" ? CharTokenizerOptions::Unit::kChar : CharTokenizerOptions::Unit::kByte;
      options.unknown = unknown == "error" ? CharTokenizerOptions::Unknown::kError
                                           : CharTokenizerOptions::Unknown::kSkip;
      std::vector<uint32_t> vocabulary;
      for (const nlohmann::json& token : config.at("vocabulary")) {
        const std::string s = token.get<std::string>();
        size_t pos = 0;
        uint32_t cp = 0;
        if (options.unit == CharTokenizerOptions::Unit::kByte) {
          // Bytes >= 0x80 are written as the code point of the same value (U+0080..U+00FF).
          if (!detail::next_code_point(s, &pos, &cp) || pos != s.size() || cp > 0xFF) {
            throw DataLossError(str_cat("tokenizer_from_bytes: CharTokenizer byte token ",
                                        token.dump(), " is not one byte"));
          }
        } else if (!detail::next_code_point(s, &pos, &cp) || pos != s.size()) {
          throw DataLossError(str_cat("tokenizer_from_bytes: CharTokenizer token ", token.dump(),
                                      " is not one character"));
        }
        vocabulary.push_back(cp);
      }
      try {
        return std::make_unique<CharTokenizer>(std::move(vocabulary), options);
      } catch (const InvalidArgumentError& e) {
        throw DataLossError(str_cat("tokenizer_from_bytes: ", e.what()));
      }
    }
    if (class_name == "SentencePieceTokenizer") {
      std::string proto = detail::base64_decode(config.at("model_proto").get<std::string>(),
                                                "tokenizer_from_bytes: model_proto");
      return std::make_unique<SentencePieceTokenizer>(
          SentencePieceTokenizer::from_model_proto(std::move(proto)));
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataLossError(
        str_cat("tokenizer_from_bytes: malformed ", class_name, " config: ", e.what()));
  }
  throw DataLossError(str_cat("tokenizer_from_bytes: unknown tokenizer class '", class_name,
                              "'; known: CharTokenizer, SentencePieceTokenizer"));
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_bytes(std::string_view bytes) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::exception& e) {
    throw DataLossError(
        str_cat("tokenizer_from_bytes: not a serialized tokenizer (invalid JSON: ", e.what(), ")"));
  }
  // A field of the wrong JSON type ("format": {}) is malformed input too.
  try {
    return from_json(j);
  } catch (const nlohmann::json::exception& e) {
    throw DataLossError(str_cat("tokenizer_from_bytes: malformed tokenizer: ", e.what()));
  }
}

namespace detail {

bool next_code_point(std::string_view text, size_t* pos, uint32_t* cp) {
  const size_t i = *pos;
  if (i >= text.size()) return false;
  const auto c = static_cast<unsigned char>(text[i]);
  int len;
  uint32_t v;
  if (c < 0x80) {
    len = 1, v = c;
  } else if ((c & 0xE0) == 0xC0) {
    len = 2, v = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, v = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, v = c & 0x07;
  } else {
    return false;
  }
  if (i + static_cast<size_t>(len) > text.size()) return false;
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(text[i + static_cast<size_t>(k)]);
    if ((b & 0xC0) != 0x80) return false;
    v = (v << 6) | (b & 0x3F);
  }
  *pos = i + static_cast<size_t>(len);
  *cp = v;
  return true;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string describe_code_point(uint32_t cp) {
  char code[16];
  std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(cp));
  if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) return code;  // control character
  std::string s = "'";
  append_utf8(cp, s);
  return str_cat(s, "' (", code, ")");
}

namespace {
constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) |
                       (static_cast<uint8_t>(bytes[i + 1]) << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out.push_back(kBase64[(v >> s) & 63]);
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << 16;
    if (rest == 2) v |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1])) << 8;
    out.push_back(kBase64[(v >> 18) & 63]);
    out.push_back(kBase64[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kBase64[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::string base64_decode(std::string_view text, std::string_view where) {
  if (text.size() % 4 != 0) {
    throw DataLossError(str_cat(where, ": base64 length ", text.size(), " is not a multiple of 4"));
  }
  auto value = [&](char c, size_t at) -> uint32_t {
    const char* p = c == '\0' ? nullptr : std::strchr(kBase64, c);
    if (p == nullptr) {
      throw DataLossError(str_cat(where, ": invalid base64 character at offset ", at));
    }
    return static_cast<uint32_t>(p - kBase64);
  };
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
    if (pad == 1 && text[i + 2] == '=') {
      throw DataLossError(str_cat(where, ": invalid base64 padding"));
    }
    uint32_t v = value(text[i], i) << 18 | value(text[i + 1], i + 1) << 12;
    if (pad < 2) v |= value(text[i + 2], i + 2) << 6;
    if (pad < 1) v |= value(text[i + 3], i + 3);
    out.push_back(static_cast<char>((v >> 16) & 0xFF));
    if (pad < 2) out.push_back(static_cast<char>((v >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(v & 0xFF));
  }
  return out;
}

}  // namespace detail
}  // namespace dtrain::data
