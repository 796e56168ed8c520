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
#include "netns_cluster.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;
const std::string kWorker = DTRAIN_DISTRIBUTE_WORKER;
constexpr int kHosts = 3;

TEST(NetnsClusterTest, ThreeHostsConfiguredByTfConfigTrainInSync) {
  if (const std::string why = netns_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string dir = make_temp_dir();
  {
    NetnsCluster cluster(kHosts);
    if (!cluster.ok()) GTEST_SKIP() << "could not create namespaces, veth pairs or a bridge";
    // Every host has a route to every other before the job starts.
    for (int i = 1; i < kHosts; ++i) {
      ASSERT_EQ(
          sh(cluster.ip() + " -n " + cluster.hosts()[0] + " route get " + cluster.addresses()[i]),
          0)
          << "no route from host 0 to " << cluster.addresses()[i];
    }
    std::string workers;
    for (int i = 0; i < kHosts; ++i) {
      workers += (i ? ", " : "") + std::string("\"") + cluster.addresses()[i] + ":" +
                 std::to_string(23456 + i) + "\"";
    }
    std::vector<Process> procs;
    for (int i = 0; i < kHosts; ++i) {
      const std::string tf_config =
          "{\"cluster\": {\"worker\": [" + workers +
          "]}, \"task\": {\"type\": \"worker\", \"index\": " + std::to_string(i) + "}}";
      procs.push_back(
          spawn({cluster.ip(), "netns", "exec", cluster.hosts()[i], kWorker, "--out",
                 dir + "/vars" + std::to_string(i), "--verify-sync", "4", "--timeout-ms", "15000"},
                {{"TF_CONFIG", tf_config}}, dir + "/log" + std::to_string(i)));
    }
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (int i = 0; i < kHosts; ++i) {
      EXPECT_EQ(wait_for(procs[i], deadline), 0) << "host " << i << ":\n"
                                                 << read_file(procs[i].log);
    }
    const std::string log0 = read_file(dir + "/log0");
    EXPECT_NE(log0.find("rank 0 of 3 (TF_CONFIG) done"), std::string::npos) << log0;
    const std::string v0 = read_file(dir + "/vars0");
    EXPECT_EQ(v0.size(), (8 * 4 + 4) * sizeof(float));
    for (int i = 1; i < kHosts; ++i) {
      EXPECT_EQ(read_file(dir + "/vars" + std::to_string(i)), v0)
          << "host " << i << " is not bitwise identical to host 0";
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dtrain::testing
