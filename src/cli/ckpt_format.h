// Formatting for `dtrain ckpt` (src/cli/ckpt.cc): sizes, times, tensor values (float32 in its
// shortest exact form, float16/bfloat16 widened), string tensors and CRCs. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain::cli::ckpt_format {

std::string human_bytes(uint64_t n);        // "1.2 MiB"
std::string utc_time(double unix_seconds);  // "2026-12-01T17:26:09Z"
// Element i of a numeric tensor as a double.
double element(const Tensor& t, int64_t i);
std::string format_element(const Tensor& t, int64_t i);
// The values, row-major and flattened, at most `limit` of them (0: all).
std::string format_values(const Tensor& t, int64_t limit);
std::string format_strings(const std::vector<std::string>& values, std::string_view key,
                           int64_t limit);
std::string dtype_string(DType d);  // dtype_name, and "string"
std::string hex_crc(uint32_t crc);  // "0x0123abcd"

}  // namespace dtrain::cli::ckpt_format
