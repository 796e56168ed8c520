// Class-label checks (include/dtrain/data/labels.h).
#include "dtrain/data/labels.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "dtrain/core/error.h"

namespace dtrain::data {
namespace {

[[noreturn]] void bad_label(const std::string& source, int64_t row, const std::string& label,
                            const std::string& why) {
  throw InvalidArgumentError(str_cat(source, ": row ", row + 1, ": label ", label, " ", why));
}

template <class T>
int64_t check_rows(const T* p, int64_t n, const std::string& source, int64_t max_classes) {
  int64_t classes = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T v = p[i];
    int64_t label = 0;
    if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(v) || v != std::trunc(v)) {
        bad_label(source, i, str_cat(v), "is not an integer class index");
      }
      if (v < 0) bad_label(source, i, str_cat(v), "is negative: class indices start at 0");
      if (v >= static_cast<T>(max_classes)) {
        bad_label(source, i, v < 9e18 ? str_cat(static_cast<int64_t>(v)) : str_cat(v),
                  str_cat("implies more than ", max_classes, " classes (the most dtrain accepts)"));
      }
      label = static_cast<int64_t>(v);
    } else {
      if constexpr (std::is_signed_v<T>) {
        if (v < 0) bad_label(source, i, str_cat(+v), "is negative: class indices start at 0");
      }
      if (static_cast<uint64_t>(v) >= static_cast<uint64_t>(max_classes)) {
        bad_label(source, i, str_cat(+v),
                  str_cat("implies more than ", max_classes, " classes (the most dtrain accepts)"));
      }
      label = static_cast<int64_t>(v);
    }
    classes = std::max(classes, label + 1);
  }
  return classes;
}

}  // namespace

int64_t check_class_labels(const Tensor& labels, const std::string& source, int64_t max_classes) {
  DTRAIN_CHECK(max_classes >= 1, "check_class_labels: max_classes is ", max_classes);
  if (!labels.defined()) return 0;
  const int64_t n = labels.num_elements();
  const void* p = labels.raw_data();
  switch (labels.dtype()) {
    case DType::kFloat32:
      return check_rows(static_cast<const float*>(p), n, source, max_classes);
    case DType::kFloat64:
      return check_rows(static_cast<const double*>(p), n, source, max_classes);
    case DType::kUInt8:
      return check_rows(static_cast<const uint8_t*>(p), n, source, max_classes);
    case DType::kInt8:
      return check_rows(static_cast<const int8_t*>(p), n, source, max_classes);
    case DType::kInt16:
      return check_rows(static_cast<const int16_t*>(p), n, source, max_classes);
    case DType::kInt32:
      return check_rows(static_cast<const int32_t*>(p), n, source, max_classes);
    case DType::kInt64:
      return check_rows(static_cast<const int64_t*>(p), n, source, max_classes);
    case DType::kUInt16:
      return check_rows(static_cast<const uint16_t*>(p), n, source, max_classes);
    case DType::kUInt32:
      return check_rows(static_cast<const uint32_t*>(p), n, source, max_classes);
    default:
      throw InvalidArgumentError(str_cat(source, ": labels of dtype ", dtype_name(labels.dtype()),
                                         " are not class indices (need integers)"));
  }
}

}  // namespace dtrain::data
