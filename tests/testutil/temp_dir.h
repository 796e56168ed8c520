// Test helpers for files: a temporary directory removed at the end of its scope, and whole-file
// reads and writes.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::testutil {

// Creates a fresh directory under the system temp directory, named after `stem`, and returns
// its path; the caller removes it. Throws (a test error, not a crash) when it cannot.
inline std::string make_temp_dir(const std::string& stem = "dtrain_test") {
  std::string tmpl = (std::filesystem::temp_directory_path() / (stem + "_XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
  }
  return tmpl;
}

class TempDir {
 public:
  // A fresh directory under the system temp directory, named after `stem`, removed with this.
  explicit TempDir(const std::string& stem = "dtrain_test") : path_(make_temp_dir(stem)) {}
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Names of the entries in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) {
      out.push_back(e.path().filename());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

}  // namespace dtrain::testutil
