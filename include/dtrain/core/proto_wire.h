// The protocol-buffer wire format (https://protobuf.dev/programming-guides/encoding/), by hand:
// varints, fixed32/fixed64 and length-delimited fields. The one codec behind the protos dtrain
// writes and reads without protoc: the checkpoint layer's (BundleHeaderProto, BundleEntryProto,
// TensorShapeProto, TrackableObjectGraph) and the summary layer's (Event, Summary, TensorProto).
// Callers write fields in field-number order and leave proto3 defaults out, which reproduces
// the bytes TensorFlow's serializer produces. Pure functions and value types; thread-compatible.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace dtrain::wire {

enum WireType : int { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// The largest field number protobuf allows (2^29 - 1).
inline constexpr int kMaxFieldNumber = (1 << 29) - 1;

void put_varint(std::string& out, uint64_t v);
void put_tag(std::string& out, int field, WireType type);
// Little-endian, 4 and 8 bytes.
void put_fixed32(std::string& out, uint32_t v);
void put_fixed64(std::string& out, uint64_t v);

// Field writers. A varint field holds int32/int64/uint*/enum/bool; pass negative values
// sign-extended to 64 bits (static_cast<uint64_t>(int64_t{v})): they take 10 bytes, as in
// protobuf.
void put_varint_field(std::string& out, int field, uint64_t v);
void put_fixed32_field(std::string& out, int field, uint32_t v);
void put_fixed64_field(std::string& out, int field, uint64_t v);
inline void put_float_field(std::string& out, int field, float v) {
  put_fixed32_field(out, field, std::bit_cast<uint32_t>(v));
}
inline void put_double_field(std::string& out, int field, double v) {
  put_fixed64_field(out, field, std::bit_cast<uint64_t>(v));
}
void put_bytes_field(std::string& out, int field, std::string_view bytes);

// Decodes one varint at `p` (advancing it); false when it runs past `end` or is longer than 10
// bytes (then `p` is unspecified).
bool get_varint(const char*& p, const char* end, uint64_t* v);

// One field as read from the wire.
struct Field {
  int number = 0;
  WireType type = kVarint;
  uint64_t value = 0;      // kVarint: the varint; kFixed32/kFixed64: the raw bits (widened)
  std::string_view bytes;  // kLengthDelimited: the payload (a view into the message)

  double as_double() const { return std::bit_cast<double>(value); }
  float as_float() const { return std::bit_cast<float>(static_cast<uint32_t>(value)); }
};

// Iterates over the fields of one serialized message. Errors are DataLossError "malformed
// <what> at byte <offset>: <why>", where `what` names the message ("Event",
// "BundleEntryProto for key 'x' in /tmp/ckpt-1.index").
class Reader {
 public:
  Reader(std::string_view message, std::string what) : data_(message), what_(std::move(what)) {}

  // Whether every byte has been read.
  bool done() const { return pos_ >= data_.size(); }
  // Reads the next field into `f`; returns false at the end. Throws DataLossError on a malformed
  // field: a truncated varint or fixed-width value, a length past the end, field number 0 or
  // above kMaxFieldNumber, a wire type other than 0, 1, 2 and 5 (groups included).
  bool next(Field& f);
  // Reads one bare varint (the elements of a packed repeated field); throws DataLossError when
  // it is truncated or longer than 10 bytes.
  uint64_t varint();
  // Throws DataLossError naming the message and the current offset, e.g. for a field of the
  // wrong wire type.
  [[noreturn]] void fail(std::string_view why) const;

 private:
  std::string_view data_;
  std::string what_;
  size_t pos_ = 0;
};

}  // namespace dtrain::wire
