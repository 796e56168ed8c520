// Keras HDF5 layout: reads the real Keras 2.12 file (weights checked against the CSVs Keras
// dumped beside it), round-trips both of h5py's string encodings and both layouts, and checks
// the errors and the crash safety of writes (a failed write leaves the old file intact).
#include "dtrain/checkpoint/keras_h5.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dtrain/core/error.h"
#include "testutil/expect_throws.h"
#include "testutil/keras_fixture.h"
#include "testutil/temp_dir.h"

namespace dtrain::checkpoint {
namespace {

using dtrain::testutil::expect_throws;
using dtrain::testutil::read_bytes;
using dtrain::testutil::TempDir;
using dtrain::testutil::write_bytes;

namespace fs = std::filesystem;

using testutil::kKerasFixture;
using testutil::kKerasFixtureDir;
using testutil::read_csv;

// A fresh directory, removed with everything in it at the end of the test.

const H5LayerWeights* find_layer(const KerasH5Contents& c, const std::string& name) {
  for (const auto& l : c.layers) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

const H5ObjectInfo* find_object(const std::vector<H5ObjectInfo>& objects, const std::string& path) {
  for (const auto& o : objects) {
    if (o.path == path) return &o;
  }
  return nullptr;
}

std::string attribute_type(const H5ObjectInfo& o, const std::string& name) {
  for (const auto& [n, t] : o.attributes) {
    if (n == name) return t;
  }
  return "<absent>";
}

// Expects `tensor` [rows, cols] (or [cols] for a one-row CSV) to equal the CSV within 1e-7.
void expect_matches_csv(const Tensor& tensor, const std::string& csv, const Shape& shape) {
  ASSERT_EQ(tensor.dtype(), DType::kFloat32);
  ASSERT_EQ(tensor.shape(), shape);
  const auto rows = read_csv(csv);
  const int64_t cols = shape.dim(shape.rank() - 1);
  ASSERT_EQ(static_cast<int64_t>(rows.size()), shape.rank() == 1 ? 1 : shape.dim(0));
  const float* p = tensor.data<float>();
  double max_diff = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    ASSERT_EQ(static_cast<int64_t>(rows[r].size()), cols) << csv << " row " << r;
    for (int64_t c = 0; c < cols; ++c) {
      max_diff = std::max(max_diff, std::abs(static_cast<double>(p[r * cols + c]) - rows[r][c]));
    }
  }
  EXPECT_LE(max_diff, 1e-7) << csv;
}

Tensor floats(std::vector<float> values, const Shape& shape) {
  return Tensor::from_vector(values, shape);
}

Tensor int64_scalar(int64_t v) {
  Tensor t(DType::kInt64, Shape{});
  t.data<int64_t>()[0] = v;
  return t;
}

// A small model file: two Dense layers, a weightless Flatten, Adam state.
KerasH5Contents sample_contents() {
  KerasH5Contents c;
  c.model_config = R"({"class_name": "Sequential", "config": {"name": "s", "layers": []}})";
  c.training_config = R"({"loss": "mse", "metrics": [], "optimizer_config": {}})";
  c.layers.push_back({"flatten", {}});
  c.layers.push_back({"dense",
                      {{"dense/kernel:0", floats({1, 2, 3, 4, 5, 6}, Shape{2, 3})},
                       {"dense/bias:0", floats({0.5f, -0.25f, 1e-30f}, Shape{3})}}});
  c.layers.push_back({"dense_1",
                      {{"dense_1/kernel:0", floats({-1, 2, -3}, Shape{3, 1})},
                       {"dense_1/bias:0", floats({7}, Shape{1})}}});
  c.optimizer_weights = {{"iteration:0", int64_scalar(42)},
                         {"Adam/m/dense/kernel:0", floats({.1f, .2f, .3f, .4f, .5f, .6f}, {2, 3})},
                         {"Adam/v/dense/kernel:0", floats({1, 1, 1, 1, 1, 1}, {2, 3})}};
  return c;
}

void expect_same_weights(const std::vector<H5Weight>& a, const std::vector<H5Weight>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].value.dtype(), b[i].value.dtype()) << a[i].name;
    EXPECT_EQ(a[i].value.shape(), b[i].value.shape()) << a[i].name;
    ASSERT_EQ(a[i].value.nbytes(), b[i].value.nbytes()) << a[i].name;
    EXPECT_EQ(std::memcmp(a[i].value.raw_data(), b[i].value.raw_data(), a[i].value.nbytes()), 0)
        << a[i].name << " differs";
  }
}

