#include "dtrain/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_state.h"
#include "checkpoint/object_graph.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/data/dataset.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/model.h"
#include "dtrain/optim/adam.h"
#include "testutil/checkpoint_state_check.h"
#include "testutil/flip_byte.h"
#include "testutil/small_model.h"
#include "testutil/temp_dir.h"

namespace dtrain::checkpoint {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(DTRAIN_SOURCE_DIR) + "/../shared/fixtures/tf_checkpoints";

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testutil::make_temp_dir("dtrain_ckpt_test");
    set_warning_handler([this](const std::string& w) { warnings_.push_back(w); });
    nn::clear_session();
  }
  void TearDown() override {
    set_warning_handler(nullptr);
    fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string dir_;
  std::vector<std::string> warnings_;
};

std::vector<Tensor> values_of(const std::vector<Variable*>& vars) {
  std::vector<Tensor> out;
  for (Variable* v : vars) out.push_back(v->tensor().clone());
  return out;
}

void expect_bitwise_equal(const std::vector<Variable*>& vars, const std::vector<Tensor>& values) {
  ASSERT_EQ(vars.size(), values.size());
  for (size_t i = 0; i < vars.size(); ++i) {
    EXPECT_TRUE(vars[i]->tensor().equals(values[i])) << vars[i]->name();
  }
}

TEST_F(CheckpointTest, RoundTripsModelOptimizerCountersRngAndIterator) {
  nn::Sequential model = testutil::small_model();
  optim::Adam opt;
  testutil::constant_gradient_step(model, opt, 0.5f);
  int64_t epoch = 3;
  Philox rng(42, 17);
  data::IteratorState pos{2, 5};
  Tensor xs = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, Shape{8});
  data::Dataset ds = data::Dataset::from_tensor_slices({xs}).shuffle(8, 7);
  data::Iterator it = ds.iterator(1);
  data::Element e;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(it.next(e));
  std::vector<float> expected_rest;
  {
    data::Iterator probe = ds.iterator_from(it.state());
    while (probe.next(e)) expected_rest.push_back(e[0].data<float>()[0]);
  }

  Checkpoint ckpt({{"model", model},
                   {"optimizer", opt},
                   {"epoch", epoch},
                   {"rng", rng},
                   {"pos", pos},
                   {"data", Trackable::iterator(ds, it)}});
  const std::string saved = ckpt.save(path("ckpt"));
  EXPECT_EQ(saved, path("ckpt-1"));
  const auto model_values = values_of(model.weights());
  const auto opt_values = values_of(opt.variables());

  testutil::constant_gradient_step(model, opt, -2.0f);
  epoch = 9;
  rng.next_u64();
  pos = {7, 7};
  it = ds.iterator(4);

  ckpt.restore(saved).assert_consumed();
  expect_bitwise_equal(model.weights(), model_values);
  expect_bitwise_equal(opt.variables(), opt_values);
  EXPECT_EQ(opt.iterations(), 1);
  EXPECT_EQ(epoch, 3);
  EXPECT_EQ(rng.state(), (RngState{42, 17}));
  EXPECT_EQ(pos, (data::IteratorState{2, 5}));
  EXPECT_EQ(it.state(), (data::IteratorState{1, 3}));
  std::vector<float> rest;
  while (it.next(e)) rest.push_back(e[0].data<float>()[0]);
  EXPECT_EQ(rest, expected_rest);
}

