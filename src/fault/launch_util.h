// Small helpers shared by the launcher's parts (src/fault/launch_*.cc, worker_group.cc, ...):
// seconds to milliseconds, clocks, number formatting and parsing. Private to src/fault; pure.
#pragma once

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace dtrain::fault {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline milliseconds ms_of(double seconds) {
  return milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}
inline double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
// `v` with `digits` decimals ("2.5").
inline std::string fixed(double v, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
// The whole of `s` as an integer, or nullopt.
inline std::optional<int64_t> parse_int(const std::string& s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace dtrain::fault