void expect_same_contents(const KerasH5Contents& a, const KerasH5Contents& b) {
  EXPECT_EQ(a.weights_only, b.weights_only);
  EXPECT_EQ(a.keras_version, b.keras_version);
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.model_config, b.model_config);
  EXPECT_EQ(a.training_config, b.training_config);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_EQ(a.layers[i].name, b.layers[i].name);
    expect_same_weights(a.layers[i].weights, b.layers[i].weights);
  }
  expect_same_weights(a.top_level_weights, b.top_level_weights);
  expect_same_weights(a.optimizer_weights, b.optimizer_weights);
}

// --- The real Keras 2.12 file -----------------------------------------------------------------

TEST(KerasH5Fixture, WeightsEqualTheCsvsKerasDumped) {
  const KerasH5Contents c = read_keras_h5(kKerasFixture);
  EXPECT_FALSE(c.weights_only);
  EXPECT_EQ(c.keras_version, "2.12.0");
  EXPECT_EQ(c.backend, "tensorflow");
  ASSERT_EQ(c.layers.size(), 3u);
  EXPECT_EQ(c.layers[0].name, "flatten");
  EXPECT_EQ(c.layers[1].name, "dense");
  EXPECT_EQ(c.layers[2].name, "dense_1");
  EXPECT_TRUE(c.layers[0].weights.empty());  // stored as an empty float64 weight_names array
  const H5LayerWeights* dense = find_layer(c, "dense");
  const H5LayerWeights* dense_1 = find_layer(c, "dense_1");
  ASSERT_NE(dense, nullptr);
  ASSERT_NE(dense_1, nullptr);
  ASSERT_EQ(dense->weights.size(), 2u);
  ASSERT_EQ(dense_1->weights.size(), 2u);
  EXPECT_EQ(dense->weights[0].name, "dense/kernel:0");
  EXPECT_EQ(dense->weights[1].name, "dense/bias:0");
  EXPECT_EQ(dense_1->weights[0].name, "dense_1/kernel:0");
  expect_matches_csv(dense->weights[0].value, kKerasFixtureDir + "layer_1_weights_0.csv",
                     {784, 128});
  expect_matches_csv(dense->weights[1].value, kKerasFixtureDir + "layer_1_weights_1.csv", {128});
  expect_matches_csv(dense_1->weights[0].value, kKerasFixtureDir + "layer_2_weights_0.csv",
                     {128, 10});
  expect_matches_csv(dense_1->weights[1].value, kKerasFixtureDir + "layer_2_weights_1.csv", {10});
  EXPECT_TRUE(c.top_level_weights.empty());
}

