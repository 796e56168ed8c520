// CSV parsing: the whole file is read (through zlib, so .csv.gz works too), split into lines and
// fields in place, and each field parsed with std::from_chars.
#include "dtrain/data/csv.h"

#include <zlib.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

#include "dtrain/core/error.h"

namespace dtrain::data {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

std::string read_file(const std::string& path) {
  errno = 0;
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) {
    if (errno == ENOENT || errno == ENOTDIR) {
      throw NotFoundError(str_cat("read_csv: ", path, ": no such file"));
    }
    throw NotFoundError(str_cat("read_csv: ", path,
                                ": cannot open: ", errno ? std::strerror(errno) : "unknown error"));
  }
  gzbuffer(f.get(), 1 << 18);
  std::string text;
  constexpr size_t kChunk = size_t{1} << 20;
  for (;;) {
    const size_t old = text.size();
    text.resize(old + kChunk);
    const int got = gzread(f.get(), text.data() + old, static_cast<unsigned>(kChunk));
    if (got < 0) {
      int code = Z_OK;
      const char* msg = gzerror(f.get(), &code);
      throw DataLossError(str_cat("read_csv: ", path, ": read error: ", msg ? msg : "unknown"));
    }
    text.resize(old + static_cast<size_t>(got));
    if (static_cast<size_t>(got) < kChunk) break;
  }
  return text;
}

struct Field {
  std::string_view text;  // trimmed, unquoted
  size_t column = 0;      // 1-based byte column of the raw field in its line
};

bool is_blank(char c, char delimiter) { return (c == ' ' || c == '\t') && c != delimiter; }

// Splits `line` into fields; double quotes group text (with "" for a literal quote, which is
// kept doubled: numeric fields never contain one).
void split_fields(std::string_view line, char delimiter, std::vector<Field>& fields) {
  fields.clear();
  size_t i = 0;
  for (;;) {
    const size_t start = i;
    size_t end = i;
    bool quoted = false;
    while (end < line.size()) {
      if (line[end] == '"') {
        quoted = !quoted;
      } else if (line[end] == delimiter && !quoted) {
        break;
      }
      ++end;
    }
    std::string_view text = line.substr(start, end - start);
    while (!text.empty() && is_blank(text.front(), delimiter)) text.remove_prefix(1);
    while (!text.empty() && is_blank(text.back(), delimiter)) text.remove_suffix(1);
    if (text.size() >= 2 && text.front() == '"' && text.back() == '"') {
      text = text.substr(1, text.size() - 2);
      while (!text.empty() && is_blank(text.front(), delimiter)) text.remove_prefix(1);
      while (!text.empty() && is_blank(text.back(), delimiter)) text.remove_suffix(1);
    }
    fields.push_back({text, start + 1});
    if (end >= line.size()) break;
    i = end + 1;
  }
}

bool parse_float(std::string_view s, float& out) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  // Out-of-range values parse to +-inf or 0 as in strtof, rather than failing the file.
  if (ec == std::errc::result_out_of_range) {
    out = s.front() == '-' ? -std::numeric_limits<float>::infinity()
                           : std::numeric_limits<float>::infinity();
    return ptr == s.data() + s.size();
  }
  return ec == std::errc() && ptr == s.data() + s.size();
}

std::string quote(std::string_view s) {
  constexpr size_t kMax = 40;
  return str_cat("'", s.size() > kMax ? std::string(s.substr(0, kMax)) + "..." : std::string(s),
                 "'");
}

}  // namespace

