// Encoder of TensorBoard's Event proto (include/dtrain/summary/event.h); the decoder is
// event_decode.cc. Pure functions; thread-safe.
#include "dtrain/summary/event.h"

#include <cstring>

#include "dtrain/core/error.h"
#include "dtrain/core/proto_wire.h"
#include "event_fields.h"

namespace dtrain::summary {
namespace {

template <class T>
void put_le(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

// Little-endian tensor_content of `numbers` as `dtype`.
std::string tensor_content(DType dtype, const std::vector<double>& numbers) {
  std::string out;
  for (double x : numbers) {
    switch (dtype) {
      case DType::kFloat32:
        put_le(out, static_cast<float>(x));
        break;
      case DType::kFloat64:
        put_le(out, x);
        break;
      case DType::kInt32:
        put_le(out, static_cast<int32_t>(x));
        break;
      case DType::kInt64:
        put_le(out, static_cast<int64_t>(x));
        break;
      case DType::kInt16:
        put_le(out, static_cast<int16_t>(x));
        break;
      case DType::kInt8:
        put_le(out, static_cast<int8_t>(x));
        break;
      case DType::kUInt8:
        put_le(out, static_cast<uint8_t>(x));
        break;
      case DType::kUInt16:
        put_le(out, static_cast<uint16_t>(x));
        break;
      case DType::kUInt32:
        put_le(out, static_cast<uint32_t>(x));
        break;
      case DType::kUInt64:
        put_le(out, static_cast<uint64_t>(x));
        break;
      case DType::kBool:
        put_le(out, static_cast<uint8_t>(x != 0));
        break;
      default:
        throw InvalidArgumentError(
            str_cat("encode_event: tensor dtype ", dtype_name(dtype), " is not supported"));
    }
  }
  return out;
}

std::string encode_tensor(const SummaryValue& v) {
  const int64_t n = detail::element_count(v.shape);
  std::string t;
  wire::put_varint_field(t, tensor_field::kDtype, static_cast<uint64_t>(v.dtype));
  std::string shape;
  for (int64_t d : v.shape) {
    std::string dim;
    if (d != 0) wire::put_varint_field(dim, 1, static_cast<uint64_t>(d));
    wire::put_bytes_field(shape, 2, dim);
  }
  wire::put_bytes_field(t, tensor_field::kShape, shape);
  if (v.dtype == DType::kString) {
    DTRAIN_CHECK(static_cast<int64_t>(v.strings.size()) == n, "encode_event: tag '", v.tag,
                 "' has ", v.strings.size(), " strings for ", n, " elements");
    for (const std::string& s : v.strings) wire::put_bytes_field(t, tensor_field::kStringVal, s);
  } else {
    DTRAIN_CHECK(static_cast<int64_t>(v.numbers.size()) == n, "encode_event: tag '", v.tag,
                 "' has ", v.numbers.size(), " numbers for ", n, " elements");
    const std::string content = tensor_content(v.dtype, v.numbers);
    if (!content.empty()) wire::put_bytes_field(t, tensor_field::kContent, content);
  }
  return t;
}

std::string encode_metadata(const SummaryMetadata& m) {
  std::string out;
  if (!m.plugin_name.empty() || !m.plugin_content.empty()) {
    std::string pd;
    if (!m.plugin_name.empty()) wire::put_bytes_field(pd, 1, m.plugin_name);
    if (!m.plugin_content.empty()) wire::put_bytes_field(pd, 2, m.plugin_content);
    wire::put_bytes_field(out, 1, pd);
  }
  if (!m.display_name.empty()) wire::put_bytes_field(out, 2, m.display_name);
  if (!m.description.empty()) wire::put_bytes_field(out, 3, m.description);
  if (m.data_class != DataClass::kUnknown) {
    wire::put_varint_field(out, 4, static_cast<uint64_t>(m.data_class));
  }
  return out;
}

std::string encode_value(const SummaryValue& v) {
  std::string out;
  if (!v.tag.empty()) wire::put_bytes_field(out, value_field::kTag, v.tag);
  switch (v.kind) {
    case ValueKind::kNone:
      break;
    case ValueKind::kSimpleValue:
      wire::put_float_field(out, value_field::kSimpleValue, static_cast<float>(v.value));
      break;
    case ValueKind::kTensor:
      break;  // field 8 comes after node_name (7)
    default:
      throw InvalidArgumentError(str_cat("encode_event: tag '", v.tag, "': cannot encode a ",
                                         value_kind_name(v.kind), " value"));
  }
  if (!v.node_name.empty()) wire::put_bytes_field(out, value_field::kNodeName, v.node_name);
  if (v.kind == ValueKind::kTensor)
    wire::put_bytes_field(out, value_field::kTensor, encode_tensor(v));
  if (!v.metadata.empty())
    wire::put_bytes_field(out, value_field::kMetadata, encode_metadata(v.metadata));
  return out;
}

}  // namespace

bool SummaryValue::is_scalar() const {
  if (kind == ValueKind::kSimpleValue) return true;
  return kind == ValueKind::kTensor && dtype != DType::kString && numbers.size() == 1;
}

std::string SummaryValue::text() const {
  std::string out;
  for (size_t i = 0; i < strings.size(); ++i) {
    if (i) out += '\n';
    out += strings[i];
  }
  return out;
}

std::string encode_event(const Event& e) {
  std::string out;
  if (e.wall_time != 0) wire::put_double_field(out, event_field::kWallTime, e.wall_time);
  if (e.step != 0) wire::put_varint_field(out, event_field::kStep, static_cast<uint64_t>(e.step));
  switch (e.kind) {
    case EventKind::kNone:
      break;
    case EventKind::kFileVersion:
      wire::put_bytes_field(out, event_field::kFileVersion, e.file_version);
      break;
    case EventKind::kGraphDef:
      wire::put_bytes_field(out, event_field::kGraphDef, e.blob);
      break;
    case EventKind::kSummary: {
      std::string summary;
      for (const SummaryValue& v : e.values) wire::put_bytes_field(summary, 1, encode_value(v));
      wire::put_bytes_field(out, event_field::kSummary, summary);
      break;
    }
    case EventKind::kLogMessage: {
      std::string m;
      if (e.log_level != 0) wire::put_varint_field(m, 1, static_cast<uint64_t>(e.log_level));
      if (!e.message.empty()) wire::put_bytes_field(m, 2, e.message);
      wire::put_bytes_field(out, event_field::kLogMessage, m);
      break;
    }
    case EventKind::kSessionLog: {
      std::string s;
      if (e.session_status != SessionStatus::kUnspecified) {
        wire::put_varint_field(s, 1, static_cast<uint64_t>(e.session_status));
      }
      if (!e.checkpoint_path.empty()) wire::put_bytes_field(s, 2, e.checkpoint_path);
      if (!e.message.empty()) wire::put_bytes_field(s, 3, e.message);
      wire::put_bytes_field(out, event_field::kSessionLog, s);
      break;
    }
    case EventKind::kTaggedRunMetadata: {
      std::string t;
      if (!e.tag.empty()) wire::put_bytes_field(t, 1, e.tag);
      if (!e.blob.empty()) wire::put_bytes_field(t, 2, e.blob);
      wire::put_bytes_field(out, event_field::kTaggedRunMetadata, t);
      break;
    }
    case EventKind::kMetaGraphDef:
      wire::put_bytes_field(out, event_field::kMetaGraphDef, e.blob);
      break;
  }
  if (!e.source_writer.empty()) {
    std::string sm;
    wire::put_bytes_field(sm, 1, e.source_writer);
    wire::put_bytes_field(out, event_field::kSourceMetadata, sm);
  }
  return out;
}

const char* event_kind_name(EventKind kind) {
  switch (kind) {
    case EventKind::kNone:
      return "none";
    case EventKind::kFileVersion:
      return "file_version";
    case EventKind::kGraphDef:
      return "graph_def";
    case EventKind::kSummary:
      return "summary";
    case EventKind::kLogMessage:
      return "log_message";
    case EventKind::kSessionLog:
      return "session_log";
    case EventKind::kTaggedRunMetadata:
      return "tagged_run_metadata";
    case EventKind::kMetaGraphDef:
      return "meta_graph_def";
  }
  return "unknown";
}

const char* value_kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::kNone:
      return "none";
    case ValueKind::kSimpleValue:
      return "simple_value";
    case ValueKind::kTensor:
      return "tensor";
    case ValueKind::kHistogram:
      return "histo";
    case ValueKind::kImage:
      return "image";
    case ValueKind::kAudio:
      return "audio";
  }
  return "unknown";
}

}  // namespace dtrain::summary