TEST(KerasH5Fixture, ConfigsAndOptimizerWeightsInKerasOrder) {
  const KerasH5Contents c = read_keras_h5(kKerasFixture);
  const auto model = nlohmann::json::parse(c.model_config);
  EXPECT_EQ(model["class_name"], "Sequential");
  ASSERT_EQ(model["config"]["layers"].size(), 4u);
  EXPECT_EQ(model["config"]["layers"][0]["class_name"], "InputLayer");
  const auto training = nlohmann::json::parse(c.training_config);
  EXPECT_EQ(training["loss"], "sparse_categorical_crossentropy");
  EXPECT_EQ(training["optimizer_config"]["class_name"], "Custom>Adam");

  const std::vector<std::string> expected = {"iteration:0",
                                             "Adam/m/dense/kernel:0",
                                             "Adam/v/dense/kernel:0",
                                             "Adam/m/dense/bias:0",
                                             "Adam/v/dense/bias:0",
                                             "Adam/m/dense_1/kernel:0",
                                             "Adam/v/dense_1/kernel:0",
                                             "Adam/m/dense_1/bias:0",
                                             "Adam/v/dense_1/bias:0"};
  ASSERT_EQ(c.optimizer_weights.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(c.optimizer_weights[i].name, expected[i]);
  const Tensor& it = c.optimizer_weights[0].value;
  EXPECT_EQ(it.dtype(), DType::kInt64);
  EXPECT_EQ(it.rank(), 0);
  EXPECT_GT(it.data<int64_t>()[0], 0);  // the model was trained
  EXPECT_EQ(c.optimizer_weights[1].value.shape(), (Shape{784, 128}));
  EXPECT_EQ(c.optimizer_weights[8].value.shape(), (Shape{10}));
  // v is a running mean of squares: never negative.
  const Tensor& v = c.optimizer_weights[2].value;
  for (int64_t i = 0; i < v.num_elements(); ++i) ASSERT_GE(v.data<float>()[i], 0.0f);
}

TEST(KerasH5Fixture, ListsObjectsWithTheirStringEncodings) {
  const auto objects = list_h5_objects(kKerasFixture);
  const H5ObjectInfo* root = find_object(objects, "/");
  ASSERT_NE(root, nullptr);
  EXPECT_TRUE(root->is_group);
  EXPECT_EQ(attribute_type(*root, "keras_version"), "vlen string");
  EXPECT_EQ(attribute_type(*root, "model_config"), "vlen string");
  const H5ObjectInfo* mw = find_object(objects, "/model_weights");
  ASSERT_NE(mw, nullptr);
  EXPECT_EQ(attribute_type(*mw, "layer_names"), "vlen string[3]");
  const H5ObjectInfo* flatten = find_object(objects, "/model_weights/flatten");
  ASSERT_NE(flatten, nullptr);
  EXPECT_EQ(attribute_type(*flatten, "weight_names"), "float64[0]");
  const H5ObjectInfo* kernel = find_object(objects, "/model_weights/dense/dense/kernel:0");
  ASSERT_NE(kernel, nullptr);
  EXPECT_FALSE(kernel->is_group);
  EXPECT_EQ(kernel->dtype, "float32");
  EXPECT_EQ(kernel->shape, (Shape{784, 128}));
  const H5ObjectInfo* iteration = find_object(objects, "/optimizer_weights/iteration:0");
  ASSERT_NE(iteration, nullptr);
  EXPECT_EQ(iteration->dtype, "int64");
  EXPECT_EQ(iteration->shape, Shape{});
}

TEST(KerasH5Fixture, RewritingItKeepsEverything) {
  TempDir dir;
  const KerasH5Contents original = read_keras_h5(kKerasFixture);
  write_keras_h5(dir.file("copy.h5"), original);
  expect_same_contents(read_keras_h5(dir.file("copy.h5")), original);
}

// --- Writing ------------------------------------------------------------------------------------

TEST(KerasH5Write, RoundTripIsBitwiseWithVariableLengthStrings) {
  TempDir dir;
  const KerasH5Contents c = sample_contents();
  write_keras_h5(dir.file("m.h5"), c);
  expect_same_contents(read_keras_h5(dir.file("m.h5")), c);

  const auto objects = list_h5_objects(dir.file("m.h5"));
  const H5ObjectInfo* root = find_object(objects, "/");
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(attribute_type(*root, "keras_version"), "vlen string");
  EXPECT_EQ(attribute_type(*root, "training_config"), "vlen string");
  const H5ObjectInfo* mw = find_object(objects, "/model_weights");
  ASSERT_NE(mw, nullptr);
  EXPECT_EQ(attribute_type(*mw, "layer_names"), "vlen string[3]");
  EXPECT_EQ(attribute_type(*mw, "keras_version"), "vlen string");
  EXPECT_EQ(attribute_type(*find_object(objects, "/model_weights/flatten"), "weight_names"),
            "float64[0]");
  ASSERT_NE(find_object(objects, "/model_weights/top_level_model_weights"), nullptr);
  const H5ObjectInfo* kernel = find_object(objects, "/model_weights/dense/dense/kernel:0");
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(kernel->shape, (Shape{2, 3}));
  const H5ObjectInfo* m = find_object(objects, "/optimizer_weights/Adam/m/dense/kernel:0");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->dtype, "float32");
  EXPECT_EQ(attribute_type(*find_object(objects, "/optimizer_weights"), "weight_names"),
            "vlen string[3]");
  // Only the final file is left: the temporary one was renamed.
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.h5"});
}

