// `dtrain ckpt` run as a user would: inspect lists TensorFlow's fixtures (keys, dtypes, shapes,
// values), ls marks a corrupted checkpoint of a directory written here, verify exits with the
// DATA_LOSS code naming the tensor, diff reports changed and missing tensors, convert
// round-trips the Keras .h5 fixture through a TF checkpoint, refuses to write .h5 without an
// architecture and refuses to overwrite an existing checkpoint or .h5 without --overwrite.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/checkpoint_manager.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "testutil/flip_byte.h"
#include "testutil/run_dtrain.h"
#include "testutil/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using dtrain::testutil::contains;
using Result = dtrain::testutil::CommandResult;
Result run(const std::string& args, bool with_stderr = true) {
  return dtrain::testutil::run_dtrain(args, with_stderr);
}
using namespace dtrain;

const std::string kFixtures = "../shared/fixtures/";
const std::string kLso = kFixtures + "tf_checkpoints/keras_lso_two_shards/ckpt";
const std::string kMnistH5 = kFixtures + "keras_h5/mnist_mlp_keras212/mnist_model.h5";

class CkptCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = dtrain::testutil::make_temp_dir("dtrain_ckpt_cli_test"); }
  void TearDown() override { fs::remove_all(dir_); }

  // Three checkpoints ckpt-1..3 of two variables through a CheckpointManager; w changes
  // between saves.
  void write_checkpoints() {
    Variable w("w", Tensor::from_vector<float>({1, 2, 3, 4}, Shape{2, 2}));
    Variable b("b", Tensor::from_vector<float>({0.5f}, Shape{1}));
    checkpoint::Checkpoint ckpt({{"w", w}, {"b", b}}, {.sync_to_disk = false});
    checkpoint::CheckpointManager manager(ckpt, dir_ + "/run", {.max_to_keep = 3});
    for (int i = 0; i < 3; ++i) {
      w.tensor().data<float>()[0] = static_cast<float>(10 * i);
      manager.save();
    }
  }

  // Flips one byte of the data file of `prefix` at `offset`.
  static void flip_data_byte(const std::string& prefix, uint64_t offset) {
    testutil::flip_byte(checkpoint::data_filename(prefix, 0, 1), offset, 0x5a);
  }

  static std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }

  std::string dir_;
};

