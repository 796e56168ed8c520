// SummaryWriter: file name, first record, exact round trips of scalars/text/histograms, the TF2
// scalar encoding of the real fixture, buffering and background flush, concurrent writers.
#include "dtrain/summary/summary_writer.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/summary/event_reader.h"
#include "dtrain/summary/record.h"
#include "testutil/temp_dir.h"

namespace dtrain::summary {
namespace {

namespace fs = std::filesystem;

class SummaryWriterTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testutil::make_temp_dir("dtrain_summary_writer_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(SummaryWriterTest, FileNameFollowsTensorFlow) {
  const auto before = std::time(nullptr);
  SummaryWriter a(dir_ + "/run/train");
  SummaryWriter b(dir_ + "/run/train", {.filename_suffix = ".worker-1"});
  const auto after = std::time(nullptr);
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  const std::regex pattern(R"(events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)\.v2(.*))");
  std::smatch ma, mb;
  const std::string na = fs::path(a.path()).filename().string();
  const std::string nb = fs::path(b.path()).filename().string();
  ASSERT_TRUE(std::regex_match(na, ma, pattern)) << na;
  ASSERT_TRUE(std::regex_match(nb, mb, pattern)) << nb;
  EXPECT_EQ(fs::path(a.path()).parent_path(), fs::path(dir_ + "/run/train"));
  EXPECT_GE(std::stoll(ma[1]), before);
  EXPECT_LE(std::stoll(ma[1]), after);
  EXPECT_EQ(ma[2], host);
  EXPECT_EQ(std::stol(ma[3]), getpid());
  EXPECT_EQ(ma[5], "");
  EXPECT_EQ(mb[5], ".worker-1");
  EXPECT_NE(ma[4], mb[4]);  // the counter keeps two writers of one second apart
  EXPECT_NE(na.find("tfevents"), std::string::npos);  // what TensorBoard looks for
}

TEST_F(SummaryWriterTest, FirstRecordIsFileVersionAndIsOnDiskAtOnce) {
  SummaryWriter w(dir_);
  const std::vector<Event> events = read_events(w.path());  // before any flush()
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, EventKind::kFileVersion);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[0].step, 0);
  const std::string name = fs::path(w.path()).filename().string();
  EXPECT_EQ(events[0].wall_time,
            std::stod(name.substr(std::string("events.out.tfevents.").size(), 10)));
}

TEST_F(SummaryWriterTest, ScalarsTextAndHistogramsRoundTripExactly) {
  std::string path;
  const double t0 = wall_time_now();
  {
    SummaryWriter w(dir_);
    path = w.path();
    w.scalar("loss", 0.125, 1);
    w.scalar("epoch_accuracy", 0.1, 2);  // stored as float32, as TF does
    w.scalar("steps_per_sec", 1e30, 1LL << 40);
    w.text("failures", "worker 1 exited on signal 9 at step 1234; **restarted**", 1234);
    const std::vector<double> xs = {0, 1, 1, 2, 3, 3, 3, 4};
    w.histogram("weights", xs, 5, 4);
    w.session_log(SessionStatus::kStart, 1200, "resumed", "ckpt-12");
  }  // destructor flushes and closes
  EventReader r(path);
  ASSERT_TRUE(r.next().has_value());  // file_version
  auto e = r.next();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->step, 1);
  EXPECT_GE(e->wall_time, t0 - 1e-3);
  EXPECT_LE(e->wall_time, wall_time_now());
  ASSERT_EQ(e->values.size(), 1u);
  EXPECT_EQ(e->values[0].tag, "loss");
  EXPECT_EQ(e->values[0].value, 0.125);
  EXPECT_EQ(e->values[0].dtype, DType::kFloat32);
  EXPECT_TRUE(e->values[0].shape.empty());
  EXPECT_EQ(e->values[0].metadata.plugin_name, "scalars");
  EXPECT_EQ(e->values[0].metadata.data_class, DataClass::kScalar);
  e = r.next();
  EXPECT_EQ(e->values[0].tag, "epoch_accuracy");
  EXPECT_EQ(e->values[0].value, static_cast<double>(0.1f));
  e = r.next();
  EXPECT_EQ(e->step, 1LL << 40);
  EXPECT_EQ(e->values[0].value, static_cast<double>(1e30f));
  e = r.next();
  EXPECT_EQ(e->step, 1234);
  EXPECT_EQ(e->values[0].tag, "failures");
  EXPECT_EQ(e->values[0].metadata.plugin_name, "text");
  EXPECT_EQ(e->values[0].metadata.data_class, DataClass::kTensor);
  EXPECT_EQ(e->values[0].dtype, DType::kString);
  EXPECT_TRUE(e->values[0].shape.empty());
  EXPECT_EQ(e->values[0].text(), "worker 1 exited on signal 9 at step 1234; **restarted**");
  e = r.next();
  EXPECT_EQ(e->values[0].metadata.plugin_name, "histograms");
  EXPECT_EQ(e->values[0].dtype, DType::kFloat64);
  EXPECT_EQ(e->values[0].shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(e->values[0].numbers, (std::vector<double>{0, 1, 1, 1, 2, 2, 2, 3, 1, 3, 4, 4}));
  e = r.next();
  EXPECT_EQ(e->kind, EventKind::kSessionLog);
  EXPECT_EQ(e->session_status, SessionStatus::kStart);
  EXPECT_EQ(e->checkpoint_path, "ckpt-12");
  EXPECT_EQ(e->step, 1200);
  EXPECT_FALSE(r.next());
  EXPECT_FALSE(r.truncated());
}

