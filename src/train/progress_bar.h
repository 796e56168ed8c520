// Keras's progress output for fit()/evaluate(): a redrawn bar on a terminal (verbose 1), one line
// per epoch otherwise (verbose 2). Private to the train layer; not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "dtrain/nn/model.h"

namespace dtrain::train::detail {

class ProgressBar {
 public:
  // `target` = steps in the epoch, or -1 when unknown.
  ProgressBar(int verbose, int64_t target, std::FILE* out = stdout);
  // After step `current` (1-based) with the running logs; redraws at most every 50 ms.
  void update(int64_t current, const nn::Logs& logs, bool finalize = false);

 private:
  std::string format_logs(const nn::Logs& logs) const;

  int verbose_;
  int64_t target_;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  size_t last_width_ = 0;
};

// Formats a number as Keras does in logs: "%.4f", or "%.4e" for tiny values.
std::string format_value(double v);
// True when stdout is a terminal (decides verbose = -1).
bool stdout_is_terminal();

}  // namespace dtrain::train::detail