TEST_F(CheckpointTest, KeysAndObjectGraphFollowTensorFlow) {
  nn::Sequential model = testutil::small_model();
  optim::Adam opt;
  testutil::constant_gradient_step(model, opt, 0.5f);
  Checkpoint ckpt({{"model", model}, {"optimizer", opt}});
  const std::string saved = ckpt.save(path("ckpt"));
  BundleReader r(saved);
  const std::vector<std::string> expected = {
      "_CHECKPOINTABLE_OBJECT_GRAPH",
      "model/layer_with_weights-0/bias/.ATTRIBUTES/VARIABLE_VALUE",
      "model/layer_with_weights-0/bias/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE",
      "model/layer_with_weights-0/bias/.OPTIMIZER_SLOT/optimizer/v/.ATTRIBUTES/VARIABLE_VALUE",
      "model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE",
      "model/layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE",
      "model/layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/v/.ATTRIBUTES/VARIABLE_VALUE",
      "model/layer_with_weights-1/bias/.ATTRIBUTES/VARIABLE_VALUE",
      "model/layer_with_weights-1/bias/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE",
      "model/layer_with_weights-1/bias/.OPTIMIZER_SLOT/optimizer/v/.ATTRIBUTES/VARIABLE_VALUE",
      "model/layer_with_weights-1/kernel/.ATTRIBUTES/VARIABLE_VALUE",
      "model/layer_with_weights-1/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE",
      "model/layer_with_weights-1/kernel/.OPTIMIZER_SLOT/optimizer/v/.ATTRIBUTES/VARIABLE_VALUE",
      "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE",
      "save_counter/.ATTRIBUTES/VARIABLE_VALUE"};
  EXPECT_EQ(r.keys(), expected);
  EXPECT_EQ(r.read("save_counter/.ATTRIBUTES/VARIABLE_VALUE").dtype(), DType::kInt64);
  EXPECT_EQ(r.read("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE").data<int64_t>()[0], 1);

  const ObjectGraph g = ObjectGraph::parse(r.read_strings("_CHECKPOINTABLE_OBJECT_GRAPH")[0], "t");
  const auto& root = g.nodes[0];
  ASSERT_EQ(root.children.size(), 3u);
  EXPECT_EQ(root.children[0].local_name, "model");
  EXPECT_EQ(root.children[1].local_name, "optimizer");
  EXPECT_EQ(root.children[2].local_name, "save_counter");
  const auto& m = g.nodes[static_cast<size_t>(root.children[0].node_id)];
  ASSERT_EQ(m.children.size(), 4u);
  EXPECT_EQ(m.children[0].local_name, "layer_with_weights-0");
  EXPECT_EQ(m.children[1].local_name, "layer-0");
  EXPECT_EQ(m.children[0].node_id, m.children[1].node_id);  // a DAG, as in Keras
  const auto& dense = g.nodes[static_cast<size_t>(m.children[0].node_id)];
  ASSERT_EQ(dense.children.size(), 2u);
  EXPECT_EQ(dense.children[0].local_name, "kernel");
  const auto& kernel = g.nodes[static_cast<size_t>(dense.children[0].node_id)];
  ASSERT_EQ(kernel.attributes.size(), 1u);
  EXPECT_EQ(kernel.attributes[0].name, "VARIABLE_VALUE");
  EXPECT_EQ(kernel.attributes[0].full_name, model.layers()[0]->name() + "/kernel");
  EXPECT_EQ(kernel.attributes[0].checkpoint_key,
            "model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE");
  const auto& o = g.nodes[static_cast<size_t>(root.children[1].node_id)];
  ASSERT_EQ(o.slot_variables.size(), 8u);  // m and v for 4 variables
  EXPECT_EQ(o.slot_variables[0].original_variable_node_id, dense.children[0].node_id);
  EXPECT_EQ(o.slot_variables[0].slot_name, "m");
  const auto& slot = g.nodes[static_cast<size_t>(o.slot_variables[0].slot_variable_node_id)];
  EXPECT_EQ(slot.attributes[0].checkpoint_key,
            "model/layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/"
            "VARIABLE_VALUE");
}

class TwoDense : public nn::Model {
 public:
  Tensor call(const Tensor& x, bool training) override { return d2_(d1_(x, training), training); }
  nn::Dense& d1_ = add("encoder", nn::Dense(3, {.seed = 5}));
  nn::Dense& d2_ = add("head", nn::Dense(1, {.seed = 6}));
};