TEST(KerasH5Write, FixedLengthStringsAsH5py2WroteThem) {
  TempDir dir;
  KerasH5Contents c = sample_contents();
  c.keras_version = "2.2.4-tf";
  write_keras_h5(dir.file("old.h5"), c, {.fixed_length_strings = true, .top_level_group = false});
  expect_same_contents(read_keras_h5(dir.file("old.h5")), c);
  const auto objects = list_h5_objects(dir.file("old.h5"));
  const H5ObjectInfo* root = find_object(objects, "/");
  EXPECT_EQ(attribute_type(*root, "keras_version"), "fixed string(8, nullpad)");
  const H5ObjectInfo* mw = find_object(objects, "/model_weights");
  EXPECT_EQ(attribute_type(*mw, "layer_names"), "fixed string(7, nullpad)[3]");
  EXPECT_EQ(attribute_type(*find_object(objects, "/model_weights/dense"), "weight_names"),
            "fixed string(14, nullpad)[2]");
  EXPECT_EQ(find_object(objects, "/model_weights/top_level_model_weights"), nullptr);
}

TEST(KerasH5Write, WeightsOnlyLayoutHasLayerGroupsAtTheRoot) {
  TempDir dir;
  KerasH5Contents c = sample_contents();
  c.weights_only = true;
  c.model_config.clear();
  c.training_config.clear();
  c.optimizer_weights.clear();
  write_keras_h5(dir.file("w.h5"), c);
  const KerasH5Contents back = read_keras_h5(dir.file("w.h5"));
  EXPECT_TRUE(back.weights_only);
  expect_same_contents(back, c);
  const auto objects = list_h5_objects(dir.file("w.h5"));
  EXPECT_EQ(find_object(objects, "/model_weights"), nullptr);
  EXPECT_NE(find_object(objects, "/dense/dense/kernel:0"), nullptr);
  EXPECT_EQ(attribute_type(*find_object(objects, "/"), "layer_names"), "vlen string[3]");
  EXPECT_EQ(attribute_type(*find_object(objects, "/"), "model_config"), "<absent>");
}

TEST(KerasH5Write, LongFixedLengthListsAreSplitAsKerasSplitsThem) {
  TempDir dir;
  KerasH5Contents c;
  c.weights_only = true;
  for (int i = 0; i < 1300; ++i) {
    c.layers.push_back({str_cat("layer_with_a_rather_long_name_to_fill_the_header_", 1000 + i)});
  }
  write_keras_h5(dir.file("many.h5"), c, {.fixed_length_strings = true});
  const auto objects = list_h5_objects(dir.file("many.h5"));
  const H5ObjectInfo* root = find_object(objects, "/");
  EXPECT_EQ(attribute_type(*root, "layer_names"), "<absent>");
  EXPECT_EQ(attribute_type(*root, "layer_names0"), "fixed string(53, nullpad)[650]");
  EXPECT_EQ(attribute_type(*root, "layer_names1"), "fixed string(53, nullpad)[650]");
  const KerasH5Contents back = read_keras_h5(dir.file("many.h5"));
  ASSERT_EQ(back.layers.size(), 1300u);
  for (size_t i = 0; i < back.layers.size(); ++i) EXPECT_EQ(back.layers[i].name, c.layers[i].name);
}

TEST(KerasH5Write, ReplacesAnExistingFileWhole) {
  TempDir dir;
  write_keras_h5(dir.file("m.h5"), sample_contents());
  KerasH5Contents second = sample_contents();
  second.layers.pop_back();
  write_keras_h5(dir.file("m.h5"), second);
  expect_same_contents(read_keras_h5(dir.file("m.h5")), second);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.h5"});
}

