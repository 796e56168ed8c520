// Keras-compatible progress output.
#include "progress_bar.h"

#include <unistd.h>

#include <cmath>

namespace dtrain::train::detail {

std::string format_value(double v) {
  char buf[64];
  if (v != 0 && std::fabs(v) < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.4e", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.4f", v);
  }
  return buf;
}

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

ProgressBar::ProgressBar(int verbose, int64_t target, std::FILE* out)
    : verbose_(verbose),
      target_(target),
      out_(out),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_ - std::chrono::seconds(1)) {}

std::string ProgressBar::format_logs(const nn::Logs& logs) const {
  // Keras order: loss first, then the metrics; the validation values after the training ones.
  std::string s;
  for (const char* prefix : {"", "val_"}) {
    const std::string loss_key = std::string(prefix) + "loss";
    if (auto it = logs.find(loss_key); it != logs.end()) {
      s += " - " + loss_key + ": " + format_value(it->second);
    }
    for (const auto& [k, v] : logs) {
      const bool is_val = k.rfind("val_", 0) == 0;
      if (is_val != (prefix[0] != '\0') || k == loss_key) continue;
      s += " - " + k + ": " + format_value(v);
    }
  }
  return s;
}

namespace {
std::string per_step(double seconds_per_step) {
  char buf[32];
  if (seconds_per_step >= 1) {
    std::snprintf(buf, sizeof buf, "%.0fs/step", seconds_per_step);
  } else if (seconds_per_step >= 1e-3) {
    std::snprintf(buf, sizeof buf, "%.0fms/step", seconds_per_step * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0fus/step", seconds_per_step * 1e6);
  }
  return buf;
}
}  // namespace

void ProgressBar::update(int64_t current, const nn::Logs& logs, bool finalize) {
  if (verbose_ <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double step_time = current > 0 ? elapsed / static_cast<double>(current) : 0;
  if (verbose_ == 2) {
    if (!finalize) return;
    // Keras: "938/938 - 1s - loss: 0.5213 - accuracy: 0.8190 - 1s/epoch - 1ms/step"
    std::fprintf(out_, "%lld/%lld - %.0fs%s - %.0fms/epoch - %s\n", static_cast<long long>(current),
                 static_cast<long long>(current), elapsed, format_logs(logs).c_str(), elapsed * 1e3,
                 per_step(step_time).c_str());
    std::fflush(out_);
    return;
  }
  if (!finalize && now - last_draw_ < std::chrono::milliseconds(50)) return;
  last_draw_ = now;
  std::string line;
  char head[64];
  if (target_ > 0) {
    const int digits = static_cast<int>(std::to_string(target_).size());
    std::snprintf(head, sizeof head, "%*lld/%lld [", digits, static_cast<long long>(current),
                  static_cast<long long>(target_));
    line = head;
    const int width = 30;
    const int done = static_cast<int>(width * std::min<double>(1.0, double(current) / target_));
    if (done > 0) {
      line += std::string(static_cast<size_t>(done - 1), '=');
      line += current < target_ ? '>' : '=';
    }
    line += std::string(static_cast<size_t>(width - done), '.');
    line += "]";
  } else {
    std::snprintf(head, sizeof head, "%7lld/Unknown", static_cast<long long>(current));
    line = head;
  }
  if (finalize || (target_ > 0 && current >= target_)) {
    char t[64];
    std::snprintf(t, sizeof t, " - %.0fs %s", elapsed, per_step(step_time).c_str());
    line += t;
  } else if (target_ > 0) {
    char t[64];
    std::snprintf(t, sizeof t, " - ETA: %.0fs", step_time * static_cast<double>(target_ - current));
    line += t;
  }
  line += format_logs(logs);
  const size_t width = line.size();
  if (width < last_width_) line += std::string(last_width_ - width, ' ');
  last_width_ = width;
  std::fprintf(out_, "\r%s%s", line.c_str(), finalize ? "\n" : "");
  std::fflush(out_);
}

}  // namespace dtrain::train::detail
