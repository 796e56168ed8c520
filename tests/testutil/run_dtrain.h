// Runs the dtrain binary of this build as a user would, for the CLI tests.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace dtrain::testutil {

struct CommandResult {
  int code;            // exit status, or -1 when killed by a signal
  std::string output;  // stdout, or stdout and stderr together
};

// Runs `command` through the shell and waits for it.
inline CommandResult run_shell(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  CommandResult r{-1, ""};
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Runs `build/dtrain ARGS` through the shell and waits for it.
inline CommandResult run_dtrain(const std::string& args, bool with_stderr = true) {
  return run_shell(std::string(DTRAIN_BINARY_DIR) + "/dtrain " + args +
                   (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace dtrain::testutil