TEST(KerasH5Write, AFailedWriteLeavesTheOldFileAndNoTemporaryFile) {
  TempDir dir;
  write_keras_h5(dir.file("m.h5"), sample_contents());
  const std::string before = read_bytes(dir.file("m.h5"));
  KerasH5Contents bad = sample_contents();
  Tensor flags(DType::kBool, Shape{3});
  bad.layers.push_back({"dense_2", {{"dense_2/flags:0", flags}}});
  const std::string msg =
      expect_throws<UnimplementedError>([&] { write_keras_h5(dir.file("m.h5"), bad); });
  EXPECT_NE(msg.find("dense_2/flags:0"), std::string::npos) << msg;
  EXPECT_EQ(read_bytes(dir.file("m.h5")), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.h5"});
}

// A real I/O failure in the middle of the write: a child process whose file-size limit is
// smaller than the file. The old file must stay intact and no temporary file may remain.
TEST(KerasH5Write, DiskFullMidwayLeavesTheOldFileIntact) {
  TempDir dir;
  const std::string path = dir.file("big.h5");
  write_keras_h5(path, sample_contents());
  const std::string before = read_bytes(path);
  KerasH5Contents big = sample_contents();
  big.layers.push_back({"dense_2", {{"dense_2/kernel:0", Tensor::zeros(Shape{512, 512})}}});

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing us
    struct rlimit limit {
      256 * 1024, 256 * 1024
    };
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int code = 3;
    try {
      write_keras_h5(path, big);
      code = 1;  // should not have succeeded
    } catch (const ResourceExhaustedError&) {
      code = 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "unexpected: %s\n", e.what());
      code = 2;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the write succeeded; 2: wrong error type";
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"big.h5"});
  expect_same_contents(read_keras_h5(path), sample_contents());
}

TEST(KerasH5Write, RejectsWhatKerasCouldNotReadBack) {
  TempDir dir;
  KerasH5Contents dup = sample_contents();
  dup.layers.push_back(dup.layers[1]);
  std::string msg =
      expect_throws<InvalidArgumentError>([&] { write_keras_h5(dir.file("a.h5"), dup); });
  EXPECT_NE(msg.find("two layers are named 'dense'"), std::string::npos) << msg;
  KerasH5Contents dup_weight = sample_contents();
  dup_weight.layers[1].weights.push_back(dup_weight.layers[1].weights[0]);
  msg = expect_throws<InvalidArgumentError>([&] { write_keras_h5(dir.file("a.h5"), dup_weight); });
  EXPECT_NE(msg.find("dense/kernel:0"), std::string::npos) << msg;
  msg = expect_throws<NotFoundError>(
      [&] { write_keras_h5(dir.file("no/such/dir/a.h5"), sample_contents()); });
  EXPECT_NE(msg.find("no/such/dir"), std::string::npos) << msg;
  EXPECT_TRUE(dir.entries().empty());
}

// --- Reading errors -----------------------------------------------------------------------------

TEST(KerasH5Read, MissingFileIsNotFoundNamingThePath) {
  TempDir dir;
  const std::string msg =
      expect_throws<NotFoundError>([&] { read_keras_h5(dir.file("missing.h5")); });
  EXPECT_NE(msg.find(dir.file("missing.h5")), std::string::npos) << msg;
}

TEST(KerasH5Read, TruncatedFileIsDataLossNamingTheFile) {
  TempDir dir;
  const std::string bytes = read_bytes(kKerasFixture);
  for (size_t keep : {bytes.size() / 2, bytes.size() - 1, size_t{4096}}) {
    write_bytes(dir.file("cut.h5"), bytes.substr(0, keep));
    const std::string msg =
        expect_throws<DataLossError>([&] { read_keras_h5(dir.file("cut.h5")); });
    EXPECT_NE(msg.find(dir.file("cut.h5")), std::string::npos) << msg;
  }
}

TEST(KerasH5Read, EmptyGarbageAndSignatureOnlyFilesAreDataLoss) {
  TempDir dir;
  write_bytes(dir.file("empty.h5"), "");
  write_bytes(dir.file("text.h5"), "this is not an HDF5 file at all, just text\n");
  write_bytes(dir.file("sig.h5"), std::string("\x89HDF\r\n\x1a\n", 8) + std::string(600, '\0'));
  for (const char* name : {"empty.h5", "text.h5", "sig.h5"}) {
    const std::string msg = expect_throws<DataLossError>([&] { read_keras_h5(dir.file(name)); });
    EXPECT_NE(msg.find(dir.file(name)), std::string::npos) << msg;
  }
  EXPECT_FALSE(is_hdf5_file(dir.file("text.h5")));
  EXPECT_FALSE(is_hdf5_file(dir.file("missing.h5")));
  EXPECT_TRUE(is_hdf5_file(kKerasFixture));
}

