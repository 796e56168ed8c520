// Where the checkpoint layer's warnings go: set_warning_handler() and warn(). Thread-safe.
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>

#include "checkpoint_state.h"
#include "dtrain/checkpoint/checkpoint.h"

namespace dtrain::checkpoint {

namespace {
std::mutex& warning_mutex() {
  static std::mutex mu;
  return mu;
}
std::function<void(const std::string&)>& warning_handler() {
  static std::function<void(const std::string&)> handler;
  return handler;
}
}  // namespace

void set_warning_handler(std::function<void(const std::string&)> handler) {
  std::lock_guard<std::mutex> lock(warning_mutex());
  warning_handler() = std::move(handler);
}

void warn(const std::string& message) {
  std::lock_guard<std::mutex> lock(warning_mutex());
  if (warning_handler()) {
    warning_handler()(message);
  } else {
    std::fprintf(stderr, "WARNING: %s\n", message.c_str());
  }
}

}  // namespace dtrain::checkpoint
