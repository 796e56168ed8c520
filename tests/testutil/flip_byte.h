// flip_byte(path, offset): fault injection for crash-safety tests (LevelDB's
// fault_injection_test.cc): XORs one byte of a file in place, so CRC checks must catch it.
// Flipping the same byte twice with the same mask restores the file. Not thread-safe per file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace dtrain::testutil {

// XORs the byte at `offset` of the file at `path` with `mask` (default: its lowest bit).
// Throws std::runtime_error (a test error) when the file cannot be opened or is not longer than
// `offset`, so a test never passes because nothing was corrupted.
inline void flip_byte(const std::string& path, uint64_t offset, uint8_t mask = 0x01) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || offset >= size) {
    throw std::runtime_error(
        "flip_byte: " + path + " has no byte at offset " + std::to_string(offset) +
        (ec ? " (" + ec.message() + ")" : " (size " + std::to_string(size) + ")"));
  }
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  char c = 0;
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(&c, 1);
  c = static_cast<char>(static_cast<uint8_t>(c) ^ mask);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  f.flush();
  if (!f)
    throw std::runtime_error("flip_byte: cannot rewrite byte " + std::to_string(offset) + " of " +
                             path);
}

}  // namespace dtrain::testutil
