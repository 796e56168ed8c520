// Protocol-buffer wire format, by hand, for the few messages an event file holds (Event, Summary,
// SummaryMetadata, TensorProto, TensorShapeProto): varints, fixed32/fixed64 and length-delimited
// fields. Private to src/summary; keeps protobuf headers out of this layer. Pure functions and
// value types; thread-compatible.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "dtrain/core/error.h"

namespace dtrain::summary::wire {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

static_assert(std::endian::native == std::endian::little, "event files are little-endian");

inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void put_tag(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}
inline void put_fixed32(std::string& out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}
inline void put_fixed64(std::string& out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out.append(b, 8);
}
// Field writers. Proto3 omits scalar fields that hold their default value; callers decide.
inline void put_varint_field(std::string& out, uint32_t field, uint64_t v) {
  put_tag(out, field, kVarint);
  put_varint(out, v);
}
inline void put_double_field(std::string& out, uint32_t field, double v) {
  put_tag(out, field, kFixed64);
  put_fixed64(out, std::bit_cast<uint64_t>(v));
}
inline void put_float_field(std::string& out, uint32_t field, float v) {
  put_tag(out, field, kFixed32);
  put_fixed32(out, std::bit_cast<uint32_t>(v));
}
inline void put_bytes_field(std::string& out, uint32_t field, std::string_view bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// One field as read from the wire. For kLengthDelimited, `bytes` is the payload; otherwise
// `number` holds the varint or the raw fixed32/fixed64 bits.
struct Field {
  uint32_t number = 0;
  WireType type = kVarint;
  uint64_t number_value = 0;
  std::string_view bytes;

  double as_double() const { return std::bit_cast<double>(number_value); }
  float as_float() const { return std::bit_cast<float>(static_cast<uint32_t>(number_value)); }
};

// Iterates the fields of one serialized message. next() throws DataLossError naming `what` (the
// message type) on a malformed encoding: a truncated varint or field, a bad wire type.
class Parser {
 public:
  Parser(std::string_view data, const char* what) : data_(data), what_(what) {}

  bool done() const { return pos_ >= data_.size(); }

  Field next() {
    Field f;
    const uint64_t key = varint();
    f.number = static_cast<uint32_t>(key >> 3);
    const uint32_t type = key & 7;
    if (f.number == 0) fail("field number 0");
    switch (type) {
      case kVarint:
        f.type = kVarint;
        f.number_value = varint();
        break;
      case kFixed64:
        f.type = kFixed64;
        f.number_value = fixed(8);
        break;
      case kFixed32:
        f.type = kFixed32;
        f.number_value = fixed(4);
        break;
      case kLengthDelimited: {
        f.type = kLengthDelimited;
        const uint64_t n = varint();
        if (n > data_.size() - pos_) {
          fail(
              str_cat("field ", f.number, " claims ", n, " bytes, ", data_.size() - pos_, " left"));
        }
        f.bytes = data_.substr(pos_, n);
        pos_ += n;
        break;
      }
      default:
        fail(str_cat("field ", f.number, " has unsupported wire type ", type));
    }
    return f;
  }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) fail("truncated varint");
      const auto b = static_cast<uint8_t>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("varint longer than 10 bytes");
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw DataLossError(str_cat("malformed ", what_, " proto at byte ", pos_, ": ", why));
  }

 private:
  uint64_t fixed(int n) {
    if (data_.size() - pos_ < static_cast<size_t>(n)) fail("truncated fixed-width field");
    uint64_t v = 0;
    std::memcpy(&v, data_.data() + pos_, n);
    pos_ += n;
    return v;
  }

  std::string_view data_;
  const char* what_;
  size_t pos_ = 0;
};

}  // namespace dtrain::summary::wire
