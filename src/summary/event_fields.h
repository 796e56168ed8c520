// TensorBoard's Event proto (include/dtrain/summary/event.h): the field numbers and the element
// bound that its encoder (event.cc) and decoder (event_decode.cc) share. Private to src/summary.
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain::summary {

// Field numbers (tensorboard/compat/proto/*.proto).
namespace event_field {
constexpr int kWallTime = 1, kStep = 2, kFileVersion = 3, kGraphDef = 4, kSummary = 5,
              kLogMessage = 6, kSessionLog = 7, kTaggedRunMetadata = 8, kMetaGraphDef = 9,
              kSourceMetadata = 10;
}
namespace value_field {
constexpr int kTag = 1, kSimpleValue = 2, kObsoleteHisto = 3, kImage = 4, kHisto = 5, kAudio = 6,
              kNodeName = 7, kTensor = 8, kMetadata = 9;
}
namespace tensor_field {
constexpr int kDtype = 1, kShape = 2, kContent = 4, kHalfVal = 13, kFloatVal = 5, kDoubleVal = 6,
              kIntVal = 7, kStringVal = 8, kInt64Val = 10, kBoolVal = 11, kUint32Val = 16,
              kUint64Val = 17;
}

namespace detail {

// The most elements a decoded tensor may have (a malformed shape allocates no more).
constexpr int64_t kMaxDecodedElements = int64_t{1} << 26;

inline int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > kMaxDecodedElements / d) return kMaxDecodedElements + 1;
    n *= d;
  }
  return n;
}

}  // namespace detail
}  // namespace dtrain::summary
