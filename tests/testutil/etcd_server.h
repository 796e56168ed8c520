// EtcdServer: a real single-member etcd (Debian's etcd-server, /usr/bin/etcd) for tests, on
// 127.0.0.1 at free ports with a private --data-dir under a temporary directory; stopped
// (SIGTERM, then SIGKILL) and its directory removed at the end of its scope. It dies with the
// test process (PR_SET_PDEATHSIG), so a crashed test leaves no etcd behind. Not thread-safe.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "testutil/free_port.h"
#include "testutil/temp_dir.h"

namespace dtrain::testutil {

inline constexpr const char* kEtcdBinary = "/usr/bin/etcd";

inline bool have_etcd() { return std::filesystem::exists(kEtcdBinary); }

class EtcdServer {
 public:
  // Starts etcd and waits (up to 60 s) until its client port accepts connections. Throws
  // std::runtime_error (a test error) when it does not start; its log is in log().
  EtcdServer() : dir_(make_temp_dir("dtrain_etcd")) {
    client_port_ = free_port();
    peer_port_ = free_port();
    while (peer_port_ == client_port_) peer_port_ = free_port();
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    const std::vector<std::string> args = {kEtcdBinary,
                                           "--name",
                                           "dtrain-test",
                                           "--data-dir",
                                           dir_ + "/data",
                                           "--listen-client-urls",
                                           client,
                                           "--advertise-client-urls",
                                           client,
                                           "--listen-peer-urls",
                                           peer,
                                           "--initial-advertise-peer-urls",
                                           peer,
                                           "--initial-cluster",
                                           "dtrain-test=" + peer,
                                           "--log-level",
                                           "warn",
                                           "--logger",
                                           "zap"};
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("EtcdServer: fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int fd = ::open((dir_ + "/etcd.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(kEtcdBinary, argv.data());
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!accepts(client_port_)) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("etcd exited at start; log:\n" + log());
      }
      if (std::chrono::steady_clock::now() > deadline) {
        stop();
        throw std::runtime_error("etcd did not open port " + std::to_string(client_port_) +
                                 " within 60 s; log:\n" + log());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~EtcdServer() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  int port() const { return client_port_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  std::string url() const { return "etcd://" + endpoint(); }
  pid_t pid() const { return pid_; }
  std::string log() const { return read_bytes(dir_ + "/etcd.log"); }

  // SIGTERM, then SIGKILL after 10 s; waits for it. Idempotent.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
  }

 private:
  static bool accepts(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    return ok;
  }

  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace dtrain::testutil
