// Decoder of TensorBoard's Event proto (include/dtrain/summary/event.h): every field dtrain
// writes and what TensorFlow's writers add, with bounds on what a malformed file can make it
// allocate. Pure functions; thread-safe.
#include <bit>
#include <cmath>
#include <cstring>

#include "dtrain/core/error.h"
#include "dtrain/core/proto_wire.h"
#include "dtrain/summary/event.h"
#include "event_fields.h"

namespace dtrain::summary {
namespace {

using wire::Field;
using wire::Reader;

float half_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    f = mant ? NAN : INFINITY;
  } else {
    f = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -f : f;
}

double from_varint(DType dtype, uint64_t raw) {
  switch (dtype) {
    case DType::kInt64:
      return static_cast<double>(static_cast<int64_t>(raw));
    case DType::kUInt64:
      return static_cast<double>(raw);
    case DType::kUInt32:
      return static_cast<double>(static_cast<uint32_t>(raw));
    case DType::kBool:
      return raw != 0 ? 1.0 : 0.0;
    case DType::kFloat16:
      return half_to_float(static_cast<uint16_t>(raw));
    case DType::kBFloat16:
      return std::bit_cast<float>(static_cast<uint32_t>(raw & 0xffff) << 16);
    default:
      return static_cast<double>(static_cast<int32_t>(raw));
  }
}

// Appends the elements of a repeated numeric field, packed (length-delimited) or not.
void read_repeated(const Field& f, DType dtype, std::vector<double>& out) {
  const bool fixed32 = f.number == tensor_field::kFloatVal;
  const bool fixed64 = f.number == tensor_field::kDoubleVal;
  if (f.type != wire::kLengthDelimited) {
    if (fixed32)
      out.push_back(f.as_float());
    else if (fixed64)
      out.push_back(f.as_double());
    else
      out.push_back(from_varint(dtype, f.value));
    return;
  }
  std::string_view b = f.bytes;
  if (fixed32 || fixed64) {
    const size_t w = fixed32 ? 4 : 8;
    if (b.size() % w != 0) throw DataLossError("malformed TensorProto: packed field length");
    for (size_t i = 0; i < b.size(); i += w) {
      if (fixed32) {
        uint32_t u;
        std::memcpy(&u, b.data() + i, 4);
        out.push_back(std::bit_cast<float>(u));
      } else {
        uint64_t u;
        std::memcpy(&u, b.data() + i, 8);
        out.push_back(std::bit_cast<double>(u));
      }
    }
    return;
  }
  Reader p(b, "TensorProto packed");
  while (!p.done()) out.push_back(from_varint(dtype, p.varint()));
}

template <class T>
void read_content(std::string_view c, std::vector<double>& out) {
  if (c.size() % sizeof(T) != 0) {
    throw DataLossError(str_cat("malformed TensorProto: tensor_content of ", c.size(),
                                " bytes is not a multiple of ", sizeof(T)));
  }
  for (size_t i = 0; i < c.size(); i += sizeof(T)) {
    T x;
    std::memcpy(&x, c.data() + i, sizeof(T));
    out.push_back(static_cast<double>(x));
  }
}

void decode_content(DType dtype, std::string_view c, std::vector<double>& out) {
  switch (dtype) {
    case DType::kFloat32:
      read_content<float>(c, out);
      break;
    case DType::kFloat64:
      read_content<double>(c, out);
      break;
    case DType::kInt32:
      read_content<int32_t>(c, out);
      break;
    case DType::kInt64:
      read_content<int64_t>(c, out);
      break;
    case DType::kInt16:
      read_content<int16_t>(c, out);
      break;
    case DType::kInt8:
      read_content<int8_t>(c, out);
      break;
    case DType::kUInt8:
      read_content<uint8_t>(c, out);
      break;
    case DType::kUInt16:
      read_content<uint16_t>(c, out);
      break;
    case DType::kUInt32:
      read_content<uint32_t>(c, out);
      break;
    case DType::kUInt64:
      read_content<uint64_t>(c, out);
      break;
    case DType::kBool:
      read_content<uint8_t>(c, out);
      break;
    case DType::kFloat16:
    case DType::kBFloat16: {
      std::vector<double> raw;
      read_content<uint16_t>(c, raw);
      for (double r : raw) out.push_back(from_varint(dtype, static_cast<uint64_t>(r)));
      break;
    }
    default:
      break;  // other dtypes (complex, resource, variant): not decoded
  }
}

void decode_tensor(std::string_view bytes, SummaryValue& v) {
  v.kind = ValueKind::kTensor;
  Reader p(bytes, "TensorProto");
  std::string_view content;
  bool has_content = false;
  std::vector<Field> vals;
  Field f;
  while (p.next(f)) {
    switch (f.number) {
      case tensor_field::kDtype:
        v.dtype = static_cast<DType>(f.value);
        break;
      case tensor_field::kShape: {
        Reader sp(f.bytes, "TensorShapeProto");
        Field d;
        while (sp.next(d)) {
          if (d.number != 2 || d.type != wire::kLengthDelimited) continue;
          Reader dp(d.bytes, "TensorShapeProto.Dim");
          int64_t size = 0;
          Field s;
          while (dp.next(s)) {
            if (s.number == 1) size = static_cast<int64_t>(s.value);
          }
          v.shape.push_back(size);
        }
        break;
      }
      case tensor_field::kContent:
        content = f.bytes;
        has_content = true;
        break;
      case tensor_field::kStringVal:
        v.strings.emplace_back(f.bytes);
        break;
      case tensor_field::kHalfVal:
      case tensor_field::kFloatVal:
      case tensor_field::kDoubleVal:
      case tensor_field::kIntVal:
      case tensor_field::kInt64Val:
      case tensor_field::kBoolVal:
      case tensor_field::kUint32Val:
      case tensor_field::kUint64Val:
        vals.push_back(f);
        break;
      default:
        break;
    }
  }
  if (v.dtype == DType::kString) return;
  if (has_content) {
    decode_content(v.dtype, content, v.numbers);
  } else {
    for (const Field& f : vals) read_repeated(f, v.dtype, v.numbers);
    // TensorFlow repeats the last value when a *_val field has fewer entries than elements.
    const int64_t n = detail::element_count(v.shape);
    if (n > detail::kMaxDecodedElements)
      throw DataLossError("malformed TensorProto: shape too large");
    if (!v.numbers.empty() && n > static_cast<int64_t>(v.numbers.size())) {
      v.numbers.resize(static_cast<size_t>(n), v.numbers.back());
    }
  }
  if (v.numbers.size() == 1) v.value = v.numbers[0];
}

SummaryMetadata decode_metadata(std::string_view bytes) {
  SummaryMetadata m;
  Reader p(bytes, "SummaryMetadata");
  Field f;
  while (p.next(f)) {
    switch (f.number) {
      case 1: {
        Reader pp(f.bytes, "SummaryMetadata.PluginData");
        Field g;
        while (pp.next(g)) {
          if (g.number == 1) m.plugin_name = g.bytes;
          if (g.number == 2) m.plugin_content = g.bytes;
        }
        break;
      }
      case 2:
        m.display_name = f.bytes;
        break;
      case 3:
        m.description = f.bytes;
        break;
      case 4:
        m.data_class = static_cast<DataClass>(f.value);
        break;
      default:
        break;
    }
  }
  return m;
}

SummaryValue decode_value(std::string_view bytes) {
  SummaryValue v;
  Reader p(bytes, "Summary.Value");
  Field f;
  while (p.next(f)) {
    switch (f.number) {
      case value_field::kTag:
        v.tag = f.bytes;
        break;
      case value_field::kNodeName:
        v.node_name = f.bytes;
        break;
      case value_field::kSimpleValue:
        if (f.type != wire::kFixed32) p.fail("simple_value is not fixed32");
        v.kind = ValueKind::kSimpleValue;
        v.value = f.as_float();
        break;
      case value_field::kObsoleteHisto:
      case value_field::kHisto:
        v.kind = ValueKind::kHistogram;
        break;
      case value_field::kImage:
        v.kind = ValueKind::kImage;
        break;
      case value_field::kAudio:
        v.kind = ValueKind::kAudio;
        break;
      case value_field::kTensor:
        decode_tensor(f.bytes, v);
        break;
      case value_field::kMetadata:
        v.metadata = decode_metadata(f.bytes);
        break;
      default:
        break;
    }
  }
  return v;
}

}  // namespace

