// Flag checks shared by the sub-commands (private to src/cli): a bad value is a usage error
// (exit 2) naming the flag and the value, found while parsing, before anything is loaded or run.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace dtrain::cli {

CLI::Validator int_at_least(int64_t lo);
// Any uint64 (a seed), but not "-1", which strtoull would wrap to 2^64 - 1.
CLI::Validator unsigned_integer();
// At most `hi`; the message says `why`.
CLI::Validator int_at_most(int64_t hi, const std::string& why);
// A finite number > 0.
CLI::Validator finite_positive();

}  // namespace dtrain::cli
