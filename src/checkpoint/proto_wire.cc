// Protocol-buffer wire format (https://protobuf.dev/programming-guides/encoding/).
#include "proto_wire.h"

#include <cstring>

#include "dtrain/core/error.h"

namespace dtrain::checkpoint::wire {

void put_varint(std::string& out, uint64_t v) {
  char buf[10];
  int n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out.append(buf, static_cast<size_t>(n));
}

void put_tag(std::string& out, int field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(type));
}

void put_varint_field(std::string& out, int field, uint64_t v) {
  put_tag(out, field, kVarint);
  put_varint(out, v);
}

void put_bytes_field(std::string& out, int field, std::string_view bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

void put_fixed32(std::string& out, uint32_t v) {
  char buf[4];
  for (int i = 0; i < 4; ++i) buf[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  out.append(buf, 4);
}

void put_fixed32_field(std::string& out, int field, uint32_t v) {
  put_tag(out, field, kFixed32);
  put_fixed32(out, v);
}

bool get_varint(const char*& p, const char* end, uint64_t* v) {
  uint64_t result = 0;
  for (int shift = 0; shift <= 63 && p < end; shift += 7) {
    const uint64_t byte = static_cast<uint8_t>(*p++);
    result |= (byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) {
      *v = result;
      return true;
    }
  }
  return false;
}

bool Reader::next(Field& f) {
  if (p_ >= end_) return false;
  uint64_t tag;
  if (!get_varint(p_, end_, &tag)) throw DataLossError(str_cat(what_, ": malformed field tag"));
  f.number = static_cast<int>(tag >> 3);
  f.type = static_cast<WireType>(tag & 7);
  if (f.number <= 0) throw DataLossError(str_cat(what_, ": invalid field number 0"));
  switch (f.type) {
    case kVarint:
      if (!get_varint(p_, end_, &f.varint)) {
        throw DataLossError(str_cat(what_, ": malformed varint in field ", f.number));
      }
      return true;
    case kFixed64:
    case kFixed32: {
      const size_t n = f.type == kFixed64 ? 8 : 4;
      if (static_cast<size_t>(end_ - p_) < n) {
        throw DataLossError(str_cat(what_, ": field ", f.number, " runs past the end"));
      }
      f.varint = 0;
      for (size_t i = 0; i < n; ++i) f.varint |= uint64_t{static_cast<uint8_t>(p_[i])} << (8 * i);
      p_ += n;
      return true;
    }
    case kLengthDelimited: {
      uint64_t len;
      if (!get_varint(p_, end_, &len) || len > static_cast<uint64_t>(end_ - p_)) {
        throw DataLossError(str_cat(what_, ": field ", f.number, " has a bad length"));
      }
      f.bytes = std::string_view(p_, static_cast<size_t>(len));
      p_ += len;
      return true;
    }
  }
  throw DataLossError(
      str_cat(what_, ": unsupported wire type ", static_cast<int>(f.type), " in field ", f.number));
}

}  // namespace dtrain::checkpoint::wire
