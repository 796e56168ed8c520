// Whole files, UTF-8 checks, string tensors and TextLineDataset (a source node reading lines with
// one buffered stream per pass).
#include "dtrain/data/text.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <utility>

#include "dataset_node.h"
#include "dtrain/core/error.h"

namespace dtrain::data {
namespace {

bool is_regular_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Opens `path` for reading, or throws the error that names why not.
std::ifstream open_or_throw(const std::string& path, const char* op) {
  if (!is_regular_file(path)) {
    throw NotFoundError(str_cat(op, ": ", path, ": no such file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw PermissionDeniedError(
        str_cat(op, ": ", path, ": cannot open for reading: ", std::strerror(errno)));
  }
  return in;
}

}  // namespace

std::string read_file(const std::string& path) {
  std::ifstream in = open_or_throw(path, "read_file");
  std::string data;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size > 0) data.resize(static_cast<size_t>(size));
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (in.gcount() != static_cast<std::streamsize>(data.size())) {
    throw DataLossError(
        str_cat("read_file: ", path, ": read ", in.gcount(), " of ", data.size(), " bytes"));
  }
  return data;
}

void check_utf8_text(std::string_view text, std::string_view where) {
  int64_t line = 1;
  size_t line_start = 0;
  auto fail = [&](size_t offset, const std::string& what) {
    throw DataLossError(str_cat(where, ": ", what, " at byte offset ", offset, " (line ", line,
                                ", column ", offset - line_start + 1, "); expected UTF-8 text"));
  };
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == 0) fail(i, "NUL byte (a binary file?)");
    if (c < 0x80) {
      if (c == '\n') {
        ++line;
        line_start = i + 1;
      }
      ++i;
      continue;
    }
    int len = 0;
    uint32_t min = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, min = 0x80, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, min = 0x800, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, min = 0x10000, cp = c & 0x07;
    } else {
      fail(i, str_cat("invalid UTF-8 lead byte 0x", std::string(1, "0123456789abcdef"[c >> 4]),
                      std::string(1, "0123456789abcdef"[c & 15])));
    }
    if (i + static_cast<size_t>(len) > text.size()) fail(i, "truncated UTF-8 sequence");
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(text[i + static_cast<size_t>(k)]);
      if ((b & 0xC0) != 0x80) fail(i, "invalid UTF-8 continuation byte");
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      fail(i, "overlong or out-of-range UTF-8 sequence");
    }
    i += static_cast<size_t>(len);
  }
}

Tensor string_tensor(std::string_view s) {
  Tensor t(DType::kUInt8, Shape{static_cast<int64_t>(s.size())});
  if (!s.empty()) std::memcpy(t.raw_data(), s.data(), s.size());
  return t;
}

std::string tensor_string(const Tensor& t) {
  DTRAIN_CHECK(t.defined() && t.dtype() == DType::kUInt8 && t.rank() == 1,
               "tensor_string: expected a uint8 rank-1 tensor of UTF-8 bytes, got ",
               t.defined() ? str_cat(dtype_name(t.dtype()), " ", t.shape().to_string())
                           : std::string("an undefined tensor"));
  return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
}

// ---- TextLineDataset -------------------------------------------------------------------------

namespace detail {
namespace {

class TextLineNode final : public DatasetNode {
 public:
  explicit TextLineNode(std::vector<std::string> paths) : paths_(std::move(paths)) {}
  std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const override;
  int64_t cardinality() const override { return kUnknownCardinality; }

  const std::vector<std::string> paths_;
};

class TextLineIterator final : public IteratorNode {
 public:
  explicit TextLineIterator(std::shared_ptr<const TextLineNode> node) : node_(std::move(node)) {}

  bool next(Element& out) override {
    if (!read_line()) return false;
    out.resize(1);
    out[0] = string_tensor(line_);
    return true;
  }
  int64_t skip(int64_t n) override {
    int64_t k = 0;
    while (k < n && read_line()) ++k;
    return k;
  }

 private:
  // Reads the next line of the current or a later file into line_; false after the last file.
  bool read_line() {
    for (;;) {
      if (!in_.is_open()) {
        if (file_ >= node_->paths_.size()) return false;
        in_ = open_or_throw(node_->paths_[file_], "TextLineDataset");
      }
      if (std::getline(in_, line_)) {
        if (!line_.empty() && line_.back() == '\r') line_.pop_back();
        return true;
      }
      if (in_.bad()) {
        throw DataLossError(
            str_cat("TextLineDataset: ", node_->paths_[file_], ": read error after some lines"));
      }
      in_.close();
      ++file_;
    }
  }

  std::shared_ptr<const TextLineNode> node_;
  size_t file_ = 0;
  std::ifstream in_;
  std::string line_;
};

std::unique_ptr<IteratorNode> TextLineNode::make_iterator(uint64_t) const {
  return std::make_unique<TextLineIterator>(self<TextLineNode>());
}

}  // namespace
}  // namespace detail

Dataset text_line_dataset(std::vector<std::string> paths) {
  DTRAIN_CHECK(!paths.empty(), "TextLineDataset: no file paths given");
  for (const std::string& path : paths) {
    if (!is_regular_file(path))
      throw NotFoundError(str_cat("TextLineDataset: ", path, ": no such file"));
  }
  return detail::DatasetAccess::wrap(std::make_shared<detail::TextLineNode>(std::move(paths)));
}

}  // namespace dtrain::data
