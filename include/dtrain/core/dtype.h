// Element types. The numbering equals TensorFlow's DataType enum (types.proto), so a dtype
// read from or written to a TF checkpoint needs no translation table. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dtrain {

enum class DType : int32_t {
  kInvalid = 0,
  kFloat32 = 1,
  kFloat64 = 2,
  kInt32 = 3,
  kUInt8 = 4,
  kInt16 = 5,
  kInt8 = 6,
  kString = 7,
  kInt64 = 9,
  kBool = 10,
  kBFloat16 = 14,
  kUInt16 = 17,
  kFloat16 = 19,
  kUInt32 = 22,
  kUInt64 = 23,
};

// Size of one element in bytes; 0 for kString and kInvalid (strings are not stored in Tensor).
size_t dtype_size(DType dtype);
// Keras/NumPy spelling: "float32", "int64", ...
const char* dtype_name(DType dtype);
// Parses the spelling dtype_name() produces; throws InvalidArgumentError otherwise.
DType dtype_from_name(const std::string& name);

template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kUInt8;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kInt8;
};
template <>
struct DTypeOf<int16_t> {
  static constexpr DType value = DType::kInt16;
};
template <>
struct DTypeOf<uint16_t> {
  static constexpr DType value = DType::kUInt16;
};
template <>
struct DTypeOf<uint32_t> {
  static constexpr DType value = DType::kUInt32;
};
template <>
struct DTypeOf<uint64_t> {
  static constexpr DType value = DType::kUInt64;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};

template <class T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace dtrain
