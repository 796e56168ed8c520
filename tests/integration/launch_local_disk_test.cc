// Durable backups without a shared filesystem (src/train/peer_backups.h): three `dtrain launch`
// nodes on 127.0.0.1 (`--nnodes 3`, one `dtrain fit --strategy multi-worker` worker each, the
// default MLP on small IDX files), in-memory snapshots off so that every recovery reads a backup
// on disk. Each host has a private root directory — its data, its --checkpoint-dir, its logs —
// whose path no other host is told (checked: no other host's output or events name it). The
// first worker of every host writes its own copy of each backup there; a host whose directory is
// gone restores the job's newest backup from a peer's disk over TCP. Every result is compared
// bit for bit with an uninterrupted 3-node run.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "chaos.h"
#include "keras_compare.h"
#include "netns_cluster.h"
#include "testutil/free_port.h"
#include "testutil/idx_files.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
namespace ck = dtrain::checkpoint;
using Clock = std::chrono::steady_clock;
const std::string kDtrain = DTRAIN_BINARY;
constexpr int kHosts = 3;
constexpr int kExamples = 384;  // batch 16: 24 steps an epoch
constexpr int kEpochs = 80;     // 1,920 steps
constexpr int kBackupEvery = 60;

// One host: a private root (a random name no other host's command line contains).
struct Host {
  fs::path root;
  fs::path ckpt() const { return root / "ckpt"; }
  std::string events() const { return (root / "events.jsonl").string(); }
  std::string log() const { return (root / "launch.log").string(); }
  // The host's disk is provisioned with the data set (again, after it was wiped).
  void provision() const {
    fs::create_directories(root / "data");
    testutil::write_small_idx(root / "data", kExamples);
  }
};

// The three hosts of one job and their launchers.
// With `net`, each host is a network namespace of it (its launcher runs there and reaches the
// others at their namespace addresses); without, every host is 127.0.0.1.
struct Cluster {
  explicit Cluster(std::string dir, NetnsCluster* net = nullptr) : dir_(std::move(dir)), net_(net) {
    std::mt19937_64 rng(std::random_device{}());
    for (int i = 0; i < kHosts; ++i) {
      char tag[17];
      std::snprintf(tag, sizeof tag, "%016llx", static_cast<unsigned long long>(rng()));
      hosts_.push_back(Host{.root = fs::path(dir_) / ("host" + std::to_string(i) + "-" + tag)});
      hosts_.back().provision();
    }
    launchers_.assign(kHosts, Process{});
  }
  ~Cluster() {
    for (auto& p : launchers_) {
      if (p.pid > 0) {
        kill(p.pid, SIGKILL);
        wait_for(p, Clock::now() + std::chrono::seconds(10));
      }
    }
  }

  // `dtrain launch` for node i: everything it is told is under host i's root.
  std::vector<std::string> command(int i, int port, bool backups) const {
    const Host& h = hosts_[i];
    const std::string rdzv =
        net_ ? net_->addresses()[0] + ":29500" : "127.0.0.1:" + std::to_string(port);
    std::vector<std::string> a = {kDtrain,
                                  "launch",
                                  "--nnodes",
                                  std::to_string(kHosts),
                                  "--node-rank",
                                  std::to_string(i),
                                  "--nproc-per-node",
                                  std::to_string(nproc_),
                                  "--rdzv",
                                  rdzv,
                                  "--rdzv-timeout",
                                  "90",
                                  "--heartbeat-timeout",
                                  "3",
                                  "--max-restarts",
                                  "10",
                                  "--grace-period",
                                  "1",
                                  "--snapshot-every",
                                  "0",
                                  "--event-log",
                                  h.events(),
                                  "--logdir",
                                  (h.root / "tb").string(),
                                  "--",
                                  kDtrain,
                                  "fit",
                                  "--strategy",
                                  "multi-worker",
                                  "--train-images",
                                  (h.root / "data/x.idx").string(),
                                  "--train-labels",
                                  (h.root / "data/y.idx").string(),
                                  "--epochs",
                                  std::to_string(epochs_),
                                  "--batch-size",
                                  std::to_string(batch_),
                                  "--seed",
                                  "1",
                                  "--verbose",
                                  "0",
                                  "--save",
                                  (h.root / "model.keras").string()};
    if (backups) {
      a.insert(a.end(), {"--checkpoint-dir", h.ckpt().string(), "--checkpoint-every",
                         std::to_string(kBackupEvery), "--resume"});
      if (sharded_) a.push_back("--sharded-checkpoints");
    }
    if (net_) {
      std::vector<std::string> on = net_->exec_on(i);
      a.insert(a.begin(), on.begin(), on.end());
    }
    return a;
  }
  void start(int i, int port, bool backups = true) {
    fs::create_directories(hosts_[i].root);
    launchers_[i] = spawn(command(i, port, backups), {}, hosts_[i].log());
  }
  void start_all(int port, bool backups = true) {
    for (int i = 0; i < kHosts; ++i) start(i, port, backups);
  }

