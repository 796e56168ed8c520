// KeyValueStore implementations (in-memory, prefix, Gloo's FileStore, Gloo's RedisStore against
// a real redis-server on loopback, the etcd store against a real etcd on loopback), URL parsing
// and rendezvous generations.
#include "dtrain/distribute/rendezvous.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "dtrain/core/error.h"
#include "dtrain/distribute/collectives.h"
#include "testutil/etcd_server.h"
#include "testutil/free_port.h"

namespace dtrain::distribute {
namespace {

using namespace std::chrono_literals;

// The same contract for every store.
void exercise_store(KeyValueStore& s) {
  s.set("a", "1");
  s.set("a", "two");  // overwrite
  EXPECT_EQ(s.get("a", 1s), "two");
  s.set("empty", "");
  EXPECT_EQ(s.get("empty", 1s), "");
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(s.add("n", -2), 3);
  EXPECT_EQ(s.get("n", 1s), "3");
  EXPECT_THROW(s.add("a", 1), InvalidArgumentError);
  const std::string both[] = {"a", "n"}, missing[] = {"a", "nope"};
  EXPECT_TRUE(s.check(both));
  EXPECT_FALSE(s.check(missing));
  EXPECT_THROW(s.wait(missing, 50ms), DeadlineExceededError);
  try {
    s.get("nope", 50ms);
    FAIL();
  } catch (const DeadlineExceededError& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
  std::thread late([&] {
    std::this_thread::sleep_for(30ms);
    s.set("late", std::string("x\0y", 3));
  });
  EXPECT_EQ(s.get("late", 5s), std::string("x\0y", 3));
  late.join();
  PrefixKeyValueStore p(std::shared_ptr<KeyValueStore>(&s, [](KeyValueStore*) {}), "g1/");
  p.set("a", "prefixed");
  EXPECT_EQ(s.get("g1/a", 1s), "prefixed");
  EXPECT_EQ(s.get("a", 1s), "two");
}

TEST(KeyValueStoreTest, InMemory) {
  InMemoryKeyValueStore s;
  exercise_store(s);
}

TEST(KeyValueStoreTest, FileStoreOnADirectory) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("dtrain_fs_" + std::to_string(getpid()));
  auto s = open_store("file://" + dir.string() + "/sub");
  EXPECT_EQ(s->describe(), "file://" + dir.string() + "/sub");
  exercise_store(*s);
  std::filesystem::remove_all(dir);
}

class RedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists("/usr/bin/redis-server")) GTEST_SKIP() << "no redis-server";
    port_ = 20000 + getpid() % 20000;
    pid_ = fork();
    if (pid_ == 0) {
      execl("/usr/bin/redis-server", "redis-server", "--port", std::to_string(port_).c_str(),
            "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 200 && !store_; ++i) {
      try {
        store_ = open_store("redis://127.0.0.1:" + std::to_string(port_));
      } catch (const UnavailableError&) {
        std::this_thread::sleep_for(10ms);
      }
    }
    ASSERT_TRUE(store_) << "redis-server did not start on port " << port_;
  }
  void TearDown() override {
    store_.reset();
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port_ = 0;
  pid_t pid_ = -1;
  std::shared_ptr<KeyValueStore> store_;
};

TEST_F(RedisTest, StoreContract) { exercise_store(*store_); }

TEST_F(RedisTest, CollectivesRendezvousThroughRedis) {
  std::vector<std::thread> ts;
  std::vector<double> sums(3);
  for (int r = 0; r < 3; ++r) {
    ts.emplace_back([&, r] {
      auto c = Collectives::connect(open_store("redis://127.0.0.1:" + std::to_string(port_)),
                                    {.rank = r, .world_size = 3, .timeout = 10s});
      sums[r] = c->all_reduce_scalar(r + 1, ReduceOp::kSum);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(sums, std::vector<double>(3, 6.0));
}

// A real etcd on 127.0.0.1 (free ports, a private data directory), one per test.
class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testutil::have_etcd()) {
      GTEST_SKIP() << "no " << testutil::kEtcdBinary << " (Debian package etcd-server)";
    }
    etcd_ = std::make_unique<testutil::EtcdServer>();
    try {
      store_ = open_store(etcd_->url());
    } catch (const Error& e) {
      FAIL() << e.what() << "\netcd's log:\n" << etcd_->log();
    }
  }
  std::unique_ptr<testutil::EtcdServer> etcd_;
  std::shared_ptr<KeyValueStore> store_;
};

TEST_F(EtcdTest, StoreContract) {
  EXPECT_EQ(store_->describe(), etcd_->url());
  exercise_store(*store_);
}

TEST_F(EtcdTest, AddIsAtomicAcrossClients) {
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      auto mine = open_store(etcd_->url());  // its own connection
      for (int i = 0; i < 25; ++i) mine->add("counter", 1);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(store_->get("counter", 1s), "100");
}

TEST_F(EtcdTest, CollectivesRendezvousThroughEtcd) {
  std::vector<std::thread> ts;
  std::vector<double> sums(3);
  for (int r = 0; r < 3; ++r) {
    ts.emplace_back([&, r] {
      auto c = Collectives::connect(open_store(etcd_->url()),
                                    {.rank = r, .world_size = 3, .timeout = 20s});
      sums[r] = c->all_reduce_scalar(r + 1, ReduceOp::kSum);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(sums, std::vector<double>(3, 6.0));
}

// The first endpoint has nothing listening: calls go to the next one.
TEST_F(EtcdTest, FailsOverToTheNextEndpoint) {
  const std::string dead = "127.0.0.1:" + std::to_string(testutil::free_port());
  auto s = open_store("etcd://" + dead + "," + etcd_->endpoint() + "/");
  EXPECT_EQ(s->describe(), "etcd://" + dead + "," + etcd_->endpoint());
  s->set("k", "v");
  EXPECT_EQ(store_->get("k", 1s), "v");
  EXPECT_EQ(s->add("n", 2), 2);
}

// No etcd at any endpoint: UnavailableError naming each, after the connect timeout, not a hang.
TEST(OpenStoreTest, UnreachableEtcdIsUnavailableNamingTheEndpoints) {
  const std::string a = "127.0.0.1:" + std::to_string(testutil::free_port());
  const std::string b = "localhost:" + std::to_string(testutil::free_port());
  try {
    open_store("etcd://" + a + "," + b);
    FAIL() << "connected to nothing";
  } catch (const UnavailableError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(a + ":"), std::string::npos) << what;
    EXPECT_NE(what.find(b + ":"), std::string::npos) << what;
  }
}

TEST(OpenStoreTest, MalformedUrlsAreNamed) {
  for (const char* url :
       {"redis", "host:x", "ftp://x", "file://", "redis://:6379", "redis://h:port",
        "redis://h:70000", "redis://[::1", "etcd://", "etcd:///", "etcd://h:x", "etcd://h:1,,h:2",
        "etcd://h:1,:2", "etcd://[::1:2379", "etcd://h:0"}) {
    try {
      open_store(url);
      FAIL() << url;
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + url + "'"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(open_store("redis://127.0.0.1:1"), UnavailableError);
  EXPECT_EQ(open_store("memory://x"), open_store("memory://x"));
}

TEST(RendezvousTest, ConsecutiveRunsOnOneStoreGetFreshGenerations) {
  auto store = std::make_shared<InMemoryKeyValueStore>();
  for (int run = 0; run < 3; ++run) {
    std::vector<RendezvousResult> results(2);
    std::thread other([&] { results[1] = rendezvous(store, {.rank = 1, .world_size = 2}); });
    results[0] = rendezvous(store, {.rank = 0, .world_size = 2, .host = "h0", .task = "chief:0"});
    other.join();
    EXPECT_EQ(results[0].generation, run);
    EXPECT_EQ(results[1].generation, run);
    EXPECT_EQ(results[1].peers[0].host, "h0");
    EXPECT_EQ(results[1].peers[0].task, "chief:0");
    EXPECT_EQ(results[0].peers[1].pid, getpid());
  }
  EXPECT_THROW(rendezvous(store, {.rank = 2, .world_size = 2}), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::distribute
