// Reader for numeric CSV files (plain or gzip-compressed) into a float32 table, and a helper that
// splits a label column off such a table. Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain::data {

struct CsvOptions {
  char delimiter = ',';             // field separator
  std::optional<bool> header = {};  // first row is a header; unset: yes iff one of its fields
                                    // is not a number
  char comment = '\0';              // lines starting with it are skipped; '\0': no comments
};

// Reads a CSV file of numbers into a float32 [rows, cols] tensor. Blank lines are skipped;
// fields may be surrounded by spaces and double quotes; "nan" and "inf" are accepted.
// Throws NotFoundError if the file does not exist, and InvalidArgumentError naming
// "<path>:<line>:<column>" and the offending text for a non-numeric or empty field, or a row
// whose field count differs from the first row's.
Tensor read_csv(const std::string& path, const CsvOptions& options = {});

struct LabeledTable {
  Tensor x;  // [rows, cols - 1] float32: every column but the label
  Tensor y;  // [rows] of the requested dtype: the label column
};

// Splits column `column` (negative counts from the end: -1 is the last) off a rank-2 float32
// table, converting it to `label_dtype`. Throws InvalidArgumentError for a column out of
// range, or a label that is not an integer in range when `label_dtype` is an integer type.
LabeledTable split_label_column(const Tensor& table, int64_t column = -1,
                                DType label_dtype = DType::kFloat32);

}  // namespace dtrain::data
