// Sharded checkpoints with real worker processes on loopback: N workers (1..4) each write their
// partition as a data shard and the chief the merged index; every checkpoint restores bitwise
// into a single process and into each worker of any world size M (1..4: full state and the
// worker's partition rows); an independent Python parser of the TensorBundle format
// (tools/tensor_bundle_parse.py) accepts the merged checkpoints and agrees with the C++ reader;
// a worker SIGKILLed at any point of a sharded save never leaves a restorable but incomplete
// checkpoint and never damages the previous one.
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "distribute_process.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/checkpoint/verify.h"
#include "dtrain/core/crc32c.h"
#include "dtrain/core/partition.h"
#include "sharded_checkpoint_model.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
const std::string kWorker = DTRAIN_SHARDED_CHECKPOINT_WORKER;
const std::string kParser = std::string(DTRAIN_SOURCE_DIR) + "/tools/tensor_bundle_parse.py";

struct Job {
  std::vector<int> codes;
  std::string logs;
};

// Runs `n` workers writing into `dir` (n = 0: one --plain process) and waits up to 120 s.
Job run_job(int n, const std::string& dir, const std::vector<std::string>& flags) {
  std::vector<int> ports;
  for (int i = 0; i < n; ++i) ports.push_back(free_port());
  std::vector<Process> procs;
  for (int i = 0; i < std::max(n, 1); ++i) {
    std::vector<std::string> argv{kWorker, "--dir", dir};
    if (n == 0) argv.push_back("--plain");
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::map<std::string, std::string> env;
    if (n > 0) env["TF_CONFIG"] = tf_config(ports, i);
    procs.push_back(spawn(argv, env, dir + ".log" + std::to_string(i)));
  }
  Job job;
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  for (size_t i = 0; i < procs.size(); ++i) {
    job.codes.push_back(wait_for(procs[i], deadline));
    job.logs += "--- worker " + std::to_string(i) + ":\n" + read_file(procs[i].log);
  }
  return job;
}

// Every variable, slot, counter and RNG of `a` equals `b`'s, bit for bit.
void expect_same_state(ShardedState& a, ShardedState& b, const std::string& what) {
  const auto wa = a.model.weights(), wb = b.model.weights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i)
    EXPECT_TRUE(wa[i]->tensor().equals(wb[i]->tensor())) << what << ": " << wa[i]->name();
  const auto oa = a.opt.variables(), ob = b.opt.variables();
  ASSERT_EQ(oa.size(), ob.size()) << what;
  for (size_t i = 0; i < oa.size(); ++i)
    EXPECT_TRUE(oa[i]->tensor().equals(ob[i]->tensor())) << what << ": " << oa[i]->name();
  EXPECT_EQ(a.epoch, b.epoch) << what;
  EXPECT_EQ(a.rng.state().seed, b.rng.state().seed) << what;
  EXPECT_EQ(a.rng.state().counter, b.rng.state().counter) << what;
}

class ShardedCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testutil::make_temp_dir("dtrain_sharded_ckpt");
    // The reference (unsharded, one process, two saves), then sharded saves by 1..4 workers.
    const Job ref = run_job(0, root_ + "/ref", {"--saves", "2"});
    ASSERT_EQ(ref.codes, std::vector<int>{0}) << ref.logs;
    for (int n = 1; n <= 4; ++n) {
      const Job job = run_job(n, dir(n), {});
      ASSERT_EQ(job.codes, std::vector<int>(static_cast<size_t>(n), 0)) << job.logs;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  static std::string dir(int n) { return root_ + "/n" + std::to_string(n); }
  static std::string ref(int save) { return root_ + "/ref/ckpt-" + std::to_string(save); }
  static std::string root_;
};
std::string ShardedCheckpointTest::root_;