TEST_F(CheckpointTest, SubclassedModelsUseTheirAttributeNames) {
  TwoDense model;
  model.build(Shape{2});
  Checkpoint ckpt({{"net", model}});
  const std::vector<std::string> expected = {"net/encoder/bias/.ATTRIBUTES/VARIABLE_VALUE",
                                             "net/encoder/kernel/.ATTRIBUTES/VARIABLE_VALUE",
                                             "net/head/bias/.ATTRIBUTES/VARIABLE_VALUE",
                                             "net/head/kernel/.ATTRIBUTES/VARIABLE_VALUE"};
  EXPECT_EQ(ckpt.keys(), expected);
  const auto before = values_of(model.weights());
  ckpt.write(path("w"));
  for (Variable* v : model.weights()) v->tensor().fill(0);
  ckpt.restore(path("w")).assert_consumed();
  expect_bitwise_equal(model.weights(), before);
}

// A checkpoint's files held in memory restore as the files do; damaged bytes change nothing.
TEST_F(CheckpointTest, RestoresFromTheFilesBytesInMemory) {
  TwoDense model;
  model.build(Shape{2});
  Checkpoint ckpt({{"net", model}});
  const auto before = values_of(model.weights());
  ckpt.write(path("w"));
  const std::string index = read_file(path("w.index"));
  std::string data = read_file(data_filename(path("w"), 0, 1));
  for (Variable* v : model.weights()) v->tensor().fill(0);
  const auto zeros = values_of(model.weights());
  data[data.size() - 1] ^= 0x01;  // the last value's last byte
  try {
    ckpt.restore("snap-3 (received)", BundleBytes{.index = index, .shards = {data}});
    FAIL() << "a damaged value was restored";
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find("snap-3 (received)"), std::string::npos) << e.what();
  }
  expect_bitwise_equal(model.weights(), zeros);  // nothing assigned
  data[data.size() - 1] ^= 0x01;
  const CheckpointLoadStatus status =
      ckpt.restore("snap-3 (received)", BundleBytes{.index = index, .shards = {data}});
  status.assert_consumed();
  EXPECT_EQ(status.save_path(), "snap-3 (received)");
  expect_bitwise_equal(model.weights(), before);
}

TEST_F(CheckpointTest, SaveNumbersCheckpointsAndCommitsThemInTheStateFile) {
  Variable v("v", Tensor::scalar(1.0f));
  Checkpoint ckpt({{"v", v}});
  EXPECT_FALSE(latest_checkpoint(dir_).has_value());
  EXPECT_EQ(ckpt.save(path("ckpt")), path("ckpt-1"));
  v.tensor().fill(2.0f);
  EXPECT_EQ(ckpt.save(path("ckpt")), path("ckpt-2"));
  EXPECT_EQ(ckpt.save_counter(), 2);
  EXPECT_EQ(latest_checkpoint(dir_), path("ckpt-2"));
  const std::string state = read_file(path("checkpoint"));
  EXPECT_EQ(state.find("model_checkpoint_path: \"ckpt-2\"\n"), 0u) << state;
  EXPECT_NE(state.find("all_model_checkpoint_paths: \"ckpt-1\"\nall_model_checkpoint_paths: "
                       "\"ckpt-2\"\n"),
            std::string::npos)
      << state;

  // A fresh process resumes the counter from the checkpoint (TF restores save_counter too).
  Variable w("v", Tensor::scalar(0.0f));
  Checkpoint resumed({{"v", w}});
  resumed.restore(*latest_checkpoint(dir_)).assert_consumed();
  EXPECT_EQ(w.tensor().data<float>()[0], 2.0f);
  EXPECT_EQ(resumed.save_counter(), 2);
  EXPECT_EQ(resumed.save(path("ckpt")), path("ckpt-3"));
  resumed.restore(path("ckpt-1")).assert_consumed();
  EXPECT_EQ(w.tensor().data<float>()[0], 1.0f);
}

