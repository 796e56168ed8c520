// DType sizes and names.
#include "dtrain/core/dtype.h"

#include "dtrain/core/error.h"

namespace dtrain {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kUInt8:
      return 1;
    case DType::kInt16:
      return 2;
    case DType::kInt8:
      return 1;
    case DType::kInt64:
      return 8;
    case DType::kBool:
      return 1;
    case DType::kBFloat16:
      return 2;
    case DType::kUInt16:
      return 2;
    case DType::kFloat16:
      return 2;
    case DType::kUInt32:
      return 4;
    case DType::kUInt64:
      return 8;
    case DType::kString:
    case DType::kInvalid:
      return 0;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt16:
      return "int16";
    case DType::kInt8:
      return "int8";
    case DType::kString:
      return "string";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kUInt16:
      return "uint16";
    case DType::kFloat16:
      return "float16";
    case DType::kUInt32:
      return "uint32";
    case DType::kUInt64:
      return "uint64";
    case DType::kInvalid:
      return "invalid";
  }
  return "invalid";
}

DType dtype_from_name(const std::string& name) {
  static constexpr DType kAll[] = {
      DType::kFloat32, DType::kFloat64, DType::kInt32,  DType::kUInt8, DType::kInt16,
      DType::kInt8,    DType::kString,  DType::kInt64,  DType::kBool,  DType::kBFloat16,
      DType::kUInt16,  DType::kFloat16, DType::kUInt32, DType::kUInt64};
  for (DType d : kAll) {
    if (name == dtype_name(d)) return d;
  }
  throw InvalidArgumentError("unknown dtype '" + name + "'");
}

}  // namespace dtrain