TEST(KerasH5Read, CorruptMetadataIsDataLossNamingTheFile) {
  // 64 bytes of 0xff over the fixture's object headers (the superblock's root group, a symbol
  // table node, a dataset header, ...) at offsets where each damage hits metadata. HDF5 has no
  // checksums in this (Keras's default, earliest) file format version, so damage to raw data
  // would go unnoticed; damage to structure must be a DataLossError naming the file.
  TempDir dir;
  const std::string bytes = read_bytes(kKerasFixture);
  for (size_t at : {size_t{96}, size_t{4192}, size_t{7264}, size_t{7776}}) {
    std::string damaged = bytes;
    for (size_t i = at; i < at + 64; ++i) damaged[i] = '\xff';
    write_bytes(dir.file("bad.h5"), damaged);
    const std::string msg =
        expect_throws<DataLossError>([&] { read_keras_h5(dir.file("bad.h5")); });
    EXPECT_NE(msg.find(dir.file("bad.h5")), std::string::npos) << msg;
  }
}

// A weights-only file with one float32 dataset of shape [`elements`], whose dimension is then
// overwritten in the file's bytes (the dataspace and any copy of it) to claim `claimed`
// elements: a header that lies about the size of its data.
std::string write_lying_dataset(const TempDir& dir, int64_t elements, uint64_t claimed) {
  const std::string path = dir.file("lying.h5");
  KerasH5Contents c;
  c.weights_only = true;
  std::vector<float> v(static_cast<size_t>(elements), 0.5f);
  c.layers.push_back({"dense", {{"dense/kernel:0", Tensor::from_vector<float>(v, {elements})}}});
  write_keras_h5(path, c);
  std::string bytes = read_bytes(path);
  const uint64_t from = static_cast<uint64_t>(elements);
  const std::string old_dim(reinterpret_cast<const char*>(&from), 8);
  const std::string new_dim(reinterpret_cast<const char*>(&claimed), 8);
  int patched = 0;
  for (size_t at = bytes.find(old_dim); at != std::string::npos; at = bytes.find(old_dim, at)) {
    bytes.replace(at, 8, new_dim);
    ++patched;
  }
  EXPECT_GE(patched, 1) << "the dimension was not found in the file";
  write_bytes(path, bytes);
  return path;
}

TEST(KerasH5Read, ADatasetClaimingMoreBytesThanTheFileIsDataLossBeforeAllocating) {
  // 512 GB of float32 claimed by a file of 300 KB: refused naming the file, the dataset
  // and the size, without trying to allocate it.
  TempDir dir;
  const std::string path = write_lying_dataset(dir, 77777, uint64_t{1} << 37);
  const std::string msg = expect_throws<DataLossError>([&] { read_keras_h5(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("dense/kernel:0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("549755813888 bytes"), std::string::npos) << msg;
}

// --- Names --------------------------------------------------------------------------------------

TEST(KerasH5Names, PathsAndWeightNames) {
  EXPECT_TRUE(is_keras_h5_path("x.h5"));
  EXPECT_TRUE(is_keras_h5_path("dir/x.hdf5"));
  EXPECT_TRUE(is_keras_h5_path("x.keras"));
  EXPECT_FALSE(is_keras_h5_path("ckpt/model"));
  EXPECT_FALSE(is_keras_h5_path("model.h5/ckpt"));
  EXPECT_FALSE(is_keras_h5_path(".h5"));
  EXPECT_EQ(keras_weight_name("dense/kernel"), "dense/kernel:0");
  EXPECT_EQ(keras_weight_name("dense/kernel:1"), "dense/kernel:1");
  EXPECT_EQ(strip_weight_suffix("dense/kernel:0"), "dense/kernel");
  EXPECT_EQ(strip_weight_suffix("Adam/iter"), "Adam/iter");
}

}  // namespace
}  // namespace dtrain::checkpoint
