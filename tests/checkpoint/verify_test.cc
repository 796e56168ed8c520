// checkpoint/verify.h on real files: prefixes from user paths, checkpoint_exists (an index, or a
// state-file entry without one), verify_bundle naming every corrupt tensor, list_checkpoints'
// statuses, and verify_keras_h5 on the Keras fixture and a truncated copy.
#include "dtrain/checkpoint/verify.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "dtrain/autograd/variable.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/checkpoint_manager.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "testutil/expect_throws.h"
#include "testutil/flip_byte.h"
#include "testutil/temp_dir.h"

namespace dtrain::checkpoint {
namespace {

namespace fs = std::filesystem;
using testutil::expect_throws_with;

const std::string kMnistH5 = "../shared/fixtures/keras_h5/mnist_mlp_keras212/mnist_model.h5";

class VerifyTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testutil::make_temp_dir("dtrain_verify_test"); }
  void TearDown() override { fs::remove_all(dir_); }

  // ckpt-1..3 of w [2, 2] and b [1] in <dir>/run through a CheckpointManager.
  void write_checkpoints() {
    Variable w("w", Tensor::from_vector<float>({1, 2, 3, 4}, Shape{2, 2}));
    Variable b("b", Tensor::from_vector<float>({0.5f}, Shape{1}));
    Checkpoint ckpt({{"w", w}, {"b", b}}, {.sync_to_disk = false});
    CheckpointManager manager(ckpt, dir_ + "/run", {.max_to_keep = 3});
    for (int i = 0; i < 3; ++i) manager.save();
  }

  // Flips bits of the byte at `offset` of `path`.
  static void flip_byte(const std::string& path, uint64_t offset) {
    testutil::flip_byte(path, offset, 0x5a);
  }

  std::string dir_;
};

TEST_F(VerifyTest, ResolvePrefixAcceptsThePrefixItsFilesAndADirectory) {
  write_checkpoints();
  const std::string p = dir_ + "/run/ckpt-2";
  EXPECT_EQ(resolve_prefix(p), p);
  EXPECT_EQ(resolve_prefix(p + ".index"), p);
  EXPECT_EQ(resolve_prefix(data_filename(p, 0, 1)), p);
  EXPECT_EQ(resolve_prefix(dir_ + "/run"), dir_ + "/run/ckpt-3");
  fs::create_directories(dir_ + "/empty");
  expect_throws_with<NotFoundError>([&] { resolve_prefix(dir_ + "/empty"); },
                                    {"no committed checkpoint in directory", dir_ + "/empty"});
}

TEST_F(VerifyTest, CheckpointExistsForAnIndexOrAStateFileEntry) {
  write_checkpoints();
  EXPECT_TRUE(checkpoint_exists(dir_ + "/run/ckpt-3"));
  EXPECT_TRUE(checkpoint_exists(dir_ + "/run/./ckpt-1"));  // the same file, spelled differently
  EXPECT_FALSE(checkpoint_exists(dir_ + "/run/ckpt-4"));
  EXPECT_FALSE(checkpoint_exists(dir_ + "/elsewhere/ckpt-3"));
  // Committed, its index gone: still a checkpoint a write would replace.
  fs::remove(index_filename(dir_ + "/run/ckpt-2"));
  EXPECT_TRUE(checkpoint_exists(dir_ + "/run/ckpt-2"));
  // An uncommitted write(): only its index says so.
  Variable v("v", Tensor::from_vector<float>({1}, Shape{1}));
  Checkpoint({{"v", v}}, {.sync_to_disk = false}).write(dir_ + "/loose");
  EXPECT_TRUE(checkpoint_exists(dir_ + "/loose"));
}

