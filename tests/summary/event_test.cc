// Event proto encoder/decoder: byte-identical re-encoding of a real TF2 event file, decoding of
// every scalar encoding TensorFlow, PyTorch and TensorBoard write, and malformed input.
#include "dtrain/summary/event.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/summary/record.h"

namespace dtrain::summary {
namespace {

const std::string kFixture =
    std::string(DTRAIN_SOURCE_DIR) + "/../shared/fixtures/tensorboard/go_tb_my_metric.v2.tfevents";

std::vector<std::string> raw_records(const std::string& path) {
  RecordReader r(path);
  std::vector<std::string> out;
  std::string data;
  while (r.read(&data)) out.push_back(data);
  EXPECT_FALSE(r.truncated()) << r.truncation();
  return out;
}

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size();) {
    if (hex[i] == ' ') {
      ++i;
      continue;
    }
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    i += 2;
  }
  return out;
}

// The TF2 convention for a scalar, as in the fixture: float32 rank-0 tensor_content, plugin
// "scalars" (TF 2.1 wrote no data_class).
Event fixture_style_scalar(double wall_time, int64_t step, float value) {
  Event e;
  e.wall_time = wall_time;
  e.step = step;
  e.kind = EventKind::kSummary;
  SummaryValue v;
  v.tag = "my_metric";
  v.kind = ValueKind::kTensor;
  v.dtype = DType::kFloat32;
  v.numbers = {value};
  v.metadata.plugin_name = "scalars";
  e.values.push_back(v);
  return e;
}

TEST(EventTest, FixtureDecodesToTheDocumentedValues) {
  const std::vector<std::string> records = raw_records(kFixture);
  ASSERT_EQ(records.size(), 101u);
  const Event first = decode_event(records[0]);
  EXPECT_EQ(first.kind, EventKind::kFileVersion);
  EXPECT_EQ(first.file_version, "brain.Event:2");
  EXPECT_EQ(first.wall_time, 1585499054.0);  // TF's C++ writer: whole seconds
  EXPECT_EQ(first.step, 0);
  for (int i = 1; i <= 100; ++i) {
    const Event e = decode_event(records[i]);
    ASSERT_EQ(e.kind, EventKind::kSummary) << i;
    EXPECT_EQ(e.step, i - 1);
    EXPECT_GT(e.wall_time, 1585499054.0);
    ASSERT_EQ(e.values.size(), 1u);
    const SummaryValue& v = e.values[0];
    EXPECT_EQ(v.tag, "my_metric");
    EXPECT_EQ(v.kind, ValueKind::kTensor);
    EXPECT_EQ(v.dtype, DType::kFloat32);
    EXPECT_TRUE(v.shape.empty());
    EXPECT_TRUE(v.is_scalar());
    EXPECT_EQ(v.value, 0.5 * (i - 1));
    EXPECT_EQ(v.metadata.plugin_name, "scalars");
    EXPECT_EQ(v.metadata.plugin_content, "");
    EXPECT_EQ(v.metadata.data_class, DataClass::kUnknown);
  }
}

TEST(EventTest, ReencodesTheFixtureByteForByte) {
  const std::vector<std::string> records = raw_records(kFixture);
  ASSERT_EQ(records.size(), 101u);
  const std::string file = read_file(kFixture);
  // Built from plain values, not from the decoder's output: only wall_time comes from the file.
  Event version;
  version.wall_time = 1585499054.0;
  version.kind = EventKind::kFileVersion;
  version.file_version = std::string(kFileVersion);
  std::string ours = encode_record(encode_event(version));
  for (int step = 0; step < 100; ++step) {
    const double wall_time = decode_event(records[step + 1]).wall_time;
    const Event e = fixture_style_scalar(wall_time, step, 0.5f * static_cast<float>(step));
    EXPECT_EQ(encode_event(e), records[step + 1]) << "step " << step;
    ours += encode_record(encode_event(e));
  }
  EXPECT_EQ(ours.size(), file.size());
  EXPECT_TRUE(ours == file);
}

TEST(EventTest, DecodeThenEncodeIsIdentityOnTheFixture) {
  for (const std::string& r : raw_records(kFixture)) EXPECT_EQ(encode_event(decode_event(r)), r);
}

TEST(EventTest, FramingMatchesTheReferenceHeaderAndTextRecordCrcs) {
  // shared/reference/formats.md §3.2: a 24-byte record's header in a real TF2 file.
  EXPECT_EQ(encode_record(std::string(24, 'x')).substr(0, 12), unhex("18000000 00000000 a37f4b22"));
  // §3.5: a hand-encoded text-summary record (metadata before tensor: our encoder orders fields
  // by number, so compare the framing CRCs and the decoded values, not our encoding).
  const std::string data = unhex("09 00002059fc54d941 10 b009 2a 42 0a 40 0a 07") + "restart" +
                           unhex("4a 0a 0a 06 0a 04") + "text" +
                           unhex("20 02 42 29 08 07 12 00 42 23") +
                           "worker 3 lost; resumed from ckpt-12";
  const std::string framed = encode_record(data);
  EXPECT_EQ(framed.substr(0, 12), unhex("50000000 00000000 940f9b82"));
  EXPECT_EQ(framed.substr(framed.size() - 4), unhex("7d0d78d7"));
  const Event e = decode_event(data);
  EXPECT_EQ(e.wall_time, 1700000100.5);
  EXPECT_EQ(e.step, 1200);
  ASSERT_EQ(e.values.size(), 1u);
  EXPECT_EQ(e.values[0].tag, "restart");
  EXPECT_EQ(e.values[0].metadata.plugin_name, "text");
  EXPECT_EQ(e.values[0].metadata.data_class, DataClass::kTensor);
  EXPECT_EQ(e.values[0].dtype, DType::kString);
  EXPECT_EQ(e.values[0].text(), "worker 3 lost; resumed from ckpt-12");
}

