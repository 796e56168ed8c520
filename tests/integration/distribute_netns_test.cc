// Several hosts: a 3-worker job on a test cluster of 3 Linux network namespaces, each with its
// own address, joined by veth pairs to a bridge in a fourth namespace. The workers are
// configured only through TF_CONFIG with those addresses: the chief serves the rendezvous and
// Gloo's TCP pairs run between the namespaces. Addresses come from 198.18.0.0/15 (RFC 2544's
// range for network tests) and exist only inside namespaces this test creates and deletes.
// Needs root and `ip netns`; skips with a message otherwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "distribute_process.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;
const std::string kWorker = DTRAIN_DISTRIBUTE_WORKER;

std::string ip_binary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// Creates the namespaces and links in its constructor (ok() says whether it worked) and deletes
// them in its destructor, whatever happened in between.
class TestCluster {
 public:
  static constexpr int kHosts = 3;

  TestCluster() : ip_(ip_binary()) {
    const std::string tag = std::to_string(getpid() % 100000);
    hub_ = "dtr" + tag + "hub";
    subnet_ = "198.18." + std::to_string(getpid() % 200 + 1);
    ok_ = sh(ip_ + " netns add " + hub_) == 0;
    if (ok_) created_.push_back(hub_);
    ok_ = ok_ && sh(ip_ + " -n " + hub_ + " link add br0 type bridge") == 0 &&
          sh(ip_ + " -n " + hub_ + " link set br0 up") == 0;
    for (int i = 0; ok_ && i < kHosts; ++i) {
      const std::string ns = "dtr" + tag + "h" + std::to_string(i);
      const std::string host_if = "dv" + tag + "h" + std::to_string(i);
      const std::string hub_if = "dv" + tag + "b" + std::to_string(i);
      ok_ = sh(ip_ + " netns add " + ns) == 0;
      if (!ok_) break;
      created_.push_back(ns);
      hosts_.push_back(ns);
      addresses_.push_back(subnet_ + "." + std::to_string(i + 1));
      ok_ = sh(ip_ + " -n " + ns + " link add " + host_if + " type veth peer name " + hub_if +
               " netns " + hub_) == 0 &&
            sh(ip_ + " -n " + hub_ + " link set " + hub_if + " master br0 up") == 0 &&
            sh(ip_ + " -n " + ns + " addr add " + addresses_.back() + "/24 dev " + host_if) == 0 &&
            sh(ip_ + " -n " + ns + " link set " + host_if + " up") == 0 &&
            sh(ip_ + " -n " + ns + " link set lo up") == 0;
    }
  }
  ~TestCluster() {
    for (const auto& ns : created_) sh(ip_ + " netns del " + ns);
  }

  bool ok() const { return ok_; }
  const std::string& ip() const { return ip_; }
  const std::vector<std::string>& hosts() const { return hosts_; }
  const std::vector<std::string>& addresses() const { return addresses_; }

 private:
  std::string ip_, hub_, subnet_;
  bool ok_ = false;
  std::vector<std::string> created_, hosts_, addresses_;
};

TEST(NetnsClusterTest, ThreeHostsConfiguredByTfConfigTrainInSync) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  if (ip_binary().empty() || sh(ip_binary() + " netns list") != 0) {
    GTEST_SKIP() << "`ip netns` is not available";
  }
  const std::string dir = make_temp_dir();
  {
    TestCluster cluster;
    if (!cluster.ok()) GTEST_SKIP() << "could not create namespaces, veth pairs or a bridge";
    // Every host has a route to every other before the job starts.
    for (int i = 1; i < TestCluster::kHosts; ++i) {
      ASSERT_EQ(
          sh(cluster.ip() + " -n " + cluster.hosts()[0] + " route get " + cluster.addresses()[i]),
          0)
          << "no route from host 0 to " << cluster.addresses()[i];
    }
    std::string workers;
    for (int i = 0; i < TestCluster::kHosts; ++i) {
      workers += (i ? ", " : "") + std::string("\"") + cluster.addresses()[i] + ":" +
                 std::to_string(23456 + i) + "\"";
    }
    std::vector<Process> procs;
    for (int i = 0; i < TestCluster::kHosts; ++i) {
      const std::string tf_config =
          "{\"cluster\": {\"worker\": [" + workers +
          "]}, \"task\": {\"type\": \"worker\", \"index\": " + std::to_string(i) + "}}";
      procs.push_back(
          spawn({cluster.ip(), "netns", "exec", cluster.hosts()[i], kWorker, "--out",
                 dir + "/vars" + std::to_string(i), "--verify-sync", "4", "--timeout-ms", "15000"},
                {{"TF_CONFIG", tf_config}}, dir + "/log" + std::to_string(i)));
    }
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (int i = 0; i < TestCluster::kHosts; ++i) {
      EXPECT_EQ(wait_for(procs[i], deadline), 0) << "host " << i << ":\n"
                                                 << read_file(procs[i].log);
    }
    const std::string log0 = read_file(dir + "/log0");
    EXPECT_NE(log0.find("rank 0 of 3 (TF_CONFIG) done"), std::string::npos) << log0;
    const std::string v0 = read_file(dir + "/vars0");
    EXPECT_EQ(v0.size(), (8 * 4 + 4) * sizeof(float));
    for (int i = 1; i < TestCluster::kHosts; ++i) {
      EXPECT_EQ(read_file(dir + "/vars" + std::to_string(i)), v0)
          << "host " << i << " is not bitwise identical to host 0";
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dtrain::testing
