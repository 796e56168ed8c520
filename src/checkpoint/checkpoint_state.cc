// CheckpointState text format.
#include "checkpoint_state.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <set>

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

bool inside_directory(const std::string& dir, const std::string& prefix) {
  namespace fs = std::filesystem;
  const fs::path p = fs::path(prefix).lexically_normal();
  const std::string name = p.filename().string();
  if (name.empty() || name == "." || name == "..") return false;
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const fs::path d = dir.empty() ? fs::path(".") : fs::path(dir);
  std::error_code ec;
  if (fs::equivalent(parent, d, ec)) return true;
  if (!ec) return false;  // both exist and differ
  // One of them does not exist: compare what they would resolve to.
  std::error_code ec1, ec2;
  const fs::path a = fs::weakly_canonical(parent, ec1), b = fs::weakly_canonical(d, ec2);
  if (ec1 || ec2) return parent.lexically_normal() == d.lexically_normal();
  return a == b;
}

namespace {

// Warns once per process about each distinct content `text` of a state file with ignored
// entries (it is read on every save and restore).
void warn_ignored_once(const std::string& path, const std::string& dir, const std::string& text,
                       const std::vector<std::string>& ignored) {
  std::string message = str_cat("checkpoint state file ", path, " names ", ignored.size(),
                                ignored.size() == 1 ? " entry" : " entries", " outside ",
                                dir.empty() ? "." : dir, ":");
  for (size_t i = 0; i < ignored.size(); ++i) message += str_cat(i ? ", '" : " '", ignored[i], "'");
  message += "; ignoring them (they are neither restored nor deleted)";
  static std::mutex mu;
  static std::set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.insert(str_cat(path, "\n", text)).second) return;
  }
  warn(message);
}

}  // namespace

std::optional<CheckpointState> read_checkpoint_state(const std::string& dir) {
  const std::string path = join_path(dir, std::string(kStateFilename));
  std::string text;
  try {
    text = read_file(path);
  } catch (const NotFoundError&) {
    return std::nullopt;
  }
  const CheckpointState raw = parse_checkpoint_state(text, path);
  CheckpointState s;
  s.last_preserved_timestamp = raw.last_preserved_timestamp;
  auto keep = [&](const std::string& entry) {
    if (inside_directory(dir, join_path(dir, entry))) return true;
    if (std::find(s.ignored_paths.begin(), s.ignored_paths.end(), entry) == s.ignored_paths.end())
      s.ignored_paths.push_back(entry);
    return false;
  };
  const auto& times = raw.all_model_checkpoint_timestamps;
  const bool timed = times.size() == raw.all_model_checkpoint_paths.size();
  bool dropped = false;
  for (size_t i = 0; i < raw.all_model_checkpoint_paths.size(); ++i) {
    const std::string& entry = raw.all_model_checkpoint_paths[i];
    if (!keep(entry)) {
      dropped = true;
      continue;
    }
    s.all_model_checkpoint_paths.push_back(join_path(dir, entry));
    if (timed) s.all_model_checkpoint_timestamps.push_back(times[i]);
  }
  // Timestamps that do not pair up with the paths stay as written (callers check the sizes),
  // unless dropping entries would shift them onto other paths.
  if (!timed && !dropped) s.all_model_checkpoint_timestamps = times;
  if (!raw.model_checkpoint_path.empty()) {
    if (keep(raw.model_checkpoint_path)) {
      s.model_checkpoint_path = join_path(dir, raw.model_checkpoint_path);
    } else if (!s.all_model_checkpoint_paths.empty()) {
      s.model_checkpoint_path = s.all_model_checkpoint_paths.back();
    }
  }
  if (!s.ignored_paths.empty()) warn_ignored_once(path, dir, text, s.ignored_paths);
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