TEST_F(CheckpointTest, SaveListsTheNewestTenExistingCheckpoints) {
  Variable v("v", Tensor::scalar(1.0f));
  Checkpoint ckpt({{"v", v}});
  auto listed = [&] {
    std::vector<int> out;
    const std::optional<CheckpointState> st = read_checkpoint_state(dir_);
    for (const std::string& p : st->all_model_checkpoint_paths) {
      out.push_back(std::stoi(p.substr(p.rfind('-') + 1)));
    }
    return out;
  };
  for (int i = 1; i <= 15; ++i) ckpt.save(path("ckpt"));
  EXPECT_EQ(listed(), (std::vector<int>{6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_TRUE(fs::exists(path("ckpt-1.index")));  // unlisted, not deleted (as TF)
  fs::remove(path("ckpt-14.index"));
  ckpt.save(path("ckpt"));
  EXPECT_EQ(listed(), (std::vector<int>{6, 7, 8, 9, 10, 11, 12, 13, 15, 16}));
  EXPECT_EQ(latest_checkpoint(dir_), path("ckpt-16"));
}

TEST_F(CheckpointTest, WriteUsesThePrefixAsGivenWithoutCounterOrStateFile) {
  Variable v("v", Tensor::scalar(1.0f));
  Checkpoint ckpt({{"v", v}});
  EXPECT_EQ(ckpt.write(path("weights")), path("weights"));
  EXPECT_TRUE(fs::exists(path("weights.index")));
  EXPECT_TRUE(fs::exists(path("weights.data-00000-of-00001")));
  EXPECT_FALSE(fs::exists(path("checkpoint")));
  BundleReader r(path("weights"));
  EXPECT_FALSE(r.contains("save_counter/.ATTRIBUTES/VARIABLE_VALUE"));
  Checkpoint other({{"v", v}});
  other.restore(path("weights")).assert_consumed();  // no save_counter: not "missing"
}

TEST_F(CheckpointTest, RestoresKerasSaveWeightsFixtureIntoARootModel) {
  nn::Sequential model({nn::Dense(2, {.input_shape = Shape{2}})});
  Checkpoint ckpt(model);  // root = model, as model.save_weights writes
  auto status = ckpt.restore(kFixtures + "/keras_lso_two_shards/ckpt");
  EXPECT_EQ(model.weights()[0]->tensor().to_vector<float>(),
            (std::vector<float>{9.229685f, 10.901115f, 10.370763f, 9.757362f}));
  EXPECT_EQ(model.weights()[1]->tensor().to_vector<float>(),
            (std::vector<float>{10.049943f, 9.917691f}));
  EXPECT_EQ(status.restored_count(), 2u);
  EXPECT_TRUE(status.missing_keys().empty());
  EXPECT_NO_THROW(status.assert_existing_objects_matched());
  EXPECT_THROW(status.assert_consumed(), FailedPreconditionError);  // optimizer values unused
  EXPECT_EQ(status.unused_keys().size(), 8u);
}

TEST_F(CheckpointTest, RestoresTf2AndTf1StyleFixtures) {
  Variable a("x", Tensor::scalar(0.0f)), b("y", Tensor::scalar(0.0f)), c("z", Tensor::scalar(0.0f));
  Checkpoint tf2({{"a", a}, {"b", b}, {"c", c}});
  tf2.restore(kFixtures + "/half_plus_two_tf2_snappy/variables").expect_partial();
  EXPECT_EQ(a.tensor().data<float>()[0], 0.5f);
  EXPECT_EQ(b.tensor().data<float>()[0], 2.0f);
  EXPECT_EQ(c.tensor().data<float>()[0], 3.0f);

  // No object graph: TF1 names, matched against variable names.
  Variable a1("a", Tensor::scalar(0.0f)), b1("b", Tensor::scalar(0.0f)),
      c1("c", Tensor::scalar(0.0f));
  Checkpoint tf1({{"first", a1}, {"second", b1}, {"third", c1}});
  tf1.restore(kFixtures + "/half_plus_three/variables").assert_consumed();
  EXPECT_EQ(a1.tensor().data<float>()[0], 0.5f);
  EXPECT_EQ(b1.tensor().data<float>()[0], 3.0f);
  EXPECT_EQ(c1.tensor().data<float>()[0], 3.0f);
}

TEST_F(CheckpointTest, UnbuiltModelFailsWithAClearErrorAndWorksOnceBuilt) {
  nn::Sequential model = testutil::small_model();
  Checkpoint ckpt({{"model", model}});
  const std::string saved = ckpt.save(path("ckpt"));
  const auto values = values_of(model.weights());

  nn::Sequential fresh({nn::Dense(4, {.activation = "relu"}), nn::Dense(2)});
  Checkpoint target({{"model", fresh}});
  try {
    target.restore(saved);
    FAIL() << "restored into an unbuilt model";
  } catch (const FailedPreconditionError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("not built"), std::string::npos) << what;
    EXPECT_NE(what.find("model/layer_with_weights-0/"), std::string::npos) << what;
  }
  fresh.build(Shape{3});
  target.restore(saved).assert_consumed();
  expect_bitwise_equal(fresh.weights(), values);
}

TEST_F(CheckpointTest, SlotsAreCreatedOnRestoreAsKerasDoes) {
  nn::Sequential model = testutil::small_model();
  optim::Adam opt;
  testutil::constant_gradient_step(model, opt, 0.25f);
  Checkpoint ckpt({{"model", model}, {"optimizer", opt}});
  const std::string saved = ckpt.save(path("ckpt"));
  const auto slot_values = values_of(opt.variables());

  nn::Sequential model2 = testutil::small_model();
  optim::Adam opt2;  // no slots yet
  Checkpoint ckpt2({{"model", model2}, {"optimizer", opt2}});
  ckpt2.restore(saved).assert_consumed();
  expect_bitwise_equal(opt2.variables(), slot_values);
  expect_bitwise_equal(model2.weights(), values_of(model.weights()));
}

TEST_F(CheckpointTest, MismatchedShapeFailsAndChangesNothing) {
  Variable a("a", Tensor::from_vector<float>({1, 2}, Shape{2}));
  Variable b("b", Tensor::from_vector<float>({3, 4, 5}, Shape{3}));
  Checkpoint ckpt({{"a", a}, {"b", b}});
  const std::string saved = ckpt.save(path("ckpt"));
  Variable a2("a", Tensor::from_vector<float>({9, 9}, Shape{2}));
  Variable b2("b", Tensor::from_vector<float>({9, 9}, Shape{2}));
  Checkpoint other({{"a", a2}, {"b", b2}});
  try {
    other.restore(saved);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'b/.ATTRIBUTES/VARIABLE_VALUE'"), std::string::npos) << what;
    EXPECT_NE(what.find("[3]"), std::string::npos) << what;
    EXPECT_NE(what.find("[2]"), std::string::npos) << what;
  }
  EXPECT_EQ(a2.tensor().to_vector<float>(), (std::vector<float>{9, 9}));
  EXPECT_EQ(other.save_counter(), 0);
}

// A variable nobody else holds takes the buffer its value was read into: restore copies nothing
// (it used to read every value into a new buffer and then copy it into the variable's).
TEST_F(CheckpointTest, RestoreHandsTheReadBufferToAnUnsharedVariable) {
  Variable v("v", Tensor::from_vector<float>({1, 2, 3, 4}, Shape{2, 2}));
  Checkpoint ckpt({{"v", v}});
  const std::string saved = ckpt.save(path("ckpt"));
  v.tensor().fill(0);
  const void* before = v.tensor().raw_data();
  ckpt.restore(saved).assert_consumed();
  EXPECT_EQ(v.tensor().to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_NE(v.tensor().raw_data(), before);  // the read buffer, not a copy into the old one
  EXPECT_EQ(v.tensor().use_count(), 1);
}

// A variable whose buffer a view shares (a ZeRO shard, a layer's handle) keeps its buffer, and
// the view sees the restored values.
TEST_F(CheckpointTest, RestoreCopiesIntoAVariableWhoseBufferIsShared) {
  Variable v("v", Tensor::from_vector<float>({1, 2, 3, 4}, Shape{2, 2}));
  Checkpoint ckpt({{"v", v}});
  const std::string saved = ckpt.save(path("ckpt"));
  v.tensor().fill(0);
  const Tensor second_row = v.tensor().slice(1, 2);
  const void* before = v.tensor().raw_data();
  ckpt.restore(saved).assert_consumed();
  EXPECT_EQ(v.tensor().raw_data(), before);
  EXPECT_EQ(second_row.to_vector<float>(), (std::vector<float>{3, 4}));
}

TEST_F(CheckpointTest, CorruptLatestFallsBackToTheNewestValidCheckpointAndWarns) {
  Variable v("v", Tensor::from_vector<float>({1, 1, 1}, Shape{3}));
  Checkpoint ckpt({{"v", v}});
  ckpt.save(path("ckpt"));
  v.tensor().fill(2);
  ckpt.save(path("ckpt"));
  v.tensor().fill(3);
  const std::string third = ckpt.save(path("ckpt"));
  // Data order: object graph, v (12 bytes), save_counter (8 bytes).
  testutil::flip_byte(third + ".data-00000-of-00001",
                      fs::file_size(third + ".data-00000-of-00001") - 12);

  v.tensor().fill(0);
  try {
    ckpt.restore(third);
    FAIL();
  } catch (const DataLossError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(third + ".data-00000-of-00001"), std::string::npos) << what;
    EXPECT_NE(what.find("'v/.ATTRIBUTES/VARIABLE_VALUE'"), std::string::npos) << what;
  }
  EXPECT_EQ(v.tensor().to_vector<float>(), (std::vector<float>{0, 0, 0}));  // untouched

  warnings_.clear();
  auto status = ckpt.restore_latest(dir_);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->save_path(), path("ckpt-2"));
  EXPECT_EQ(v.tensor().to_vector<float>(), (std::vector<float>{2, 2, 2}));
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find(third), std::string::npos) << warnings_[0];
  EXPECT_NE(warnings_[0].find("falling back"), std::string::npos) << warnings_[0];

  // Truncate the second; remove the first's index: nothing valid is left.
  fs::resize_file(path("ckpt-2.data-00000-of-00001"), 5);
  fs::remove(path("ckpt-1.index"));
  EXPECT_THROW(ckpt.restore_latest(dir_), DataLossError);
}

