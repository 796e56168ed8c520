// TensorBoard's Event protocol buffer as plain C++ values, with a hand-written encoder and decoder
// (no protobuf dependency). Field numbers and plugin conventions are those of
// tensorboard/compat/proto/{event,summary,tensor}.proto; docs/tensorboard.md and
// shared/reference/formats.md §3 describe the bytes. Pure values and functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/dtype.h"

namespace dtrain::summary {

// The file_version string of the first record of every event file TensorFlow 2 writes.
inline constexpr std::string_view kFileVersion = "brain.Event:2";
// Plugin names TensorBoard dispatches on (SummaryMetadata.plugin_data.plugin_name).
inline constexpr std::string_view kScalarsPlugin = "scalars";
inline constexpr std::string_view kTextPlugin = "text";
inline constexpr std::string_view kHistogramsPlugin = "histograms";

// SummaryMetadata.data_class (summary.proto).
enum class DataClass : int32_t { kUnknown = 0, kScalar = 1, kTensor = 2, kBlobSequence = 3 };

struct SummaryMetadata {
  std::string plugin_name;     // "scalars", "text", ...; empty: no plugin_data
  std::string plugin_content;  // serialized plugin data; empty is version 0 of every plugin
  std::string display_name;
  std::string description;  // summary_description
  DataClass data_class = DataClass::kUnknown;

  bool empty() const {
    return plugin_name.empty() && plugin_content.empty() && display_name.empty() &&
           description.empty() && data_class == DataClass::kUnknown;
  }
  bool operator==(const SummaryMetadata&) const = default;
};

// Which member of Summary.Value's `value` oneof is set.
enum class ValueKind {
  kNone,         // no value (e.g. metadata only)
  kSimpleValue,  // TF1 scalar: `value` holds the float
  kTensor,       // TensorProto: dtype, shape, numbers or strings
  kHistogram,    // TF1 HistogramProto (not decoded further)
  kImage,        // not decoded further
  kAudio,        // not decoded further
};

// One Summary.Value: a tag, its metadata and a value.
struct SummaryValue {
  std::string tag;
  std::string node_name;  // TF1 only; usually empty
  SummaryMetadata metadata;
  ValueKind kind = ValueKind::kNone;
  double value = 0;                  // kSimpleValue; or the single element of a numeric kTensor
  DType dtype = DType::kInvalid;     // kTensor
  std::vector<int64_t> shape;        // kTensor; empty = rank 0
  std::vector<double> numbers;       // kTensor with a numeric or bool dtype, row-major
  std::vector<std::string> strings;  // kTensor with DType::kString (string_val), row-major

  // True for a simple_value, or a tensor of a numeric dtype holding exactly one element (how
  // TF2, PyTorch and dtrain write scalars); `value` then holds it.
  bool is_scalar() const;
  // The Markdown of a string tensor (the text plugin): its strings joined by newlines.
  std::string text() const;
  bool operator==(const SummaryValue&) const = default;
};

// SessionLog.status (event.proto). A START after the first, in a file with file_version >= 2,
// makes TensorBoard's Python loader drop already-loaded data with step >= the START's step.
enum class SessionStatus : int32_t { kUnspecified = 0, kStart = 1, kStop = 2, kCheckpoint = 3 };

// Which member of Event's `what` oneof is set.
enum class EventKind {
  kNone,
  kFileVersion,
  kGraphDef,
  kSummary,
  kLogMessage,  // deprecated; TensorBoard ignores it
  kSessionLog,
  kTaggedRunMetadata,
  kMetaGraphDef,
};

struct Event {
  double wall_time = 0;  // seconds since the Unix epoch
  int64_t step = 0;
  EventKind kind = EventKind::kNone;
  std::string file_version;                                    // kFileVersion
  std::vector<SummaryValue> values;                            // kSummary
  SessionStatus session_status = SessionStatus::kUnspecified;  // kSessionLog
  std::string checkpoint_path;                                 // kSessionLog
  std::string message;        // kSessionLog msg, kLogMessage message
  int32_t log_level = 0;      // kLogMessage
  std::string tag;            // kTaggedRunMetadata
  std::string blob;           // kGraphDef, kMetaGraphDef, kTaggedRunMetadata: raw bytes
  std::string source_writer;  // source_metadata.writer; usually empty

  bool operator==(const Event&) const = default;
};

// Serializes `event` as an Event proto: fields in field-number order, proto3 defaults omitted,
// numeric tensors as `tensor_content` in little-endian (as TF2's writer does), string tensors as
// `string_val`. Throws InvalidArgumentError when `numbers` or `strings` disagree with the shape,
// or a tensor has an unsupported dtype.
std::string encode_event(const Event& event);

// Parses a serialized Event proto. Unknown fields are skipped. Numeric tensors are read from
// tensor_content or the typed *_val fields (packed or not); a single *_val entry is broadcast to
// the shape as TensorFlow does. Throws DataLossError on malformed bytes.
Event decode_event(std::string_view bytes);

// Short lowercase names for dumps: "file_version", "summary", ...; "simple_value", "tensor", ...
const char* event_kind_name(EventKind kind);
const char* value_kind_name(ValueKind kind);

}  // namespace dtrain::summary