TEST_F(ShardedCheckpointTest, EachWorkerWritesItsShardAndTheChiefTheMergedIndex) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("N = " + std::to_string(n));
    const std::string prefix = dir(n) + "/ckpt-1";
    EXPECT_EQ(checkpoint::latest_checkpoint(dir(n)), prefix);
    checkpoint::BundleReader r(prefix);
    EXPECT_EQ(r.num_shards(), n);
    for (int k = 0; k < n; ++k) EXPECT_TRUE(fs::exists(checkpoint::data_filename(prefix, k, n)));
    // Every trainable variable and its Adam slots are stored as partition_rows cuts them: the
    // rows of shard k in data shard k (a slice each, or a plain entry when one shard has all
    // of its rows).
    ShardedState layout;
    std::vector<Shape> shapes;
    for (Variable* v : layout.model.trainable_variables()) shapes.push_back(v->shape());
    const RowPartition p = partition_rows(shapes, n);
    const std::vector<std::string> names = {
        "layer_with_weights-0/kernel", "layer_with_weights-0/bias",   "layer_with_weights-1/gamma",
        "layer_with_weights-1/beta",   "layer_with_weights-2/kernel", "layer_with_weights-2/bias"};
    ASSERT_EQ(shapes.size(), names.size());
    int sliced = 0;
    for (size_t v = 0; v < names.size(); ++v) {
      std::vector<std::pair<int, RowSlice>> parts;  // (shard, rows)
      for (int k = 0; k < n; ++k) {
        for (const RowSlice& s : p.shards[static_cast<size_t>(k)]) {
          if (s.variable == static_cast<int>(v) && s.row_end > s.row_begin)
            parts.emplace_back(k, s);
        }
      }
      for (const std::string& key :
           {"model/" + names[v] + "/.ATTRIBUTES/VARIABLE_VALUE",
            "model/" + names[v] + "/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE",
            "model/" + names[v] + "/.OPTIMIZER_SLOT/optimizer/v/.ATTRIBUTES/VARIABLE_VALUE"}) {
        const checkpoint::BundleEntry& e = r.entry(key);
        EXPECT_EQ(e.shape, shapes[v]) << key;
        if (parts.size() == 1) {
          EXPECT_FALSE(e.partitioned) << key;
          EXPECT_EQ(e.shard_id, parts[0].first) << key;
          continue;
        }
        ++sliced;
        ASSERT_EQ(e.slices.size(), parts.size()) << key;
        for (size_t i = 0; i < parts.size(); ++i) {
          const auto& [shard, rows] = parts[i];
          const checkpoint::TensorSlice want =
              checkpoint::TensorSlice::rows(shapes[v].rank(), rows.row_begin, rows.row_end);
          EXPECT_EQ(r.slice_entry(key, want).shard_id, shard) << key;
        }
      }
    }
    EXPECT_EQ(sliced > 0, n > 1);
    // Non-partitioned state lives in the chief's shard 0.
    EXPECT_EQ(r.entry("epoch/.ATTRIBUTES/VARIABLE_VALUE").shard_id, 0);
    EXPECT_EQ(r.entry("model/layer_with_weights-1/moving_mean/.ATTRIBUTES/VARIABLE_VALUE").shard_id,
              0);
    EXPECT_TRUE(checkpoint::verify_bundle(prefix).errors.empty());
  }
}

TEST_F(ShardedCheckpointTest, RestoresBitwiseOnAnyWorldSize) {
  ShardedState reference;
  checkpoint::Checkpoint(reference.trackables()).restore(ref(1)).assert_consumed();
  checkpoint::BundleReader ref_reader(ref(1));
  for (int n = 1; n <= 4; ++n) {
    checkpoint::BundleReader r(dir(n) + "/ckpt-1");
    for (int m = 1; m <= 4; ++m) {
      // Worker k of an M-worker job: a replicated strategy restores the whole state; sharded
      // optimizer state reads the rows partition_rows gives it.
      for (int k = 0; k < m; ++k) {
        const std::string what =
            "N=" + std::to_string(n) + " M=" + std::to_string(m) + " worker " + std::to_string(k);
        ShardedState s;
        checkpoint::Checkpoint(s.trackables()).restore(dir(n) + "/ckpt-1").assert_consumed();
        expect_same_state(s, reference, what);
        std::vector<Variable*> vars = s.model.trainable_variables();
        std::vector<Shape> shapes;
        for (Variable* v : vars) shapes.push_back(v->shape());
        const RowPartition p = partition_rows(shapes, m);
        for (const RowSlice& slice : p.shards[static_cast<size_t>(k)]) {
          // Every value of the variable's shape (the variable and its m and v slots).
          for (const std::string& key : r.keys()) {
            const checkpoint::BundleEntry& e = r.entry(key);
            if (e.shape.rank() == 0 || e.shape != shapes[static_cast<size_t>(slice.variable)])
              continue;
            const Tensor got = r.read_rows(key, slice.row_begin, slice.row_end);
            const Tensor want = ref_reader.read_rows(key, slice.row_begin, slice.row_end);
            EXPECT_TRUE(got.equals(want)) << what << ": " << key;
          }
        }
      }
    }
  }
}

