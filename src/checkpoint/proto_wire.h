// A minimal protocol-buffer wire-format encoder and decoder: just what the checkpoint protos
// (BundleHeaderProto, BundleEntryProto, TensorShapeProto, TrackableObjectGraph) need, so the
// checkpoint layer needs no protoc. Fields are written in field-number order and defaults are
// left out by the callers, which reproduces the bytes TensorFlow's serializer produces.
// Pure functions and value types; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain::checkpoint::wire {

enum WireType : int { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v);
void put_tag(std::string& out, int field, WireType type);
// field = varint (int32/int64/enum/bool; negative int32 values take 10 bytes, as in protobuf).
void put_varint_field(std::string& out, int field, uint64_t v);
void put_bytes_field(std::string& out, int field, std::string_view bytes);
void put_fixed32_field(std::string& out, int field, uint32_t v);
void put_fixed32(std::string& out, uint32_t v);

// Decodes one varint at `p` (advancing it); false on overflow or when it runs past `end`.
bool get_varint(const char*& p, const char* end, uint64_t* v);

struct Field {
  int number = 0;
  WireType type = kVarint;
  uint64_t varint = 0;     // kVarint, kFixed64, kFixed32 (widened)
  std::string_view bytes;  // kLengthDelimited
};

// Iterates over the fields of one serialized message.
class Reader {
 public:
  // `what` names the message in errors ("BundleEntryProto for key 'x' in <file>").
  Reader(std::string_view message, std::string what)
      : p_(message.data()), end_(message.data() + message.size()), what_(std::move(what)) {}
  // Reads the next field into `f`; returns false at the end. Throws DataLossError naming
  // `what` on a malformed message (bad varint, unsupported wire type, length past the end).
  bool next(Field& f);

 private:
  const char* p_;
  const char* end_;
  std::string what_;
};

}  // namespace dtrain::checkpoint::wire