TEST_F(CheckpointTest, AsyncSaveSnapshotsValuesBeforeReturning) {
  Tensor big = Tensor::full(Shape{1 << 20}, 1.0f);
  Variable v("v", big.clone());
  int64_t step = 10;
  Checkpoint ckpt({{"v", v}, {"step", step}}, {.enable_async = true});
  for (int round = 0; round < 3; ++round) {
    const std::string saved = ckpt.save(path("ckpt"));
    // Changed right after save() returned, while the background thread writes.
    v.tensor().fill(100.0 + round);
    step = 1000 + round;
    ckpt.sync();
    EXPECT_EQ(latest_checkpoint(dir_), saved);
    Variable r("v", Tensor::zeros(Shape{1 << 20}));
    int64_t rstep = 0;
    Checkpoint reader({{"v", r}, {"step", rstep}});
    reader.restore(saved).assert_consumed();
    EXPECT_TRUE(r.tensor().equals(round == 0 ? big : Tensor::full(Shape{1 << 20}, 99.0f + round)));
    EXPECT_EQ(rstep, round == 0 ? 10 : 999 + round);
  }
}

TEST_F(CheckpointTest, AsyncWriteErrorSurfacesOnTheNextCall) {
  // A directory where a data file must go makes the rename fail on the writer thread.
  for (int n : {1, 2, 4})
    fs::create_directories(path("bad/ckpt-" + std::to_string(n) + ".data-00000-of-00001"));
  Variable v("v", Tensor::scalar(1.0f));
  {
    // One save in flight: each save waits for the previous one, so the next call reports it.
    Checkpoint ckpt({{"v", v}}, {.enable_async = true, .max_in_flight = 1});
    EXPECT_EQ(ckpt.save(path("bad/ckpt")), path("bad/ckpt-1"));  // returns: the write is pending
    try {
      ckpt.sync();
      FAIL() << "the write error was lost";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path("bad/ckpt-1.data-00000-of-00001")),
                std::string::npos)
          << e.what();
    }
    EXPECT_NO_THROW(ckpt.sync());  // reported once
    ckpt.save(path("bad/ckpt"));
    EXPECT_THROW(ckpt.save(path("ok/ckpt")), Error);  // the next save reports it
    EXPECT_EQ(ckpt.save(path("ok/ckpt")), path("ok/ckpt-3"));
    ckpt.sync();
    EXPECT_EQ(latest_checkpoint(path("ok")), path("ok/ckpt-3"));
    EXPECT_FALSE(latest_checkpoint(path("bad")).has_value());
    warnings_.clear();
    ckpt.save(path("bad/ckpt"));
  }  // the destructor waits and warns about the unreported error
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_.back().find("asynchronous"), std::string::npos);
}