Tensor read_csv(const std::string& path, const CsvOptions& options) {
  DTRAIN_CHECK(options.delimiter != '\n' && options.delimiter != '\r' && options.delimiter != '"',
               "read_csv: invalid delimiter");
  const std::string text = read_file(path);
  std::vector<float> values;
  std::vector<Field> fields;
  int64_t cols = -1;
  int64_t rows = 0;
  int64_t first_row_line = 0;
  bool first_line = true;
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    if (options.comment != '\0' && line.front() == options.comment) continue;
    split_fields(line, options.delimiter, fields);
    if (first_line) {
      first_line = false;
      bool header = options.header.value_or(false);
      if (!options.header.has_value()) {
        float v;
        for (const Field& f : fields) header = header || !parse_float(f.text, v);
      }
      if (header) {
        cols = static_cast<int64_t>(fields.size());
        first_row_line = line_no;
        continue;
      }
    }
    if (cols < 0) {
      cols = static_cast<int64_t>(fields.size());
      first_row_line = line_no;
    }
    if (static_cast<int64_t>(fields.size()) != cols) {
      const size_t column =
          static_cast<int64_t>(fields.size()) > cols ? fields[cols].column : line.size() + 1;
      throw InvalidArgumentError(str_cat("read_csv: ", path, ":", line_no, ":", column,
                                         ": row has ", fields.size(), " fields, expected ", cols,
                                         " as on line ", first_row_line, ": ", quote(line)));
    }
    for (const Field& f : fields) {
      float v = 0;
      if (!parse_float(f.text, v)) {
        throw InvalidArgumentError(str_cat("read_csv: ", path, ":", line_no, ":", f.column, ": ",
                                           f.text.empty() ? "empty field" : "non-numeric field ",
                                           f.text.empty() ? "" : quote(f.text)));
      }
      values.push_back(v);
    }
    ++rows;
  }
  return Tensor::from_vector<float>(values, Shape{rows, std::max<int64_t>(cols, 0)});
}

namespace {

template <class T>
void convert_labels(const float* src, int64_t stride, int64_t rows, T* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const float v = src[r * stride];
    if constexpr (std::is_integral_v<T>) {
      DTRAIN_CHECK(
          std::isfinite(v) && v == std::trunc(v) &&
              static_cast<double>(v) >= static_cast<double>(std::numeric_limits<T>::min()) &&
              static_cast<double>(v) < static_cast<double>(std::numeric_limits<T>::max()) + 1.0,
          "split_label_column: label ", v, " in row ", r, " is not a valid ",
          dtype_name(dtype_of<T>));
    }
    dst[r] = static_cast<T>(v);
  }
}

}  // namespace

LabeledTable split_label_column(const Tensor& table, int64_t column, DType label_dtype) {
  DTRAIN_CHECK(table.defined() && table.rank() == 2 && table.dtype() == DType::kFloat32,
               "split_label_column: expected a float32 [rows, cols] table, got ",
               table.defined() ? table.to_string(0) : "an undefined tensor");
  const int64_t rows = table.dim(0), cols = table.dim(1);
  const int64_t c = column < 0 ? column + cols : column;
  DTRAIN_CHECK(0 <= c && c < cols, "split_label_column: column ", column,
               " out of range for a table of ", cols, " columns");
  LabeledTable out;
  out.x = Tensor(DType::kFloat32, Shape{rows, cols - 1});
  out.y = Tensor(label_dtype, Shape{rows});
  const float* src = table.data<float>();
  float* x = out.x.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * cols;
    std::memcpy(x + r * (cols - 1), row, c * sizeof(float));
    std::memcpy(x + r * (cols - 1) + c, row + c + 1, (cols - c - 1) * sizeof(float));
  }
  switch (label_dtype) {
    case DType::kFloat32:
      convert_labels(src + c, cols, rows, out.y.data<float>());
      break;
    case DType::kFloat64:
      convert_labels(src + c, cols, rows, out.y.data<double>());
      break;
    case DType::kInt32:
      convert_labels(src + c, cols, rows, out.y.data<int32_t>());
      break;
    case DType::kInt64:
      convert_labels(src + c, cols, rows, out.y.data<int64_t>());
      break;
    case DType::kUInt8:
      convert_labels(src + c, cols, rows, out.y.data<uint8_t>());
      break;
    default:
      throw InvalidArgumentError(
          str_cat("split_label_column: unsupported label dtype ", dtype_name(label_dtype)));
  }
  return out;
}

}  // namespace dtrain::data