  // The newest backup number host i's state file names, or -1.
  int newest_backup(int i) const {
    std::ifstream state(hosts_[i].ckpt() / "checkpoint");
    std::string line;
    int best = -1;
    static const std::regex re(R"re(model_checkpoint_path:\s*"(?:.*/)?backup-(\d+)")re");
    while (std::getline(state, line)) {
      std::smatch m;
      if (std::regex_search(line, m, re)) best = std::max(best, std::stoi(m[1].str()));
    }
    return best;
  }
  // Waits until every host's own directory holds committed backup `n` or newer.
  bool wait_for_backups(int n) const {
    const auto deadline = Clock::now() + std::chrono::seconds(180);
    while (Clock::now() < deadline) {
      bool all = true;
      for (int i = 0; i < kHosts; ++i) all &= newest_backup(i) >= n;
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // The whole host goes: its launcher (its workers die with it) and, on a namespace cluster,
  // every process of its namespace.
  void kill_host(int i) {
    ASSERT_EQ(kill(launchers_[i].pid, SIGKILL), 0);
    if (net_) net_->kill_host_processes(i);
    EXPECT_EQ(wait_for(launchers_[i], Clock::now() + std::chrono::seconds(20)), 128 + SIGKILL);
  }
  // The host's disk is gone: a new (or wiped) machine with only the data set on it.
  void wipe_host(int i) {
    fs::remove_all(hosts_[i].root);
    hosts_[i].provision();
  }
  // Every launcher's exit status (-1: still running at the deadline).
  std::vector<int> finish_all() {
    std::vector<int> codes;
    const auto deadline = Clock::now() + std::chrono::seconds(240);
    for (auto& p : launchers_) codes.push_back(p.pid > 0 ? wait_for(p, deadline) : -1);
    return codes;
  }
  std::string all_logs() const {
    std::string s;
    for (int i = 0; i < kHosts; ++i) {
      s += "--- node " + std::to_string(i) + ":\n" + log_tail(read_file(hosts_[i].log()));
    }
    return s;
  }
  fs::path model() const { return hosts_[0].root / "model.keras"; }
  // What `dtrain events` prints for host i's launcher TensorBoard file(s).
  std::string tensorboard_text(int i) const {
    std::string out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(hosts_[i].root / "tb/launcher", ec)) {
      const std::string log = (hosts_[i].root / "events-dump.log").string();
      Process p = spawn({kDtrain, "events", e.path().string()}, {}, log);
      wait_for(p, Clock::now() + std::chrono::seconds(30));
      out += read_file(log);
    }
    return out;
  }

  // No host was told another host's private directory: no host's output or event log names
  // another host's root.
  void expect_private_directories() const {
    for (int i = 0; i < kHosts; ++i) {
      const std::string seen = read_file(hosts_[i].log()) + read_file(hosts_[i].events());
      for (int j = 0; j < kHosts; ++j) {
        if (j == i) continue;
        EXPECT_EQ(seen.find(hosts_[j].root.filename().string()), std::string::npos)
            << "node " << i << "'s output names node " << j << "'s directory";
      }
    }
  }

  // The backup_restore events of generation `g` across the hosts' logs, by rank.
  std::map<int, nlohmann::json> backup_restores(int64_t g) const {
    std::map<int, nlohmann::json> out;
    for (int i = 0; i < kHosts; ++i) {
      for (const auto& e : of_kind(events(hosts_[i].events()), "backup_restore")) {
        if (e["generation"].get<int64_t>() == g) out[e["rank"].get<int>()] = e;
      }
    }
    return out;
  }
  // The newest generation with a backup_restore event.
  int64_t last_restore_generation() const {
    int64_t g = 0;
    for (int i = 0; i < kHosts; ++i) {
      for (const auto& e : of_kind(events(hosts_[i].events()), "backup_restore")) {
        g = std::max(g, e["generation"].get<int64_t>());
      }
    }
    return g;
  }

  std::string dir_;
  NetnsCluster* net_ = nullptr;
  int nproc_ = 1;  // workers per host
  int epochs_ = kEpochs;
  int batch_ = 16;        // the global batch
  bool sharded_ = false;  // --sharded-checkpoints
  std::vector<Host> hosts_;
  std::vector<Process> launchers_;
};

class LaunchLocalDisk : public ::testing::Test {
 protected:
  // The uninterrupted reference, once for the suite: the same three hosts, no backups.
  static void SetUpTestSuite() { compute_reference(*ref_dir_, nullptr); }
  static void TearDownTestSuite() { fs::remove_all(*ref_dir_); }
  // The suite's reference run, configured by `configure`; its model goes to <ref_dir>/ref.keras.
  static void compute_reference(std::string& ref_dir, void (*configure)(Cluster&)) {
    ref_dir = make_temp_dir();
    {
      Cluster ref(ref_dir + "/run");
      if (configure) configure(ref);
      ref.start_all(testutil::free_port(), /*backups=*/false);
      const std::vector<int> codes = ref.finish_all();
      if (codes == std::vector<int>(kHosts, 0)) {
        fs::copy_file(ref.model(), ref_dir + "/ref.keras");
      } else {
        std::fprintf(stderr, "reference run failed:\n%s\n", ref.all_logs().c_str());
      }
    }
    fs::remove_all(ref_dir + "/run");
  }
  virtual const std::string& reference_dir() const { return *ref_dir_; }
  virtual void configure(Cluster&) const {}
  void SetUp() override {
    ASSERT_TRUE(fs::exists(reference_dir() + "/ref.keras")) << "no reference result";
    dir_ = make_temp_dir();
    c_ = std::make_unique<Cluster>(dir_);
    configure(*c_);
  }
  void TearDown() override {
    c_.reset();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Kills every launcher (nothing is left in memory), deletes host 1's directory, starts three
  // fresh launchers and finishes as finish_and_compare(). Returns the newest backup the other
  // hosts held.
  int cold_restart_without_host_1() {
    for (int i : {1, 0, 2}) c_->kill_host(i);
    int newest = -1;
    for (int i : {0, 2}) newest = std::max(newest, c_->newest_backup(i));
    c_->wipe_host(1);
    c_->start_all(testutil::free_port());
    finish_and_compare();
    return newest;
  }

  void finish_and_compare() {
    const std::vector<int> codes = c_->finish_all();
    ASSERT_EQ(codes, std::vector<int>(kHosts, 0)) << c_->all_logs();
    const ck::KerasV3Contents want = ck::read_keras_v3(reference_dir() + "/ref.keras");
    const ck::KerasV3Contents got = ck::read_keras_v3(c_->model().string());
    EXPECT_GT(expect_same_keras(got, want, "after the host failure"), 4);
    c_->expect_private_directories();
  }

  std::string dir_;
  std::unique_ptr<Cluster> c_;
  static inline std::string* ref_dir_ = new std::string;
};

// Kill one whole host (its launcher and, with it, its worker), delete its directory and start a
// fresh launcher there: the job finishes with the reference's bits, and the new host's rank got
// the job's newest backup from a peer's disk; the others restored their own copies.
TEST_F(LaunchLocalDisk, AWholeHostLostWithItsDiskRestoresFromAPeersDisk) {
  const int port = testutil::free_port();
  c_->start_all(port);
  // Every host keeps its own copy (not only the chief's host).
  ASSERT_TRUE(c_->wait_for_backups(3)) << c_->all_logs();
  c_->kill_host(2);
  c_->wipe_host(2);
  c_->start(2, port);
  finish_and_compare();
  ASSERT_FALSE(HasFailure());

  const int64_t g = c_->last_restore_generation();
  const auto restores = c_->backup_restores(g);
  ASSERT_EQ(restores.size(), 3u) << "generation " << g << "\n" << c_->all_logs();
  const int64_t step = restores.at(0)["resumed_step"].get<int64_t>();
  EXPECT_GE(step, 3 * kBackupEvery);
  for (const auto& [rank, e] : restores) {
    std::printf("generation %lld: %s\n", static_cast<long long>(g), e.value("message", "").c_str());
    EXPECT_EQ(e["resumed_step"].get<int64_t>(), step) << e.dump();
  }
  EXPECT_EQ(restores.at(0)["source"], "local_disk");
  EXPECT_EQ(restores.at(1)["source"], "local_disk");
  EXPECT_EQ(restores.at(2)["source"], "peer_disk") << restores.at(2).dump();
  EXPECT_EQ(restores.at(2)["node"], 2);
  EXPECT_TRUE(restores.at(2).value("from_node", "") == "0" ||
              restores.at(2).value("from_node", "") == "1")
      << restores.at(2).dump();
  // ... also in TensorBoard (the launcher's text entries).
  const std::string tb = c_->tensorboard_text(2);
  EXPECT_NE(tb.find("backup_restore"), std::string::npos) << tb;
  EXPECT_NE(tb.find("'s disk over TCP"), std::string::npos) << tb;
  // The restarted worker says so too.
  EXPECT_NE(read_file(c_->hosts_[2].log()).find("'s disk over TCP"), std::string::npos)
      << log_tail(read_file(c_->hosts_[2].log()));
}

// A cold restart: every launcher is killed (no worker and no launcher survives, so nothing is
// left in memory) and host 1's disk is gone too; three fresh launchers resume the job from the
// newest backup any host holds, host 1's rank from a peer's disk.
TEST_F(LaunchLocalDisk, AColdRestartWithOneDiskGoneResumesFromThePeersNewestBackup) {
  c_->start_all(testutil::free_port());
  ASSERT_TRUE(c_->wait_for_backups(3)) << c_->all_logs();
  const int newest = cold_restart_without_host_1();
  ASSERT_FALSE(HasFailure());

  const auto restores = c_->backup_restores(1);  // the fresh launchers' first generation
  ASSERT_EQ(restores.size(), 3u) << c_->all_logs();
  const int64_t step = restores.at(0)["resumed_step"].get<int64_t>();
  EXPECT_EQ(step, static_cast<int64_t>(newest) * kBackupEvery) << "not the newest backup";
  for (const auto& [rank, e] : restores) {
    std::printf("%s\n", e.value("message", "").c_str());
    EXPECT_EQ(e["resumed_step"].get<int64_t>(), step) << e.dump();
  }
  EXPECT_EQ(restores.at(1)["source"], "peer_disk") << restores.at(1).dump();
  EXPECT_TRUE(restores.at(1).value("from_node", "") == "0" ||
              restores.at(1).value("from_node", "") == "2")
      << restores.at(1).dump();
  // Hosts 0 and 2 had their own copies, possibly one backup apart: the older one fetched the
  // newer, never the other way round.
  for (int r : {0, 2}) {
    const std::string source = restores.at(r)["source"];
    EXPECT_TRUE(source == "local_disk" || source == "peer_disk") << restores.at(r).dump();
  }
}

// The same on a cluster of network namespaces (netns_cluster.h; needs root and `ip netns`, skips
// otherwise): three hosts at their own addresses, each with its private directory; host 2 is
// killed whole (every process in its namespace), its directory deleted, and a fresh launcher
// started on it. The job finishes with the reference's bits; host 2's rank restored the job's
// newest backup from a peer's disk over the namespaces' network.
TEST_F(LaunchLocalDisk, OnANamespaceClusterAKilledHostRecoversFromAPeersDisk) {
  if (const std::string why = netns_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  NetnsCluster net(kHosts);
  if (!net.ok()) GTEST_SKIP() << "could not create namespaces, veth pairs or a bridge";
  c_ = std::make_unique<Cluster>(dir_, &net);
  c_->start_all(0);
  ASSERT_TRUE(c_->wait_for_backups(3)) << c_->all_logs();
  c_->kill_host(2);
  c_->wipe_host(2);
  c_->start(2, 0);
  finish_and_compare();
  if (!HasFailure()) {
    const auto restores = c_->backup_restores(c_->last_restore_generation());
    ASSERT_EQ(restores.size(), 3u) << c_->all_logs();
    for (const auto& [rank, e] : restores) std::printf("%s\n", e.value("message", "").c_str());
    EXPECT_EQ(restores.at(2)["source"], "peer_disk") << restores.at(2).dump();
    EXPECT_EQ(restores.at(0)["resumed_step"], restores.at(2)["resumed_step"]);
    EXPECT_EQ(restores.at(1)["resumed_step"], restores.at(2)["resumed_step"]);
  }
  c_.reset();  // before the namespaces go
}

// Sharded backups without a shared filesystem: three hosts of two workers each, with
// --sharded-checkpoints. Every host's two workers write a whole sharded backup (two data shards
// and the index) into their own host's directory; after a cold restart with host 1's disk gone,
// the job resumes from the newest backup any host holds — host 1's ranks fetch its files from a
// peer's disk — and ends with the bits of an uninterrupted run.
class LaunchLocalDiskSharded : public LaunchLocalDisk {
 protected:
  static void sharded(Cluster& c) {
    c.nproc_ = 2;
    c.epochs_ = 120;  // 16 steps an epoch: 1,920 steps, as the other tests
    c.batch_ = 24;
    c.sharded_ = true;
  }
  static void SetUpTestSuite() { compute_reference(*sharded_ref_dir_, &sharded); }
  static void TearDownTestSuite() { fs::remove_all(*sharded_ref_dir_); }
  const std::string& reference_dir() const override { return *sharded_ref_dir_; }
  void configure(Cluster& c) const override { sharded(c); }
  static inline std::string* sharded_ref_dir_ = new std::string;
};

TEST_F(LaunchLocalDiskSharded, EveryHostKeepsAWholeShardedBackupAndAColdRestartResumesBitwise) {
  c_->start_all(testutil::free_port());
  ASSERT_TRUE(c_->wait_for_backups(3)) << c_->all_logs();
  for (int i = 0; i < kHosts; ++i) {
    const int n = c_->newest_backup(i);
    for (const char* shard : {".data-00000-of-00002", ".data-00001-of-00002", ".index"}) {
      const fs::path f = c_->hosts_[i].ckpt() / ("backup-" + std::to_string(n) + shard);
      EXPECT_TRUE(fs::exists(f)) << f << " is missing on host " << i;
    }
  }
  const int newest = cold_restart_without_host_1();
  ASSERT_FALSE(HasFailure());

  const auto restores = c_->backup_restores(1);
  ASSERT_EQ(restores.size(), 6u) << c_->all_logs();
  const int64_t step = restores.at(0)["resumed_step"].get<int64_t>();
  EXPECT_EQ(step, static_cast<int64_t>(newest) * kBackupEvery) << "not the newest backup";
  for (const auto& [rank, e] : restores) {
    std::printf("%s\n", e.value("message", "").c_str());
    EXPECT_EQ(e["resumed_step"].get<int64_t>(), step) << e.dump();
    if (e["node"] == 1) {
      EXPECT_EQ(e["source"], "peer_disk") << e.dump();
    }
  }
}

}  // namespace
}  // namespace dtrain::testing