TEST_F(CkptCliTest, InspectListsTheFixturesKeysDtypesAndShapes) {
  const Result r = run("ckpt inspect --json " + kLso, /*with_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> got;
  for (const auto& e : j) got[e["key"]] = {e["dtype"], e["shape"].get<std::vector<int64_t>>()};
  EXPECT_EQ(got.size(), 11u);  // 10 values and the object graph, as tf.train.list_variables
  using P = std::pair<std::string, std::vector<int64_t>>;
  EXPECT_EQ(got["layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"], (P{"float32", {2, 2}}));
  EXPECT_EQ(got["layer_with_weights-0/bias/.ATTRIBUTES/VARIABLE_VALUE"], (P{"float32", {2}}));
  EXPECT_EQ(got["optimizer/base_optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE"], (P{"int64", {}}));
  EXPECT_EQ(got["_CHECKPOINTABLE_OBJECT_GRAPH"], (P{"string", {}}));
}

TEST_F(CkptCliTest, InspectPrintsValuesAndAcceptsADirectory) {
  // The directory resolves to its newest checkpoint through the state file.
  const Result r =
      run("ckpt inspect --values " + kFixtures + "tf_checkpoints/keras_lso_two_shards");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[9.229685, 10.901115, 10.370763, 9.757362]")) << r.output;
  EXPECT_TRUE(contains(r.output, "good_steps/.ATTRIBUTES/VARIABLE_VALUE")) << r.output;
  // A snappy-compressed TF1 index.
  const Result s = run("ckpt inspect --values " + kFixtures +
                       "tf_checkpoints/half_plus_two_snappy/variables.index");
  ASSERT_EQ(s.code, 0) << s.output;
  EXPECT_TRUE(contains(s.output, "c2  float32   []  3")) << s.output;
}

TEST_F(CkptCliTest, InspectOfAMissingCheckpointIsNotFound) {
  const Result r = run("ckpt inspect " + dir_ + "/nothing");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "dtrain: error: NOT_FOUND")) << r.output;
}

TEST_F(CkptCliTest, LsMarksACorruptedCheckpoint) {
  write_checkpoints();
  const std::string corrupted = dir_ + "/run/ckpt-2";
  const auto size = fs::file_size(checkpoint::data_filename(corrupted, 0, 1));
  flip_data_byte(corrupted, size - 10);  // inside b (save_counter is last)
  const Result r = run("ckpt ls --json " + dir_ + "/run", /*with_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j.size(), 3u) << r.output;
  EXPECT_EQ(j[0]["step"], 1);
  EXPECT_EQ(j[0]["status"], "valid");
  EXPECT_EQ(j[1]["step"], 2);
  EXPECT_EQ(j[1]["status"], "corrupt");
  EXPECT_TRUE(contains(j[1]["detail"], "CRC32C")) << j[1];
  EXPECT_EQ(j[2]["status"], "valid");
  EXPECT_TRUE(j[2]["newest"].get<bool>());
  EXPECT_GT(j[2]["bytes"].get<uint64_t>(), 0u);
  // The table form says the same.
  const Result t = run("ckpt ls " + dir_ + "/run");
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_TRUE(contains(t.output, "corrupt: checkpoint data file")) << t.output;
  EXPECT_TRUE(contains(t.output, "newest")) << t.output;
}

TEST_F(CkptCliTest, VerifyExitsWithDataLossNamingTheTensor) {
  write_checkpoints();
  const std::string prefix = dir_ + "/run/ckpt-3";
  const Result ok = run("ckpt verify " + prefix);
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "every CRC32C matches")) << ok.output;
  // The data file ends with w (16 bytes), b (4 bytes), save_counter (8 bytes): flip one of b.
  const auto size = fs::file_size(checkpoint::data_filename(prefix, 0, 1));
  flip_data_byte(prefix, size - 10);
  const Result bad = run("ckpt verify " + prefix);
  EXPECT_EQ(bad.code, 4) << bad.output;
  EXPECT_TRUE(contains(bad.output, "dtrain: error: DATA_LOSS")) << bad.output;
  EXPECT_TRUE(contains(bad.output, "'b/.ATTRIBUTES/VARIABLE_VALUE'")) << bad.output;
  // The fixture is intact.
  EXPECT_EQ(run("ckpt verify " + kLso).code, 0);
}

TEST_F(CkptCliTest, DiffReportsChangedAndMissingTensors) {
  write_checkpoints();
  const Result same = run("ckpt diff --exit-code " + dir_ + "/run/ckpt-3 " + dir_ + "/run/ckpt-3");
  EXPECT_EQ(same.code, 0) << same.output;
  EXPECT_TRUE(contains(same.output, "0 tensors differ")) << same.output;
  const Result r = run("ckpt diff " + dir_ + "/run/ckpt-1 " + dir_ + "/run/ckpt-3");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "~ w/.ATTRIBUTES/VARIABLE_VALUE  float32 [2, 2]: 1 of 4 values "
                       "differ, max |a-b| = 20, first at [0] (0 -> 20)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "~ save_counter/.ATTRIBUTES/VARIABLE_VALUE")) << r.output;
  EXPECT_FALSE(contains(r.output, "~ b/")) << r.output;
  EXPECT_EQ(run("ckpt diff --exit-code " + dir_ + "/run/ckpt-1 " + dir_ + "/run/ckpt-3").code, 1);
  // Keys only on one side.
  const Result k = run("ckpt diff " + kFixtures + "tf_checkpoints/half_plus_three/variables " +
                       kFixtures + "tf_checkpoints/half_plus_two_snappy/variables");
  EXPECT_TRUE(contains(k.output, "+ a2  float32 [] (only in B)")) << k.output;
  EXPECT_TRUE(contains(k.output, "~ b  float32 []: 1 of 1 values differ")) << k.output;
}

TEST_F(CkptCliTest, ConvertRoundTripsAnH5ThroughACheckpoint) {
  const std::string prefix = dir_ + "/mnist";
  const Result a = run("ckpt convert " + kMnistH5 + " " + prefix);
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_TRUE(contains(a.output, "model and optimizer")) << a.output;
  const Result keys = run("ckpt inspect " + prefix);
  EXPECT_TRUE(contains(keys.output, "model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"))
      << keys.output;
  EXPECT_TRUE(
      contains(keys.output, "model/layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/m/"))
      << keys.output;
  EXPECT_TRUE(contains(keys.output, "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE")) << keys.output;

  // Back to .h5 needs an architecture.
  const Result no_model = run("ckpt convert " + prefix + " " + dir_ + "/back.h5");
  EXPECT_EQ(no_model.code, 2) << no_model.output;
  EXPECT_TRUE(contains(no_model.output, "pass --model")) << no_model.output;
  EXPECT_FALSE(fs::exists(dir_ + "/back.h5"));

  const Result b = run("ckpt convert " + prefix + " " + dir_ + "/back.h5 --model " + kMnistH5);
  ASSERT_EQ(b.code, 0) << b.output;
  const Result c = run("ckpt convert " + dir_ + "/back.h5 " + dir_ + "/again");
  ASSERT_EQ(c.code, 0) << c.output;
  const Result d = run("ckpt diff --exit-code " + prefix + " " + dir_ + "/again");
  EXPECT_EQ(d.code, 0) << d.output;
  EXPECT_TRUE(contains(d.output, "0 tensors differ, 14 identical")) << d.output;
  // The .h5 is inspectable too, with Keras's names.
  const Result h = run("ckpt inspect " + dir_ + "/back.h5");
  EXPECT_TRUE(contains(h.output, "/model_weights/dense/dense/kernel:0")) << h.output;
  EXPECT_TRUE(contains(h.output, "/optimizer_weights/Adam/m/dense/kernel:0")) << h.output;
}

TEST_F(CkptCliTest, ConvertRejectsTwoCheckpointPrefixes) {
  const Result r = run("ckpt convert " + kLso + " " + dir_ + "/x");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "between an .h5 file and a TF checkpoint prefix")) << r.output;
}

// Issue 11: `ckpt convert x.h5 CK/backup-3` replaced a committed checkpoint of a manager's
// directory without a word. Now it is FAILED_PRECONDITION (exit 8) naming the path and the flag,
// and nothing is written; --overwrite replaces it.
TEST_F(CkptCliTest, ConvertRefusesToOverwriteACommittedCheckpoint) {
  write_checkpoints();
  const std::string target = dir_ + "/run/ckpt-3";
  const std::string index_before = read_bytes(checkpoint::index_filename(target));
  const std::string data_before = read_bytes(checkpoint::data_filename(target, 0, 1));
  const std::string state_before = read_bytes(dir_ + "/run/checkpoint");
  ASSERT_FALSE(index_before.empty());

  const Result r = run("ckpt convert " + kMnistH5 + " " + target);
  EXPECT_EQ(r.code, 8) << r.output;
  EXPECT_TRUE(contains(r.output, "dtrain: error: FAILED_PRECONDITION")) << r.output;
  EXPECT_TRUE(contains(r.output, target)) << r.output;
  EXPECT_TRUE(contains(r.output, "pass --overwrite")) << r.output;
  EXPECT_TRUE(read_bytes(checkpoint::index_filename(target)) == index_before) << "index changed";
  EXPECT_TRUE(read_bytes(checkpoint::data_filename(target, 0, 1)) == data_before)
      << "data file changed";
  EXPECT_TRUE(read_bytes(dir_ + "/run/checkpoint") == state_before) << "state file changed";

  // Named by the state file but with its index gone (a damaged committed checkpoint): refused
  // too, so nothing written there can pass for the committed one.
  fs::remove(checkpoint::index_filename(dir_ + "/run/ckpt-2"));
  const Result named = run("ckpt convert " + kMnistH5 + " " + dir_ + "/run/ckpt-2");
  EXPECT_EQ(named.code, 8) << named.output;
  EXPECT_TRUE(contains(named.output, dir_ + "/run/ckpt-2")) << named.output;
  EXPECT_FALSE(fs::exists(checkpoint::index_filename(dir_ + "/run/ckpt-2")));

  // Asked for, it replaces it.
  const Result o = run("ckpt convert --overwrite " + kMnistH5 + " " + target);
  ASSERT_EQ(o.code, 0) << o.output;
  const Result keys = run("ckpt inspect " + target);
  EXPECT_TRUE(contains(keys.output, "model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"))
      << keys.output;
  // A new prefix needs no flag.
  EXPECT_EQ(run("ckpt convert " + kMnistH5 + " " + dir_ + "/run/other").code, 0);
}

TEST_F(CkptCliTest, ConvertRefusesToOverwriteAnExistingH5) {
  const std::string prefix = dir_ + "/mnist";
  ASSERT_EQ(run("ckpt convert " + kMnistH5 + " " + prefix).code, 0);
  const std::string h5 = dir_ + "/existing.h5";
  fs::copy_file(kMnistH5, h5);
  const std::string before = read_bytes(h5);
  const Result r = run("ckpt convert " + prefix + " " + h5 + " --model " + kMnistH5);
  EXPECT_EQ(r.code, 8) << r.output;
  EXPECT_TRUE(contains(r.output, h5 + " already exists; pass --overwrite")) << r.output;
  EXPECT_TRUE(read_bytes(h5) == before) << h5 << " changed";
  const Result o =
      run("ckpt convert " + prefix + " " + h5 + " --model " + kMnistH5 + " --overwrite");
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_TRUE(contains(o.output, "wrote " + h5)) << o.output;
  EXPECT_EQ(run("ckpt verify " + h5).code, 0);
}

}  // namespace

// A sharded checkpoint (two data shards, "w" partitioned by rows across them, as a sharded save
// writes it): inspect shows the full shape, the slices with their shard, bytes and CRC32C; verify
// reads every slice and names the tensor when one is corrupt; diff compares it with an unsharded
// checkpoint of the same values; ls finds it valid.
TEST_F(CkptCliTest, UnderstandsShardedCheckpointsWithSlices) {
  const std::string prefix = dir_ + "/sharded/ckpt-1", plain = dir_ + "/plain/ckpt-1";
  const Tensor w = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, Shape{4, 2});
  checkpoint::BundleEntries merged;
  for (int k = 0; k < 2; ++k) {
    checkpoint::BundleWriter writer(prefix, {.shard = k, .num_shards = 2});
    if (k == 0) writer.add("b", Tensor::from_vector<float>({0.5f}, Shape{1}));
    const Tensor rows = Tensor::from_vector<float>(
        std::vector<float>(w.data<float>() + 4 * k, w.data<float>() + 4 * k + 4), Shape{2, 2});
    writer.add_slice("w", Shape{4, 2}, checkpoint::TensorSlice::rows(2, 2 * k, 2 * k + 2), rows);
    checkpoint::merge_bundle_entries(merged, writer.finish_shard(), "test");
  }
  checkpoint::write_bundle_index(prefix, 2, merged, false);
  {
    checkpoint::BundleWriter writer(plain);
    writer.add("b", Tensor::from_vector<float>({0.5f}, Shape{1}));
    writer.add("w", w);
    writer.finish();
  }
  const Result inspect = run("ckpt inspect --values " + prefix);
  EXPECT_EQ(inspect.code, 0) << inspect.output;
  EXPECT_TRUE(contains(inspect.output, "float32   [4, 2]  (2 slices)")) << inspect.output;
  EXPECT_TRUE(contains(inspect.output, "slice 2,2:-  shard 1  16 bytes  crc32c 0x"))
      << inspect.output;
  EXPECT_TRUE(contains(inspect.output, "8")) << inspect.output;  // values assembled
  const Result json = run("ckpt inspect --json " + prefix, false);
  ASSERT_EQ(json.code, 0) << json.output;
  const nlohmann::json j = nlohmann::json::parse(json.output);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[1]["key"], "w");
  EXPECT_EQ(j[1]["bytes"], 32);
  ASSERT_EQ(j[1]["slices"].size(), 2u);
  EXPECT_EQ(j[1]["slices"][0]["shard"], 0);
  EXPECT_EQ(j[1]["slices"][1]["slice"], "2,2:-");
  EXPECT_EQ(j[1]["slices"][1]["crc32c"].get<std::string>().size(), 10u);
  const Result diff = run("ckpt diff --exit-code " + prefix + " " + plain);
  EXPECT_EQ(diff.code, 0) << diff.output;
  EXPECT_TRUE(contains(diff.output, "0 tensors differ")) << diff.output;
  const Result ok = run("ckpt verify " + prefix);
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "2 tensors, 36 bytes")) << ok.output;
  // Corrupt the second slice, in data shard 1.
  testutil::flip_byte(checkpoint::data_filename(prefix, 1, 2), 3, 0x5a);
  const Result bad = run("ckpt verify " + prefix);
  EXPECT_EQ(bad.code, 4) << bad.output;
  EXPECT_TRUE(contains(bad.output, "'w[2,2:-]'")) << bad.output;
  EXPECT_TRUE(contains(bad.output, "data-00001-of-00002")) << bad.output;
}
