// Cluster resolution from TF_CONFIG (TF's validation rules), Slurm, Open MPI and dtrain launch.
#include "dtrain/distribute/cluster_resolver.h"

#include <gtest/gtest.h>

#include <map>

#include "dtrain/core/error.h"

namespace dtrain::distribute {
namespace {

EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& n) -> std::optional<std::string> {
    auto it = vars.find(n);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "(no InvalidArgumentError)";
}

TEST(TfConfigTest, ChiefAndWorkersAsKubeflowWritesThem) {
  const std::string cluster =
      R"("cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p:2222"],
                     "evaluator": ["e:2222"]})";
  auto chief = parse_tf_config("{" + cluster + R"(, "task": {"type": "chief", "index": 0}})");
  EXPECT_EQ(chief.rank, 0);
  EXPECT_EQ(chief.num_workers, 3);
  EXPECT_TRUE(chief.is_chief());
  EXPECT_EQ(chief.host, "c");
  EXPECT_EQ(chief.worker_addresses, (std::vector<std::string>{"c:2222", "w0:2222", "w1:2222"}));
  auto w1 = parse_tf_config("{" + cluster + R"(, "task": {"type": "worker", "index": 1},
                                                  "environment": "cloud"})");
  EXPECT_EQ(w1.rank, 2);  // id_in_cluster: chief first
  EXPECT_FALSE(w1.is_chief());
  EXPECT_EQ(w1.host, "w1");
  auto eval = parse_tf_config("{" + cluster + R"(, "task": {"type": "evaluator", "index": 0}})");
  EXPECT_TRUE(eval.is_chief());
  EXPECT_FALSE(eval.is_worker());
  auto ps = parse_tf_config("{" + cluster + R"(, "task": {"type": "ps", "index": "0"}})");
  EXPECT_EQ(ps.task_type, "ps");
}

TEST(TfConfigTest, WorkerZeroIsChiefWithoutChiefJob) {
  auto w0 = parse_tf_config(
      R"({"cluster": {"worker": ["[::1]:1", "h:2"]}, "task": {"type": "worker", "index": 0}})");
  EXPECT_TRUE(w0.is_chief());
  EXPECT_EQ(w0.rank, 0);
  EXPECT_EQ(w0.num_workers, 2);
  EXPECT_EQ(w0.host, "::1");
}

TEST(TfConfigTest, MalformedValuesAreNamed) {
  struct Case {
    const char* json;
    const char* expect;
  };
  const Case cases[] = {
      {"{\"cluster\": ", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {R"({"task": {"type": "worker", "index": 0}})", "no \"cluster\" field"},
      {R"({"cluster": {"worker": ["a:1"]}})", "no \"task\" field"},
      {R"({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}})",
       "must be a list of addresses"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "master", "index": 0}})",
       "unrecognized task type \"master\""},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}})",
       "task type \"chief\" is not in the cluster"},
      {R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}})",
       "task index 2 is out of range: the cluster has 2 \"worker\" tasks"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})", "negative"},
      {R"({"cluster": {"chief": ["a:1", "b:1"], "worker": ["c:1"]},
           "task": {"type": "worker", "index": 0}})",
       "at most one chief, the cluster lists 2"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "x"}})",
       "not an integer"},
  };
  for (const auto& c : cases) {
    const std::string msg = error_of([&] { parse_tf_config(c.json); });
    EXPECT_NE(msg.find("TF_CONFIG"), std::string::npos) << c.json << " -> " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.json << " -> " << msg;
  }
}

TEST(SlurmTest, ExpandsHostLists) {
  EXPECT_EQ(expand_slurm_hostlist("n[1-3,5]x,m"),
            (std::vector<std::string>{"n1x", "n2x", "n3x", "n5x", "m"}));
  EXPECT_EQ(expand_slurm_hostlist("gpu[08-10]"),
            (std::vector<std::string>{"gpu08", "gpu09", "gpu10"}));
  EXPECT_EQ(expand_slurm_hostlist("r[1-2]c[1-2]"),
            (std::vector<std::string>{"r1c1", "r1c2", "r2c1", "r2c2"}));
  EXPECT_THROW(expand_slurm_hostlist("n[1-"), InvalidArgumentError);
  EXPECT_THROW(expand_slurm_hostlist("n[3-1]"), InvalidArgumentError);
  EXPECT_THROW(expand_slurm_hostlist("a,,b"), InvalidArgumentError);
}

