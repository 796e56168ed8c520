// The protobuf wire codec against bytes protobuf's own serializer produces (the encodings in
// https://protobuf.dev/programming-guides/encoding/): varints up to 10 bytes, negative int64,
// fixed32/fixed64, floats and doubles, length-delimited fields, and every way a message can be
// malformed (truncated varint, fixed-width value or payload, field number 0, groups).
#include "dtrain/core/proto_wire.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dtrain/core/error.h"
#include "testutil/expect_throws.h"

namespace dtrain {
namespace {

using testutil::expect_throws_with;

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

std::string varint(uint64_t v) {
  std::string s;
  wire::put_varint(s, v);
  return s;
}

std::vector<wire::Field> parse(const std::string& message) {
  wire::Reader r(message, "Test");
  std::vector<wire::Field> out;
  wire::Field f;
  while (r.next(f)) out.push_back(f);
  EXPECT_TRUE(r.done());
  return out;
}

TEST(ProtoWire, VarintsMatchProtobufsEncoding) {
  EXPECT_EQ(varint(0), bytes({0x00}));
  EXPECT_EQ(varint(1), bytes({0x01}));
  EXPECT_EQ(varint(127), bytes({0x7f}));
  EXPECT_EQ(varint(128), bytes({0x80, 0x01}));
  EXPECT_EQ(varint(150), bytes({0x96, 0x01}));  // the encoding guide's example
  EXPECT_EQ(varint(16384), bytes({0x80, 0x80, 0x01}));
  EXPECT_EQ(varint(std::numeric_limits<uint64_t>::max()),
            bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{300}, uint64_t{1} << 35, uint64_t{1} << 63,
                     std::numeric_limits<uint64_t>::max()}) {
    const std::string s = varint(v);
    const char* p = s.data();
    uint64_t got = 0;
    ASSERT_TRUE(wire::get_varint(p, s.data() + s.size(), &got)) << v;
    EXPECT_EQ(got, v);
    EXPECT_EQ(p, s.data() + s.size());
  }
}

TEST(ProtoWire, NegativeInt64TakesTenBytesAndRoundTrips) {
  std::string s;
  wire::put_varint_field(s, 2, static_cast<uint64_t>(int64_t{-1}));  // Event.step = -1
  EXPECT_EQ(s, bytes({0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
  std::string m;
  wire::put_varint_field(m, 1, static_cast<uint64_t>(std::numeric_limits<int64_t>::min()));
  const auto fields = parse(m);
  ASSERT_EQ(fields.size(), 1u);
  EXPECT_EQ(fields[0].type, wire::kVarint);
  EXPECT_EQ(static_cast<int64_t>(fields[0].value), std::numeric_limits<int64_t>::min());
  // An int32 enum such as DataType is sign-extended as well.
  std::string e;
  wire::put_varint_field(e, 1, static_cast<uint64_t>(static_cast<int64_t>(int32_t{-7})));
  EXPECT_EQ(e.size(), 11u);
  EXPECT_EQ(static_cast<int32_t>(parse(e)[0].value), -7);
}

TEST(ProtoWire, FixedWidthFieldsAreLittleEndian) {
  std::string s;
  wire::put_fixed32_field(s, 6, 0x12345678u);  // BundleEntryProto.crc32c
  EXPECT_EQ(s, bytes({0x35, 0x78, 0x56, 0x34, 0x12}));
  std::string d;
  wire::put_double_field(d, 1, 1.0);  // Event.wall_time
  EXPECT_EQ(d, bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f}));
  std::string f;
  wire::put_float_field(f, 2, 0.5f);  // Summary.Value.simple_value
  EXPECT_EQ(f, bytes({0x15, 0, 0, 0, 0x3f}));
  std::string all = s + d + f;
  wire::put_fixed64_field(all, 9, 0x0102030405060708u);
  const auto fields = parse(all);
  ASSERT_EQ(fields.size(), 4u);
  EXPECT_EQ(fields[0].number, 6);
  EXPECT_EQ(fields[0].type, wire::kFixed32);
  EXPECT_EQ(fields[0].value, 0x12345678u);
  EXPECT_EQ(fields[1].type, wire::kFixed64);
  EXPECT_EQ(fields[1].as_double(), 1.0);
  EXPECT_EQ(fields[2].as_float(), 0.5f);
  EXPECT_EQ(fields[3].number, 9);
  EXPECT_EQ(fields[3].value, 0x0102030405060708u);
}

TEST(ProtoWire, LengthDelimitedFieldsNestAndViewTheMessage) {
  // TensorShapeProto { dim { size: 3 } dim { size: 0 } } as TF writes it: a zero size is left
  // out.
  std::string dim3, dim0, shape;
  wire::put_varint_field(dim3, 1, 3);
  wire::put_bytes_field(shape, 2, dim3);
  wire::put_bytes_field(shape, 2, dim0);
  EXPECT_EQ(shape, bytes({0x12, 0x02, 0x08, 0x03, 0x12, 0x00}));
  std::string message;
  wire::put_bytes_field(message, 1, "abc");
  wire::put_bytes_field(message, 2, shape);
  wire::put_bytes_field(message, 536870911, std::string(200, 'x'));  // the largest field number
  const auto fields = parse(message);
  ASSERT_EQ(fields.size(), 3u);
  EXPECT_EQ(fields[0].bytes, "abc");
  EXPECT_EQ(fields[0].value, 0u);
  EXPECT_EQ(fields[1].bytes, shape);
  EXPECT_EQ(fields[1].bytes.data(), message.data() + 7);  // a view, not a copy
  EXPECT_EQ(fields[2].number, wire::kMaxFieldNumber);
  EXPECT_EQ(fields[2].bytes.size(), 200u);
  const auto dims = parse(std::string(fields[1].bytes));
  ASSERT_EQ(dims.size(), 2u);
  EXPECT_EQ(parse(std::string(dims[0].bytes))[0].value, 3u);
  EXPECT_TRUE(dims[1].bytes.empty());
  // A packed repeated varint field is read element by element.
  std::string packed = varint(1) + varint(300) + varint(static_cast<uint64_t>(int64_t{-2}));
  wire::Reader r(packed, "packed");
  EXPECT_EQ(r.varint(), 1u);
  EXPECT_EQ(r.varint(), 300u);
  EXPECT_EQ(static_cast<int64_t>(r.varint()), -2);
  EXPECT_TRUE(r.done());
}

void expect_malformed(const std::string& message, std::string_view why) {
  expect_throws_with<DataLossError>(
      [&] {
        wire::Reader r(message, "BundleEntryProto of 'w' in /tmp/x.index");
        wire::Field f;
        while (r.next(f)) {
        }
      },
      {"malformed BundleEntryProto of 'w' in /tmp/x.index at byte ", why});
}

TEST(ProtoWire, TruncatedAndMalformedMessagesAreDataLossNamingTheMessage) {
  expect_malformed(bytes({0x08}), "truncated varint");                   // tag, no value
  expect_malformed(bytes({0x08, 0x96}), "truncated varint");             // value cut mid-varint
  expect_malformed(bytes({0x80}), "truncated varint");                   // tag cut mid-varint
  expect_malformed(bytes({0x35, 0x78, 0x56}), "needs 4 bytes, 2 left");  // fixed32 cut
  expect_malformed(bytes({0x09, 1, 2, 3, 4, 5, 6, 7}), "needs 8 bytes, 7 left");
  expect_malformed(bytes({0x12, 0x05, 'a', 'b'}), "field 2 claims 5 bytes, 2 left");
  expect_malformed(bytes({0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}),
                   "claims 18446744073709551615 bytes");
  expect_malformed(bytes({0x00, 0x01}), "invalid field number 0");
  expect_malformed(varint((uint64_t{1} << 32) << 3 | 0) + bytes({0x01}),  // would wrap to 0
                   "invalid field number 4294967296");
  expect_malformed(bytes({0x0b}), "unsupported wire type 3");  // start group
  expect_malformed(bytes({0x0c}), "unsupported wire type 4");  // end group
  expect_malformed(bytes({0x0f}), "unsupported wire type 7");
  expect_malformed(std::string(11, static_cast<char>(0x80)) + bytes({0x01}),
                   "varint longer than 10 bytes");
  // The offset is where reading stopped.
  expect_malformed(bytes({0x08, 0x01, 0x08}), "at byte 3: truncated varint");

  const std::string too_long(11, static_cast<char>(0xff));
  const char* p = too_long.data();
  uint64_t v = 0;
  EXPECT_FALSE(wire::get_varint(p, too_long.data() + too_long.size(), &v));
  const std::string cut = bytes({0x96});
  p = cut.data();
  EXPECT_FALSE(wire::get_varint(p, cut.data() + cut.size(), &v));
}

TEST(ProtoWire, ReaderFailNamesTheMessageAndOffset) {
  std::string m;
  wire::put_varint_field(m, 1, 5);
  wire::Reader r(m, "Event");
  wire::Field f;
  ASSERT_TRUE(r.next(f));
  expect_throws_with<DataLossError>([&] { r.fail("wall_time is not a double"); },
                                    {"malformed Event at byte 2: wall_time is not a double"});
}

}  // namespace
}  // namespace dtrain