TEST_F(CheckpointTest, PipelinedAsyncSavesCommitInSaveOrderAndSyncWaitsForAll) {
  // Every third save is 100 times larger, so later saves finish writing before earlier ones;
  // a reader polling the state file must still only ever see ckpt-1..ckpt-k, each complete.
  Variable v("v", Tensor::scalar(0.0f));
  int64_t k = 0;
  auto big = [&] { return Shape{k % 3 == 1 ? int64_t{1} << 20 : int64_t{1} << 10}; };
  Checkpoint ckpt({{"v", v},
                   {"k", k},
                   {"blob", Trackable::value([&] { return Tensor::full(big(), float(k)); },
                                             [](const Tensor&) {})}},
                  {.enable_async = true, .max_in_flight = 8});
  // Consecutive checkpoints (the newest 10 at most), newest last, moving forward; named means
  // complete: its index (written last, after the data) is there.
  testutil::StateFilePoller poller(dir_, 10, [&](const CheckpointState& st) {
    return fs::exists(path(st.model_checkpoint_path + ".index"));
  });
  constexpr int kSaves = 24;
  for (k = 1; k <= kSaves; ++k) {
    v.tensor().fill(static_cast<float>(k));
    EXPECT_EQ(ckpt.save(path("ckpt")), path("ckpt-" + std::to_string(k)));
    v.tensor().fill(-1.0f);  // after save() returned: must not reach the file
  }
  ckpt.sync();  // waits for all of them
  poller.stop();
  EXPECT_EQ(poller.bad(), 0) << poller.first_bad();
  EXPECT_GT(poller.polls(), 0);
  const auto st = read_checkpoint_state(dir_);
  ASSERT_TRUE(st.has_value());
  ASSERT_EQ(st->all_model_checkpoint_paths.size(), 10u);
  EXPECT_EQ(latest_checkpoint(dir_), path("ckpt-" + std::to_string(kSaves)));
  for (int i = 1; i <= kSaves; ++i) {
    if (i > kSaves - 10) {
      EXPECT_EQ(st->all_model_checkpoint_paths[static_cast<size_t>(i - (kSaves - 9))],
                path("ckpt-" + std::to_string(i)));
    }
    Variable r("v", Tensor::scalar(0.0f));
    int64_t rk = 0;
    Checkpoint reader_ckpt({{"v", r}, {"k", rk}});
    reader_ckpt.restore(path("ckpt-" + std::to_string(i))).expect_partial();
    EXPECT_EQ(r.tensor().data<float>()[0], static_cast<float>(i));
    EXPECT_EQ(rk, i);
  }
  EXPECT_TRUE(warnings_.empty());
  EXPECT_THROW(Checkpoint({{"v", v}}, {.max_in_flight = 0}), InvalidArgumentError);
}