TEST(SlurmTest, TasksFillNodesInOrder) {
  auto env = fake_env({{"SLURM_PROCID", "3"},
                       {"SLURM_NTASKS", "5"},
                       {"SLURM_LOCALID", "0"},
                       {"SLURM_JOB_NODELIST", "node[01-03]"},
                       {"SLURM_TASKS_PER_NODE", "2(x2),1"}});
  auto c = resolve_slurm(env);
  EXPECT_EQ(c.source, "SLURM");
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.num_workers, 5);
  EXPECT_EQ(c.host, "node02");
  EXPECT_EQ(c.worker_addresses,
            (std::vector<std::string>{"node01:8888", "node01:8889", "node02:8888", "node02:8889",
                                      "node03:8888"}));
  EXPECT_EQ(resolve_cluster(env).source, "SLURM");
}

TEST(SlurmTest, MalformedValuesNameTheVariable) {
  auto msg = error_of([] {
    resolve_slurm(fake_env({{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "4"}}));
  });
  EXPECT_NE(msg.find("SLURM_PROCID='7': out of range [0, 3]"), std::string::npos) << msg;
  msg = error_of([] { resolve_slurm(fake_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "two"}})); });
  EXPECT_NE(msg.find("SLURM_NTASKS='two': not an integer"), std::string::npos) << msg;
  msg = error_of([] {
    resolve_slurm(fake_env({{"SLURM_PROCID", "0"},
                            {"SLURM_NTASKS", "4"},
                            {"SLURM_NODELIST", "a,b"},
                            {"SLURM_TASKS_PER_NODE", "1(x3)"}}));
  });
  EXPECT_NE(msg.find("SLURM_TASKS_PER_NODE='1(x3)': describes 3 nodes"), std::string::npos) << msg;
}

TEST(MpiTest, OpenMpiVariables) {
  auto c = resolve_cluster(fake_env({{"OMPI_COMM_WORLD_RANK", "1"},
                                     {"OMPI_COMM_WORLD_SIZE", "4"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                     {"SLURM_PROCID", "0"},
                                     {"SLURM_NTASKS", "1"}}));
  EXPECT_EQ(c.source, "OMPI");  // mpirun inside Slurm: MPI wins
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.num_workers, 4);
  EXPECT_EQ(c.local_rank, 1);
  auto msg = error_of([] { resolve_mpi(fake_env({{"OMPI_COMM_WORLD_RANK", "1"}})); });
  EXPECT_NE(msg.find("OMPI_COMM_WORLD_SIZE is not set"), std::string::npos) << msg;
}

TEST(LauncherTest, LauncherEnvironmentWinsAndCarriesRendezvous) {
  auto c = resolve_cluster(fake_env({{"DTRAIN_RANK", "2"},
                                     {"DTRAIN_WORLD_SIZE", "3"},
                                     {"DTRAIN_LOCAL_RANK", "0"},
                                     {"DTRAIN_LOCAL_WORLD_SIZE", "1"},
                                     {"DTRAIN_NODE_RANK", "2"},
                                     {"DTRAIN_NNODES", "3"},
                                     {"DTRAIN_RDZV", "file:///tmp/x"},
                                     {"DTRAIN_RDZV_GENERATION", "4"},
                                     {"DTRAIN_HOST", "10.1.1.1"},
                                     {"TF_CONFIG", "not json"}}));
  EXPECT_EQ(c.source, "DTRAIN");
  EXPECT_EQ(c.rank, 2);
  EXPECT_EQ(c.num_workers, 3);
  EXPECT_EQ(c.rendezvous, "file:///tmp/x");
  EXPECT_EQ(c.generation, 4);
  EXPECT_EQ(c.host, "10.1.1.1");
}

TEST(ResolveClusterTest, DefaultsToOneLocalWorker) {
  auto c = resolve_cluster(fake_env({{"TF_CONFIG", ""}}));
  EXPECT_EQ(c.source, "local");
  EXPECT_EQ(c.num_workers, 1);
  EXPECT_EQ(c.rank, 0);
  EXPECT_TRUE(c.is_chief());
}

}  // namespace
}  // namespace dtrain::distribute