Event decode_event(std::string_view bytes) {
  Event e;
  Reader p(bytes, "Event");
  Field f;
  while (p.next(f)) {
    const bool bytes_field = f.type == wire::kLengthDelimited;
    switch (f.number) {
      case event_field::kWallTime:
        if (f.type != wire::kFixed64) p.fail("wall_time is not a double");
        e.wall_time = f.as_double();
        break;
      case event_field::kStep:
        e.step = static_cast<int64_t>(f.value);
        break;
      case event_field::kFileVersion:
        if (!bytes_field) p.fail("file_version is not a string");
        e.kind = EventKind::kFileVersion;
        e.file_version = f.bytes;
        break;
      case event_field::kGraphDef:
      case event_field::kMetaGraphDef:
        e.kind =
            f.number == event_field::kGraphDef ? EventKind::kGraphDef : EventKind::kMetaGraphDef;
        e.blob = f.bytes;
        break;
      case event_field::kSummary: {
        if (!bytes_field) p.fail("summary is not a message");
        e.kind = EventKind::kSummary;
        Reader sp(f.bytes, "Summary");
        Field v;
        while (sp.next(v)) {
          if (v.number == 1 && v.type == wire::kLengthDelimited)
            e.values.push_back(decode_value(v.bytes));
        }
        break;
      }
      case event_field::kLogMessage: {
        e.kind = EventKind::kLogMessage;
        Reader lp(f.bytes, "LogMessage");
        Field g;
        while (lp.next(g)) {
          if (g.number == 1) e.log_level = static_cast<int32_t>(g.value);
          if (g.number == 2) e.message = g.bytes;
        }
        break;
      }
      case event_field::kSessionLog: {
        e.kind = EventKind::kSessionLog;
        Reader lp(f.bytes, "SessionLog");
        Field g;
        while (lp.next(g)) {
          if (g.number == 1) e.session_status = static_cast<SessionStatus>(g.value);
          if (g.number == 2) e.checkpoint_path = g.bytes;
          if (g.number == 3) e.message = g.bytes;
        }
        break;
      }
      case event_field::kTaggedRunMetadata: {
        e.kind = EventKind::kTaggedRunMetadata;
        Reader lp(f.bytes, "TaggedRunMetadata");
        Field g;
        while (lp.next(g)) {
          if (g.number == 1) e.tag = g.bytes;
          if (g.number == 2) e.blob = g.bytes;
        }
        break;
      }
      case event_field::kSourceMetadata: {
        Reader sp(f.bytes, "SourceMetadata");
        Field g;
        while (sp.next(g)) {
          if (g.number == 1) e.source_writer = g.bytes;
        }
        break;
      }
      default:
        break;
    }
  }
  return e;
}

}  // namespace dtrain::summary
