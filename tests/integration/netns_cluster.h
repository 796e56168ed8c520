// A test cluster of Linux network namespaces: N hosts, each in its own namespace with one
// address, joined by veth pairs to a bridge in a hub namespace. Addresses come from
// 198.18.0.0/15 (RFC 2544's range for network tests) and exist only inside the namespaces this
// class creates; its destructor kills every process left in them and deletes them. A host's link
// can be taken down and up at the bridge (the host stays alive but unreachable).
// Needs root and `ip netns` (netns_available() says why not). Not thread-safe.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace dtrain::testing {

inline std::string ip_binary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

// Runs `cmd` through the shell with its output discarded; returns system()'s status.
inline int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// Empty when network namespaces can be made here; otherwise the reason they cannot.
inline std::string netns_unavailable_reason() {
  if (geteuid() != 0) return "needs root to create network namespaces";
  if (ip_binary().empty() || sh(ip_binary() + " netns list") != 0) {
    return "`ip netns` is not available";
  }
  return "";
}

class NetnsCluster {
 public:
  explicit NetnsCluster(int hosts = 3) : ip_(ip_binary()) {
    static int instances = 0;  // unique names within one test process too
    const std::string tag = std::to_string(getpid() % 100000) +
                            std::string(1, static_cast<char>('a' + instances++ % 26));
    hub_ = "dtr" + tag + "hub";
    subnet_ = "198.18." + std::to_string(getpid() % 200 + 1);
    ok_ = sh(ip_ + " netns add " + hub_) == 0;
    if (ok_) created_.push_back(hub_);
    ok_ = ok_ && sh(ip_ + " -n " + hub_ + " link add br0 type bridge") == 0 &&
          sh(ip_ + " -n " + hub_ + " link set br0 up") == 0;
    for (int i = 0; ok_ && i < hosts; ++i) {
      const std::string ns = "dtr" + tag + "h" + std::to_string(i);
      const std::string host_if = "dv" + tag + "h" + std::to_string(i);
      const std::string hub_if = "dv" + tag + "b" + std::to_string(i);
      ok_ = sh(ip_ + " netns add " + ns) == 0;
      if (!ok_) break;
      created_.push_back(ns);
      hosts_.push_back(ns);
      hub_links_.push_back(hub_if);
      addresses_.push_back(subnet_ + "." + std::to_string(i + 1));
      ok_ = sh(ip_ + " -n " + ns + " link add " + host_if + " type veth peer name " + hub_if +
               " netns " + hub_) == 0 &&
            sh(ip_ + " -n " + hub_ + " link set " + hub_if + " master br0 up") == 0 &&
            sh(ip_ + " -n " + ns + " addr add " + addresses_.back() + "/24 dev " + host_if) == 0 &&
            sh(ip_ + " -n " + ns + " link set " + host_if + " up") == 0 &&
            sh(ip_ + " -n " + ns + " link set lo up") == 0;
    }
  }
  ~NetnsCluster() {
    kill_processes();
    for (const auto& ns : created_) sh(ip_ + " netns del " + ns);
  }
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  bool ok() const { return ok_; }
  const std::string& ip() const { return ip_; }
  const std::vector<std::string>& hosts() const { return hosts_; }
  const std::vector<std::string>& addresses() const { return addresses_; }

  // argv prefix that runs a program on host i: ip netns exec NS ...
  std::vector<std::string> exec_on(int i) const { return {ip_, "netns", "exec", hosts_[i]}; }

  // Takes host i's link down (up) at the bridge: its processes keep running, its packets go
  // nowhere. Returns true on success.
  bool link_down(int i) {
    return sh(ip_ + " -n " + hub_ + " link set " + hub_links_[i] + " down") == 0;
  }
  bool link_up(int i) {
    return sh(ip_ + " -n " + hub_ + " link set " + hub_links_[i] + " up") == 0;
  }

  // SIGKILLs every process in the cluster's namespaces (those `ip netns pids` lists).
  void kill_processes() {
    for (const auto& ns : created_) kill_in(ns);
  }
  // SIGKILLs every process of host i (a whole machine lost).
  void kill_host_processes(int i) { kill_in(hosts_[i]); }

 private:
  void kill_in(const std::string& ns) {
    FILE* f = ::popen((ip_ + " netns pids " + ns + " 2>/dev/null").c_str(), "r");
    if (f == nullptr) return;
    int pid = 0;
    while (std::fscanf(f, "%d", &pid) == 1) {
      if (pid > 1 && pid != getpid()) ::kill(pid, SIGKILL);
    }
    ::pclose(f);
  }

  std::string ip_, hub_, subnet_;
  bool ok_ = false;
  std::vector<std::string> created_, hosts_, hub_links_, addresses_;
};

}  // namespace dtrain::testing