TEST_F(SummaryWriterTest, ScalarEncodingMatchesTheTf2Fixture) {
  // Our scalar() differs from TF 2.1's only in data_class (newer TensorBoard writers add
  // DATA_CLASS_SCALAR) and wall_time.
  const std::string fixture = std::string(DTRAIN_SOURCE_DIR) +
                              "/../shared/fixtures/tensorboard/go_tb_my_metric.v2.tfevents";
  const std::vector<Event> tf = read_events(fixture);
  ASSERT_EQ(tf.size(), 101u);
  std::string path;
  {
    SummaryWriter w(dir_);
    path = w.path();
    for (int step = 0; step < 100; ++step) w.scalar("my_metric", 0.5 * step, step);
  }
  RecordReader r(path);
  std::string data;
  ASSERT_TRUE(r.read(&data));
  for (int step = 0; step < 100; ++step) {
    ASSERT_TRUE(r.read(&data));
    Event ours = decode_event(data);
    ASSERT_EQ(ours.values.size(), 1u);
    EXPECT_EQ(ours.values[0].metadata.data_class, DataClass::kScalar);
    ours.values[0].metadata.data_class = DataClass::kUnknown;
    ours.wall_time = tf[step + 1].wall_time;
    RecordReader fr(fixture);
    std::string tf_data;
    for (int i = 0; i <= step + 1; ++i) ASSERT_TRUE(fr.read(&tf_data));
    EXPECT_EQ(encode_event(ours), tf_data) << "step " << step;
  }
}

TEST_F(SummaryWriterTest, BuffersUntilFlushOrMaxQueue) {
  SummaryWriter w(dir_, {.flush_secs = 3600, .max_queue = 5, .fsync = false});
  for (int i = 0; i < 4; ++i) w.scalar("x", i, i);
  EXPECT_EQ(read_events(w.path()).size(), 1u);  // only file_version is on disk
  w.scalar("x", 4, 4);                          // the fifth event reaches max_queue
  EXPECT_EQ(read_events(w.path()).size(), 6u);
  w.text("t", "hello", 5);
  EXPECT_EQ(read_events(w.path()).size(), 6u);
  w.flush();
  EXPECT_EQ(read_events(w.path()).size(), 7u);
  w.close();
  w.close();  // idempotent
  EXPECT_THROW(w.scalar("x", 1, 1), FailedPreconditionError);
  EXPECT_THROW(w.flush(), FailedPreconditionError);
}

TEST_F(SummaryWriterTest, BackgroundThreadFlushesAfterFlushSecs) {
  SummaryWriter w(dir_, {.flush_secs = 0.05, .max_queue = 1000, .fsync = false});
  w.scalar("x", 1, 1);
  // The flush thread must write it without another call; wait up to 10 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (read_events(w.path()).size() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(read_events(w.path()).size(), 2u);
}

TEST_F(SummaryWriterTest, ConcurrentScalarsAreAllWrittenIntact) {
  constexpr int kThreads = 8, kPerThread = 500;
  std::string path;
  {
    SummaryWriter w(dir_, {.max_queue = 7, .fsync = false});
    path = w.path();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&w, t] {
        const std::string tag = "thread_" + std::to_string(t);
        for (int i = 0; i < kPerThread; ++i) {
          w.scalar(tag, t * 1000 + i, i);
          if (i % 97 == 0) w.flush();
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  EventReader r(path);
  ASSERT_EQ(r.next()->kind, EventKind::kFileVersion);
  std::map<std::string, std::vector<int64_t>> steps;
  while (auto e = r.next()) {
    ASSERT_EQ(e->values.size(), 1u);
    const SummaryValue& v = e->values[0];
    const int t = std::stoi(v.tag.substr(7));
    EXPECT_EQ(v.value, t * 1000 + e->step) << v.tag;
    steps[v.tag].push_back(e->step);
  }
  EXPECT_FALSE(r.truncated());
  ASSERT_EQ(steps.size(), static_cast<size_t>(kThreads));
  for (const auto& [tag, s] : steps) {
    ASSERT_EQ(s.size(), static_cast<size_t>(kPerThread)) << tag;
    for (int i = 0; i < kPerThread; ++i) EXPECT_EQ(s[i], i) << tag;  // per-thread order kept
  }
}

TEST_F(SummaryWriterTest, ErrorsNameThePath) {
  const std::string file = dir_ + "/plain_file";
  { std::ofstream(file) << "x"; }
  try {
    SummaryWriter w(file + "/logs");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
  EXPECT_THROW(SummaryWriter(dir_, {.flush_secs = 0}), InvalidArgumentError);
  SummaryWriter w(dir_);
  EXPECT_THROW(w.histogram("h", std::vector<double>{1.0}, 0, 0), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::summary