TEST_F(VerifyTest, VerifyBundleNamesEveryCorruptTensor) {
  write_checkpoints();
  const std::string p = dir_ + "/run/ckpt-1";
  const BundleVerification ok = verify_bundle(p);
  EXPECT_TRUE(ok.errors.empty());
  EXPECT_EQ(ok.tensors, 4u);  // w, b, save_counter and the object graph
  EXPECT_GT(ok.bytes, 16u);
  // Corrupt w (the first value after the object graph) and b.
  BundleReader reader(p);
  const BundleEntry w = reader.entry("w/.ATTRIBUTES/VARIABLE_VALUE");
  const BundleEntry b = reader.entry("b/.ATTRIBUTES/VARIABLE_VALUE");
  flip_byte(data_filename(p, 0, 1), w.offset + 1);
  flip_byte(data_filename(p, 0, 1), b.offset);
  const BundleVerification bad = verify_bundle(p);
  ASSERT_EQ(bad.errors.size(), 2u);
  EXPECT_EQ(bad.tensors, 2u);
  EXPECT_NE(bad.errors[0].find("'b/.ATTRIBUTES/VARIABLE_VALUE'"), std::string::npos)
      << bad.errors[0];
  EXPECT_NE(bad.errors[1].find("'w/.ATTRIBUTES/VARIABLE_VALUE'"), std::string::npos)
      << bad.errors[1];
  EXPECT_NE(bad.errors[1].find("CRC32C"), std::string::npos) << bad.errors[1];
  EXPECT_THROW(verify_bundle(dir_ + "/run/ckpt-9"), NotFoundError);
}

TEST_F(VerifyTest, ListCheckpointsReportsEachStatus) {
  write_checkpoints();
  const std::string two = dir_ + "/run/ckpt-2";
  flip_byte(data_filename(two, 0, 1),
            BundleReader(two).entry("b/.ATTRIBUTES/VARIABLE_VALUE").offset);
  fs::remove(index_filename(dir_ + "/run/ckpt-1"));
  Variable v("v", Tensor::from_vector<float>({1}, Shape{1}));
  Checkpoint({{"v", v}}, {.sync_to_disk = false}).write(dir_ + "/run/extra");

  const CheckpointListing l = list_checkpoints(dir_ + "/run");
  EXPECT_TRUE(l.state_problem.empty());
  ASSERT_EQ(l.checkpoints.size(), 4u);
  const CheckpointInfo& c1 = l.checkpoints[0];
  EXPECT_EQ(c1.prefix, dir_ + "/run/ckpt-1");
  EXPECT_EQ(c1.step, 1);
  EXPECT_EQ(c1.status, "missing");
  EXPECT_TRUE(c1.committed);
  EXPECT_EQ(l.checkpoints[1].status, "corrupt");
  EXPECT_NE(l.checkpoints[1].detail.find("CRC32C"), std::string::npos);
  const CheckpointInfo& c3 = l.checkpoints[2];
  EXPECT_EQ(c3.status, "valid");
  EXPECT_TRUE(c3.newest);
  EXPECT_GT(c3.time, 0);
  EXPECT_GT(c3.bytes, 0u);
  const CheckpointInfo& extra = l.checkpoints[3];  // no step: last
  EXPECT_EQ(extra.prefix, dir_ + "/run/extra");
  EXPECT_FALSE(extra.step.has_value());
  EXPECT_FALSE(extra.committed);
  EXPECT_EQ(extra.status, "valid");

  const CheckpointListing quick = list_checkpoints(dir_ + "/run", {.quick = true});
  EXPECT_EQ(quick.checkpoints[1].status, "unchecked");  // the CRC is not read

  std::ofstream(dir_ + "/run/checkpoint") << "model_checkpoint_path: \"unterminated\n";
  EXPECT_FALSE(list_checkpoints(dir_ + "/run").state_problem.empty());
  EXPECT_THROW(list_checkpoints(dir_ + "/nothing"), NotFoundError);
  EXPECT_THROW(list_checkpoints(dir_ + "/run/checkpoint"), InvalidArgumentError);
}

TEST_F(VerifyTest, VerifyKerasH5ReadsEveryWeight) {
  EXPECT_EQ(verify_keras_h5(kMnistH5), 4u + 1u + 8u);  // 2 Dense layers, iter, Adam m/v
  const std::string cut = dir_ + "/cut.h5";
  fs::copy_file(kMnistH5, cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  EXPECT_THROW(verify_keras_h5(cut), DataLossError);
}

}  // namespace
}  // namespace dtrain::checkpoint