TEST(EventTest, DecodesSimpleValueAndTypedValFieldsAsPyTorchWrites) {
  // TF1 / PyTorch add_scalar: simple_value (field 2, fixed32).
  std::string v1 = unhex("0a 04") + "loss" + unhex("15 0000c03f");
  std::string s1 = unhex("0a") + std::string(1, static_cast<char>(v1.size())) + v1;
  std::string ev = unhex("10 07 2a") + std::string(1, static_cast<char>(s1.size())) + s1;
  Event e = decode_event(ev);
  ASSERT_EQ(e.values.size(), 1u);
  EXPECT_EQ(e.values[0].kind, ValueKind::kSimpleValue);
  EXPECT_TRUE(e.values[0].is_scalar());
  EXPECT_EQ(e.values[0].value, 1.5);
  EXPECT_EQ(e.step, 7);
  EXPECT_EQ(encode_event(e), ev);

  // Tensor with a packed float_val (field 5), a double_val unpacked (field 6, fixed64), an int64.
  auto tensor_event = [](const std::string& tensor) {
    std::string v = unhex("0a 01") + "t" + unhex("42") +
                    std::string(1, static_cast<char>(tensor.size())) + tensor;
    std::string s = unhex("0a") + std::string(1, static_cast<char>(v.size())) + v;
    return unhex("2a") + std::string(1, static_cast<char>(s.size())) + s;
  };
  e = decode_event(tensor_event(unhex("08 01 12 00 2a 04 0000803e")));
  EXPECT_EQ(e.values[0].value, 0.25);
  e = decode_event(tensor_event(unhex("08 02 12 00 31 000000000000f83f")));
  EXPECT_EQ(e.values[0].dtype, DType::kFloat64);
  EXPECT_EQ(e.values[0].value, 1.5);
  e = decode_event(tensor_event(unhex("08 09 12 00 50 ffffffffffffffffff01")));
  EXPECT_EQ(e.values[0].value, -1.0);
  e = decode_event(tensor_event(unhex("08 03 12 00 38 2a")));
  EXPECT_EQ(e.values[0].value, 42.0);
  // One float_val broadcast to shape [2, 2], as TensorFlow does.
  e = decode_event(tensor_event(unhex("08 01 12 08 12 02 08 02 12 02 08 02 2d 00004040")));
  EXPECT_EQ(e.values[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(e.values[0].numbers, (std::vector<double>{3, 3, 3, 3}));
  EXPECT_FALSE(e.values[0].is_scalar());
}

TEST(EventTest, RoundTripsEveryEventKind) {
  Event s;
  s.wall_time = 1700000000.25;
  s.step = 1234;
  s.kind = EventKind::kSessionLog;
  s.session_status = SessionStatus::kStart;
  s.checkpoint_path = "ckpt-12";
  s.message = "resumed";
  EXPECT_EQ(decode_event(encode_event(s)), s);

  Event t;
  t.step = -3;  // negative steps survive (int64 two's complement varint)
  t.kind = EventKind::kSummary;
  SummaryValue text;
  text.tag = "failures";
  text.kind = ValueKind::kTensor;
  text.dtype = DType::kString;
  text.shape = {2};
  text.strings = {"a", "b\nc"};
  text.metadata = {.plugin_name = "text",
                   .plugin_content = std::string("\x08\x00", 2),
                   .display_name = "F",
                   .description = "d",
                   .data_class = DataClass::kTensor};
  SummaryValue h;
  h.tag = "w";
  h.kind = ValueKind::kTensor;
  h.dtype = DType::kFloat64;
  h.shape = {2, 3};
  h.numbers = {0, 1, 2, 1, 2.5, 3};
  t.values = {text, h};
  t.source_writer = "dtrain";
  EXPECT_EQ(decode_event(encode_event(t)), t);
  EXPECT_EQ(decode_event(encode_event(t)).values[0].text(), "a\nb\nc");
}

TEST(EventTest, RejectsMalformedBytesAndInconsistentTensors) {
  EXPECT_THROW(decode_event(unhex("0a ff")), DataLossError);       // truncated length
  EXPECT_THROW(decode_event(unhex("09 0000")), DataLossError);     // truncated double
  EXPECT_THROW(decode_event(unhex("1a 05 6162")), DataLossError);  // string past the end
  EXPECT_THROW(decode_event(unhex("0b")), DataLossError);          // wire type 3 (group)
  try {
    decode_event(unhex("2a 05 0a 03 0a 01"));
    FAIL();
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find("malformed"), std::string::npos) << e.what();
  }
  Event e;
  e.kind = EventKind::kSummary;
  SummaryValue v;
  v.tag = "x";
  v.kind = ValueKind::kTensor;
  v.dtype = DType::kFloat32;
  v.shape = {3};
  v.numbers = {1, 2};
  e.values = {v};
  EXPECT_THROW(encode_event(e), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::summary
