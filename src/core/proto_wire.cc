// Protocol-buffer wire format (https://protobuf.dev/programming-guides/encoding/).
#include "dtrain/core/proto_wire.h"

#include "dtrain/core/error.h"

namespace dtrain::wire {

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

void put_fixed32(std::string& out, uint32_t v) {
  char buf[4];
  for (int i = 0; i < 4; ++i) buf[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  out.append(buf, 4);
}

void put_fixed64(std::string& out, uint64_t v) {
  char buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  out.append(buf, 8);
}

void put_varint_field(std::string& out, int field, uint64_t v) {
  put_tag(out, field, kVarint);
  put_varint(out, v);
}

void put_fixed32_field(std::string& out, int field, uint32_t v) {
  put_tag(out, field, kFixed32);
  put_fixed32(out, v);
}

void put_fixed64_field(std::string& out, int field, uint64_t v) {
  put_tag(out, field, kFixed64);
  put_fixed64(out, v);
}

void put_bytes_field(std::string& out, int field, std::string_view bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
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

void Reader::fail(std::string_view why) const {
  throw DataLossError(str_cat("malformed ", what_, " at byte ", pos_, ": ", why));
}

uint64_t Reader::varint() {
  uint64_t v = 0;
  for (int shift = 0; shift <= 63; shift += 7) {
    if (done()) fail("truncated varint");
    const uint64_t byte = static_cast<uint8_t>(data_[pos_++]);
    v |= (byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return v;
  }
  fail("varint longer than 10 bytes");
}

bool Reader::next(Field& f) {
  if (done()) return false;
  const uint64_t tag = varint();
  const uint64_t number = tag >> 3;
  if (number == 0 || number > static_cast<uint64_t>(kMaxFieldNumber)) {
    fail(str_cat("invalid field number ", number));
  }
  f.number = static_cast<int>(number);
  f.type = static_cast<WireType>(tag & 7);
  f.value = 0;
  f.bytes = {};
  switch (f.type) {
    case kVarint:
      f.value = varint();
      return true;
    case kFixed64:
    case kFixed32: {
      const size_t n = f.type == kFixed64 ? 8 : 4;
      if (data_.size() - pos_ < n) {
        fail(str_cat("field ", f.number, " needs ", n, " bytes, ", data_.size() - pos_, " left"));
      }
      for (size_t i = 0; i < n; ++i) {
        f.value |= uint64_t{static_cast<uint8_t>(data_[pos_ + i])} << (8 * i);
      }
      pos_ += n;
      return true;
    }
    case kLengthDelimited: {
      const uint64_t len = varint();
      if (len > data_.size() - pos_) {
        fail(
            str_cat("field ", f.number, " claims ", len, " bytes, ", data_.size() - pos_, " left"));
      }
      f.bytes = data_.substr(pos_, static_cast<size_t>(len));
      pos_ += static_cast<size_t>(len);
      return true;
    }
  }
  fail(str_cat("field ", f.number, " has unsupported wire type ", static_cast<int>(tag & 7)));
}

}  // namespace dtrain::wire