TEST_F(ShardedCheckpointTest, IndependentPythonParserAcceptsMergedCheckpoints) {
  for (const std::string& prefix : {dir(3) + "/ckpt-1", dir(4) + "/ckpt-1", ref(1)}) {
    SCOPED_TRACE(prefix);
    const std::string out = root_ + "/parsed.json";
    const std::string cmd =
        "/usr/bin/python3 " + kParser + " --json " + prefix + " > " + out + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(out);
    const nlohmann::json j = nlohmann::json::parse(read_file(out));
    checkpoint::BundleReader r(prefix);
    EXPECT_EQ(j["num_shards"].get<int>(), r.num_shards());
    ASSERT_EQ(j["tensors"].size(), r.keys().size());
    for (const std::string& key : r.keys()) {
      ASSERT_TRUE(j["tensors"].contains(key)) << key;
      const nlohmann::json& t = j["tensors"][key];
      const checkpoint::BundleEntry& e = r.entry(key);
      EXPECT_EQ(t["dtype"].get<int>(), static_cast<int>(e.dtype)) << key;
      std::vector<int64_t> shape(e.shape.begin(), e.shape.end());
      EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), shape) << key;
      EXPECT_EQ(t["slices"].get<size_t>(), e.slices.size()) << key;
      if (e.dtype == DType::kString) continue;
      const Tensor v = r.read(key);
      EXPECT_EQ(t["crc32c"].get<uint32_t>(), crc32c::value(v.raw_data(), v.nbytes())) << key;
    }
  }
}

TEST_F(ShardedCheckpointTest, SigkillDuringShardedSaveNeverLeavesAnIncompleteCheckpoint) {
  ShardedState want1, want2;
  checkpoint::Checkpoint(want1.trackables()).restore(ref(1)).assert_consumed();
  checkpoint::Checkpoint(want2.trackables()).restore(ref(2)).assert_consumed();
  struct Case {
    int rank;
    std::string at;
    bool commits;  // the chief had committed save 2 before the kill
  };
  const std::vector<Case> cases = {
      {1, "rows", false},    {0, "rows", false},  {2, "entries", false},
      {0, "entries", false}, {1, "start", false}, {1, "done", true},
  };
  for (const Case& c : cases) {
    const std::string what = "worker " + std::to_string(c.rank) + " killed at " + c.at;
    SCOPED_TRACE(what);
    const std::string d = root_ + "/kill_" + std::to_string(c.rank) + "_" + c.at;
    const Job job = run_job(3, d,
                            {"--saves", "2", "--kill-rank", std::to_string(c.rank), "--kill-at",
                             c.at, "--timeout-ms", "15000"});
    EXPECT_EQ(job.codes[static_cast<size_t>(c.rank)], 128 + SIGKILL) << job.logs;
    for (size_t i = 0; i < job.codes.size(); ++i) {
      EXPECT_NE(job.codes[i], -1) << "worker " << i << " hung\n" << job.logs;
    }
    // The newest committed checkpoint is complete and restores the state it saved; save 2
    // counts only when the chief committed it, and then it is complete too.
    const std::optional<std::string> latest = checkpoint::latest_checkpoint(d);
    ASSERT_TRUE(latest.has_value()) << job.logs;
    EXPECT_EQ(*latest, d + (c.commits ? "/ckpt-2" : "/ckpt-1")) << job.logs;
    EXPECT_EQ(fs::exists(d + "/ckpt-2.index"), c.commits) << job.logs;
    for (int save = 1; save <= 2; ++save) {
      const std::string prefix = d + "/ckpt-" + std::to_string(save);
      if (!fs::exists(prefix + ".index")) continue;
      EXPECT_TRUE(checkpoint::verify_bundle(prefix).errors.empty()) << prefix;
      ShardedState s;
      checkpoint::Checkpoint(s.trackables()).restore(prefix).assert_consumed();
      expect_same_state(s, save == 1 ? want1 : want2, prefix);
    }
    ShardedState s;
    checkpoint::Checkpoint ckpt(s.trackables());
    ASSERT_TRUE(ckpt.restore_latest(d).has_value());
    expect_same_state(s, c.commits ? want2 : want1, "restore_latest");
  }
}

}  // namespace
}  // namespace dtrain::testing
