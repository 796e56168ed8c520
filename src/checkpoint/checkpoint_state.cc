// CheckpointState text format.
#include "checkpoint_state.h"

#include <charconv>
#include <cstdio>
#include <filesystem>

#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::checkpoint {
namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\%03o", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string format_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // as Python prints floats
  return s;
}

std::string unquote(std::string_view v, const std::string& what) {
  if (v.size() < 2 || (v.front() != '"' && v.front() != '\'') || v.back() != v.front()) {
    throw DataLossError(str_cat(what, ": expected a quoted string, got ", v));
  }
  std::string out;
  for (size_t i = 1; i + 1 < v.size(); ++i) {
    char c = v[i];
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i + 1 > v.size() - 1) throw DataLossError(str_cat(what, ": dangling escape in ", v));
    c = v[i];
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'x': {
        int value = 0, n = 0;
        while (n < 2 && i + 1 < v.size() - 1 &&
               std::isxdigit(static_cast<unsigned char>(v[i + 1]))) {
          value = value * 16 + std::stoi(std::string(1, v[++i]), nullptr, 16);
          ++n;
        }
        out += static_cast<char>(value);
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          int value = c - '0', n = 1;
          while (n < 3 && i + 1 < v.size() - 1 && v[i + 1] >= '0' && v[i + 1] <= '7') {
            value = value * 8 + (v[++i] - '0');
            ++n;
          }
          out += static_cast<char>(value);
        } else {
          out += c;  // \" \\ \'
        }
    }
  }
  return out;
}

double parse_double(std::string_view v, const std::string& what) {
  double d = 0;
  auto r = std::from_chars(v.data(), v.data() + v.size(), d);
  if (r.ec != std::errc() || r.ptr != v.data() + v.size()) {
    throw DataLossError(str_cat(what, ": expected a number, got ", v));
  }
  return d;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string relative_to(const std::string& dir, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (p.parent_path().lexically_normal() == fs::path(dir).lexically_normal()) {
    return p.filename().string();
  }
  return path;
}

}  // namespace

std::string format_checkpoint_state(const CheckpointState& s) {
  std::string out;
  out += "model_checkpoint_path: " + quote(s.model_checkpoint_path) + "\n";
  for (const auto& p : s.all_model_checkpoint_paths) {
    out += "all_model_checkpoint_paths: " + quote(p) + "\n";
  }
  for (double t : s.all_model_checkpoint_timestamps) {
    out += "all_model_checkpoint_timestamps: " + format_double(t) + "\n";
  }
  if (s.last_preserved_timestamp) {
    out += "last_preserved_timestamp: " + format_double(*s.last_preserved_timestamp) + "\n";
  }
  return out;
}

CheckpointState parse_checkpoint_state(std::string_view text, const std::string& what) {
  CheckpointState s;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      throw DataLossError(str_cat(what, ":", line_no, ": expected 'field: value'"));
    }
    const std::string_view field = trim(line.substr(0, colon));
    const std::string_view value = trim(line.substr(colon + 1));
    const std::string where = str_cat(what, ":", line_no);
    if (field == "model_checkpoint_path") {
      s.model_checkpoint_path = unquote(value, where);
    } else if (field == "all_model_checkpoint_paths") {
      s.all_model_checkpoint_paths.push_back(unquote(value, where));
    } else if (field == "all_model_checkpoint_timestamps") {
      s.all_model_checkpoint_timestamps.push_back(parse_double(value, where));
    } else if (field == "last_preserved_timestamp") {
      s.last_preserved_timestamp = parse_double(value, where);
    }
  }
  return s;
}

std::string join_path(const std::string& dir, const std::string& path) {
  if (path.empty() || path.front() == '/' || dir.empty()) return path;
  return (std::filesystem::path(dir) / path).string();
}

std::string prefix_directory(const std::string& prefix) {
  const std::string d = std::filesystem::path(prefix).parent_path().string();
  return d.empty() ? "." : d;
}

std::optional<CheckpointState> read_checkpoint_state(const std::string& dir) {
  const std::string path = join_path(dir, std::string(kStateFilename));
  std::string text;
  try {
    text = read_file(path);
  } catch (const NotFoundError&) {
    return std::nullopt;
  }
  CheckpointState s = parse_checkpoint_state(text, path);
  s.model_checkpoint_path = join_path(dir, s.model_checkpoint_path);
  for (auto& p : s.all_model_checkpoint_paths) p = join_path(dir, p);
  return s;
}

void write_checkpoint_state(const std::string& dir, const CheckpointState& state, bool sync) {
  CheckpointState rel = state;
  rel.model_checkpoint_path = relative_to(dir, rel.model_checkpoint_path);
  for (auto& p : rel.all_model_checkpoint_paths) p = relative_to(dir, p);
  write_file_atomically(join_path(dir, std::string(kStateFilename)), format_checkpoint_state(rel),
                        AtomicFileOptions{.sync = sync});
}

}  // namespace dtrain::checkpoint
