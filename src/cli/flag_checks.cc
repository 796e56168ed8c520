#include "flag_checks.h"

#include <cmath>

namespace dtrain::cli {

CLI::Validator int_at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& s) -> std::string {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return "'" + s + "' is not an integer";
        if (v < lo) return "is " + s + ", must be at least " + std::to_string(lo);
        return {};
      },
      ">=" + std::to_string(lo));
}

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        if (s.find('-') != std::string::npos) return "is " + s + ", must be at least 0";
        if (!CLI::detail::lexical_cast(s, v)) return "'" + s + "' is not an integer";
        return {};
      },
      "UINT");
}

CLI::Validator int_at_most(int64_t hi, const std::string& why) {
  return CLI::Validator(
      [hi, why](std::string& s) -> std::string {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return "'" + s + "' is not an integer";
        if (v > hi) return "is " + s + ", must be at most " + std::to_string(hi) + " (" + why + ")";
        return {};
      },
      "<=" + std::to_string(hi));
}

CLI::Validator finite_positive() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return "'" + s + "' is not a number";
        if (!std::isfinite(v) || v <= 0) return "is " + s + ", must be a finite number > 0";
        return {};
      },
      "FLOAT>0");
}

}  // namespace dtrain::cli
