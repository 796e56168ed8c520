// EventLog: one compact JSON object per line, appended whole by several threads; a torn last line
// is ignored on read.
#include "dtrain/summary/event_log.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "testutil/temp_dir.h"

namespace dtrain::summary {
namespace {

namespace fs = std::filesystem;

class EventLogTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testutil::make_temp_dir("dtrain_event_log_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(EventLogTest, AppendsOneCompactObjectPerLine) {
  const std::string path = dir_ + "/logs/events.jsonl";
  {
    EventLog log(path, {.fsync = true});
    log.append(R"({"event": "failure", "worker": 1, "signal": 9, "step": 1234})");
    log.append(R"({"event":"restart","lost_steps":34,"lost_seconds":1.8})");
  }
  EventLog again(path);  // appends, does not truncate
  again.append(R"({"event": "recovered", "checkpoint": "ckpt-12"})");
  EXPECT_EQ(read_file(path),
            "{\"event\":\"failure\",\"signal\":9,\"step\":1234,\"worker\":1}\n"
            "{\"event\":\"restart\",\"lost_seconds\":1.8,\"lost_steps\":34}\n"
            "{\"checkpoint\":\"ckpt-12\",\"event\":\"recovered\"}\n");
  EXPECT_EQ(read_event_log(path).size(), 3u);
}

TEST_F(EventLogTest, RejectsWhatIsNotOneObject) {
  EventLog log(dir_ + "/l.jsonl");
  EXPECT_THROW(log.append("[1, 2]"), InvalidArgumentError);
  EXPECT_THROW(log.append("{\"a\": "), InvalidArgumentError);
  EXPECT_THROW(log.append("{} {}"), InvalidArgumentError);
  EXPECT_EQ(read_file(dir_ + "/l.jsonl"), "");
}

TEST_F(EventLogTest, ConcurrentAppendsStayWholeLines) {
  const std::string path = dir_ + "/c.jsonl";
  EventLog log(path);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&log, t] {
      for (int i = 0; i < 200; ++i) {
        log.append(nlohmann::json{{"t", t}, {"i", i}, {"pad", std::string(300, 'x')}}.dump());
      }
    });
  }
  for (auto& th : threads) th.join();
  const std::vector<std::string> lines = read_event_log(path);
  ASSERT_EQ(lines.size(), 800u);
  std::set<std::pair<int, int>> seen;
  for (const std::string& l : lines) {
    const auto j = nlohmann::json::parse(l);
    seen.insert({j["t"].get<int>(), j["i"].get<int>()});
  }
  EXPECT_EQ(seen.size(), 800u);
}

TEST_F(EventLogTest, TornLastLineIsIgnoredAndBadLineIsDataLoss) {
  const std::string path = dir_ + "/t.jsonl";
  { std::ofstream(path) << "{\"a\":1}\n{\"b\":"; }
  EXPECT_EQ(read_event_log(path), (std::vector<std::string>{"{\"a\":1}"}));
  { std::ofstream(path) << "{\"a\":1}\nnot json\n"; }
  try {
    read_event_log(path);
    FAIL();
  } catch (const DataLossError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_event_log(dir_ + "/missing"), NotFoundError);
}

}  // namespace
}  // namespace dtrain::summary