TEST_F(CheckpointTest, PipelinedWriteErrorSurfacesOnceAndNothingAfterItCommits) {
  // ckpt-3's data file cannot be renamed into place; ckpt-1..6 are queued before it fails.
  fs::create_directories(path("ckpt-3.data-00000-of-00001"));
  Variable v("v", Tensor::full(Shape{1 << 16}, 0.0f));
  Checkpoint ckpt({{"v", v}}, {.enable_async = true, .max_in_flight = 8});
  std::vector<std::string> before, after;  // paths returned before / after the error surfaced
  int errors = 0;
  auto check_error = [&](const Error& e) {
    ++errors;
    EXPECT_NE(std::string(e.what()).find(path("ckpt-3.data-00000-of-00001")), std::string::npos)
        << e.what();
  };
  for (int i = 1; i <= 6; ++i) {
    v.tensor().fill(static_cast<float>(i));
    try {
      (errors ? after : before).push_back(ckpt.save(path("ckpt")));
    } catch (const Error& e) {
      check_error(e);
    }
  }
  try {
    ckpt.sync();
  } catch (const Error& e) {
    check_error(e);
  }
  EXPECT_EQ(errors, 1);
  EXPECT_NO_THROW(ckpt.sync());  // reported once
  ASSERT_GE(before.size(), 3u);
  EXPECT_EQ(before[2], path("ckpt-3"));
  // Committed: ckpt-1, ckpt-2, then only saves made after the error was reported.
  std::vector<std::string> expected = {path("ckpt-1"), path("ckpt-2")};
  expected.insert(expected.end(), after.begin(), after.end());
  const auto st = read_checkpoint_state(dir_);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->all_model_checkpoint_paths, expected);
  // Saves queued after the failed one were discarded: their files are gone, and a warning said so.
  for (size_t i = 3; i < before.size(); ++i) {
    EXPECT_FALSE(fs::exists(before[i] + ".index")) << before[i];
    EXPECT_FALSE(fs::exists(before[i] + ".data-00000-of-00001")) << before[i];
  }
  if (before.size() > 3) {
    ASSERT_FALSE(warnings_.empty());
    EXPECT_NE(warnings_[0].find("discarded"), std::string::npos) << warnings_[0];
  }
  EXPECT_TRUE(fs::is_directory(path("ckpt-3.data-00000-of-00001")));  // not the writer's to remove
  // The pipeline keeps working.
  v.tensor().fill(42.0f);
  const std::string next = ckpt.save(path("ckpt"));
  ckpt.sync();
  EXPECT_EQ(latest_checkpoint(dir_), next);
  Variable r("v", Tensor::zeros(Shape{1 << 16}));
  Checkpoint reader({{"v", r}});
  reader.restore_latest(dir_)->assert_consumed();
  EXPECT_TRUE(r.tensor().equals(Tensor::full(Shape{1 << 16}, 42.0f)));
}

