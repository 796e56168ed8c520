// Shared by the libFuzzer harnesses (tests/fuzz, docs/errors.md "Fuzzing"): the input written to
// a file of this process's own, for the readers that take a path.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace dtrain::fuzz {

// Writes `data` to /dev/shm/dtrain_fuzz_<pid><suffix> and returns the path (the same path on
// every call with that suffix: one input at a time).
inline std::string write_input(const uint8_t* data, size_t size, const std::string& suffix = "") {
  const std::string path = "/dev/shm/dtrain_fuzz_" + std::to_string(::getpid()) + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return path;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

}  // namespace dtrain::fuzz
