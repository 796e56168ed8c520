// Helpers for the multi-worker tests: spawn a process with a clean environment and its stderr
// in a file, wait for it with a hard deadline (SIGKILL after), pick free loopback ports.
// Not thread-safe; call from the test thread.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testutil/free_port.h"
#include "testutil/temp_dir.h"

namespace dtrain::testing {

struct Process {
  pid_t pid = -1;
  std::string log;  // stdout and stderr
};

// Starts argv with exactly `env` plus PATH and HOME; output goes to `log`.
inline Process spawn(const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env, const std::string& log) {
  std::vector<std::string> env_strings;
  for (const char* keep : {"PATH", "HOME"}) {
    if (const char* v = std::getenv(keep)) env_strings.push_back(std::string(keep) + "=" + v);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  return {pid, log};
}

// Waits until the process exits or `deadline` passes (then kills it and returns -1). Returns the
// exit status, or 128 + signal.
inline int wait_for(Process& p, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(p.pid, &status, WNOHANG);
    if (r == p.pid) {
      p.pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &status, 0);
      p.pid = -1;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// TF_CONFIG of worker `index` of a cluster of workers on 127.0.0.1 at `ports`.
inline std::string tf_config(const std::vector<int>& ports, int index) {
  std::string workers;
  for (size_t i = 0; i < ports.size(); ++i) {
    workers += (i ? ", " : "") + std::string("\"127.0.0.1:") + std::to_string(ports[i]) + "\"";
  }
  return R"({"cluster": {"worker": [)" + workers + R"(]}, "task": {"type": "worker", "index": )" +
         std::to_string(index) + "}}";
}

using testutil::free_port;      // a port on 127.0.0.1 reserved for this test process
using testutil::make_temp_dir;  // a fresh directory under /tmp; the caller removes it

}  // namespace dtrain::testing