TEST_F(CheckpointTest, UnconsumedValuesWarnUnlessExpectPartial) {
  Variable a("a", Tensor::scalar(1.0f)), b("b", Tensor::scalar(2.0f));
  Checkpoint both({{"a", a}, {"b", b}});
  const std::string saved = both.write(path("w"));
  Checkpoint only_a({{"a", a}});
  warnings_.clear();
  { only_a.restore(saved).expect_partial(); }
  EXPECT_TRUE(warnings_.empty());
  {
    auto status = only_a.restore(saved);
    EXPECT_EQ(status.unused_keys(), (std::vector<std::string>{"b/.ATTRIBUTES/VARIABLE_VALUE"}));
  }
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("b/.ATTRIBUTES/VARIABLE_VALUE"), std::string::npos);
  Checkpoint more(
      {{"a", a},
       {"b", b},
       {"c", Trackable::value([] { return Tensor::scalar(0.0f); }, [](const Tensor&) {})}});
  auto status = more.restore(saved);
  EXPECT_THROW(status.assert_existing_objects_matched(), FailedPreconditionError);
  EXPECT_EQ(status.missing_keys(), (std::vector<std::string>{"c/.ATTRIBUTES/VARIABLE_VALUE"}));
  EXPECT_THROW(more.restore(path("nope")), NotFoundError);
}

TEST_F(CheckpointTest, EscapesDotsAndSlashesInNamesAsTensorFlowDoes) {
  Variable v("v", Tensor::scalar(1.0f));
  Checkpoint ckpt({{"a.b/c", Trackable::object({{"x", v}})}});
  EXPECT_EQ(ckpt.keys(), (std::vector<std::string>{"a..b.Sc/x/.ATTRIBUTES/VARIABLE_VALUE"}));
}

}  // namespace
}  // namespace dtrain::checkpoint
