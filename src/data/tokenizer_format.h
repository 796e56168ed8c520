// Private to src/data: UTF-8 code point iteration and the serialized tokenizer envelope shared by
// the tokenizer kinds (see dtrain/data/tokenizer.h for the format).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "dtrain/data/tokenizer.h"

namespace dtrain::data::detail {

inline constexpr const char* kTokenizerFormat = "dtrain.tokenizer";
inline constexpr int kTokenizerVersion = 1;

// Decodes the code point starting at text[*pos] and advances *pos past it. The text must be
// valid UTF-8 (check_utf8_text); returns false (without advancing) at an invalid sequence.
bool next_code_point(std::string_view text, size_t* pos, uint32_t* cp);
// Appends the UTF-8 encoding of `cp` to `out`.
void append_utf8(uint32_t cp, std::string& out);
// "'a' (U+0061)", with a control character shown by its name or code point only.
std::string describe_code_point(uint32_t cp);

std::string base64_encode(std::string_view bytes);

// Throws DataLossError for characters outside the base64 alphabet or a bad length.
std::string base64_decode(std::string_view text, std::string_view where);

}  // namespace dtrain::data::detail
