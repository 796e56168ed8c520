// Formatting for `dtrain ckpt` (ckpt_format.h).
#include "ckpt_format.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"

namespace dtrain::cli::ckpt_format {

namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n < 1024) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  } else if (n < (1u << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", n / 1024.0);
  } else if (n < (1u << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", n / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", n / 1073741824.0);
  }
  return buf;
}

std::string utc_time(double unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Element i of a numeric tensor as a double.
double element(const Tensor& t, int64_t i) {
  const char* p = static_cast<const char*>(t.raw_data()) + i * dtype_size(t.dtype());
  auto get = [p]<class T>(T) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return static_cast<double>(v);
  };
  switch (t.dtype()) {
    case DType::kFloat32:
      return get(float{});
    case DType::kFloat64:
      return get(double{});
    case DType::kInt32:
      return get(int32_t{});
    case DType::kUInt8:
      return get(uint8_t{});
    case DType::kInt16:
      return get(int16_t{});
    case DType::kInt8:
      return get(int8_t{});
    case DType::kInt64:
      return get(int64_t{});
    case DType::kBool:
      return *p != 0 ? 1.0 : 0.0;
    case DType::kUInt16:
      return get(uint16_t{});
    case DType::kUInt32:
      return get(uint32_t{});
    case DType::kUInt64:
      return get(uint64_t{});
    case DType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      const uint32_t bits = static_cast<uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return half_to_float(h);
    }
    default:
      throw UnimplementedError(str_cat("no element access for dtype ", dtype_name(t.dtype())));
  }
}

// Shortest text that reads back to the same value (float32 values as float32).
std::string format_element(const Tensor& t, int64_t i) {
  const double v = element(t, i);
  if (t.dtype() == DType::kBool) return v != 0 ? "true" : "false";
  char buf[64];
  std::to_chars_result r;
  switch (t.dtype()) {
    case DType::kFloat64:
      r = std::to_chars(buf, buf + sizeof buf, v);
      break;
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
      r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(v));
      break;
    case DType::kUInt64: {
      uint64_t u;
      std::memcpy(&u, static_cast<const char*>(t.raw_data()) + i * 8, 8);
      r = std::to_chars(buf, buf + sizeof buf, u);
      break;
    }
    case DType::kInt64: {
      int64_t s;
      std::memcpy(&s, static_cast<const char*>(t.raw_data()) + i * 8, 8);
      r = std::to_chars(buf, buf + sizeof buf, s);
      break;
    }
    default:
      r = std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v));
      break;
  }
  return std::string(buf, r.ptr);
}

// "[0.5, 2, ...]" with at most `limit` elements (0: all), flattened row-major.
std::string format_values(const Tensor& t, int64_t limit) {
  const int64_t n = t.num_elements();
  const int64_t shown = limit > 0 ? std::min(n, limit) : n;
  std::string s = t.rank() == 0 ? "" : "[";
  for (int64_t i = 0; i < shown; ++i) s += (i ? ", " : "") + format_element(t, i);
  if (shown < n) s += str_cat(", ... (", n - shown, " more)");
  return t.rank() == 0 ? s : s + "]";
}

std::string format_strings(const std::vector<std::string>& values, std::string_view key,
                           int64_t limit) {
  if (key == checkpoint::kObjectGraphKey) {
    return str_cat("<serialized TrackableObjectGraph, ", values.empty() ? 0 : values[0].size(),
                   " bytes>");
  }
  const size_t shown =
      limit > 0 ? std::min(values.size(), static_cast<size_t>(limit)) : values.size();
  std::string s = "[";
  for (size_t i = 0; i < shown; ++i) {
    s += (i ? ", " : "") +
         nlohmann::json(values[i]).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (shown < values.size()) s += str_cat(", ... (", values.size() - shown, " more)");
  return s + "]";
}

std::string dtype_string(DType d) { return d == DType::kString ? "string" : dtype_name(d); }

std::string hex_crc(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", crc);
  return buf;
}

}  // namespace dtrain::cli::ckpt_format
