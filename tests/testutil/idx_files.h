// Writes small IDX data sets for tests that run `dtrain fit` on files.
#pragma once

#include <filesystem>
#include <fstream>

namespace dtrain::testutil {

// dir/x.idx and dir/y.idx: n 4x4 uint8 images and labels in {0, 1, 2} (n < 65536).
inline void write_small_idx(const std::filesystem::path& dir, int n) {
  std::ofstream im(dir / "x.idx", std::ios::binary), lb(dir / "y.idx", std::ios::binary);
  const unsigned char ih[] = {0,
                              0,
                              8,
                              3,
                              0,
                              0,
                              static_cast<unsigned char>(n >> 8),
                              static_cast<unsigned char>(n & 255),
                              0,
                              0,
                              0,
                              4,
                              0,
                              0,
                              0,
                              4};
  im.write(reinterpret_cast<const char*>(ih), sizeof ih);
  for (int i = 0; i < n * 16; ++i) im.put(static_cast<char>((i * 37) % 251));
  const unsigned char lh[] = {
      0, 0, 8, 1, 0, 0, static_cast<unsigned char>(n >> 8), static_cast<unsigned char>(n & 255)};
  lb.write(reinterpret_cast<const char*>(lh), sizeof lh);
  for (int i = 0; i < n; ++i) lb.put(static_cast<char>(i % 3));
}

}  // namespace dtrain::testutil
