// The shared-memory transport of Collectives: bit for bit what the Gloo path gives (2, 3 and 4
// ranks, odd sizes, windows, ordered pieces, gathers, scattered gathers), every worker must agree
// to use it, no segment outlives its setup, and a peer that leaves or is killed mid-collective
// fails the survivors with UnavailableError naming it (real processes), after which a new
// generation works.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <thread>

#include "distribute/shm_transport.h"
#include "dtrain/core/error.h"
#include "dtrain/distribute/collectives.h"
#include "dtrain/distribute/key_value_store.h"
#include "dtrain/distribute/rendezvous.h"
#include "testutil/ranks.h"
#include "testutil/temp_dir.h"

namespace dtrain::distribute {
namespace {

using namespace std::chrono_literals;
using testutil::run_ranks;

// Values of many magnitudes and both signs, so that the order of additions shows in the bits.
std::vector<float> random_floats(uint32_t seed, size_t n) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-12, 12);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(u(gen), e(gen));
  return v;
}

std::vector<double> random_doubles(uint32_t seed, size_t n) {
  std::vector<double> v(n);
  const std::vector<float> f = random_floats(seed, n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<double>(f[i]) * (1.0 + 1e-9 * i);
  return v;
}

// Bytes of everything one rank ends up with, in a fixed order.
using Bytes = std::vector<char>;
template <class T>
void append(Bytes& out, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const char*>(v.data());
  out.insert(out.end(), p, p + v.size() * sizeof(T));
}

// Every collective the shared-memory path takes over, on random data; returns each rank's bytes.
// `used`: one int per rank (not vector<bool>, whose bits share words the rank threads would
// write concurrently).
std::vector<Bytes> run_everything(int n, bool shared_memory, std::vector<int>* used) {
  std::vector<Bytes> out(n);
  used->assign(n, 0);
  run_ranks(n,
            [&](int r, Collectives& c) {
              (*used)[r] = c.uses_shared_memory();
              Bytes& mine = out[r];
              // Small tensors packed into buckets, a double bucket, an int32 one, and tensors
              // bigger than a bucket and than a window (reduced in place, several windows).
              const std::vector<int64_t> sizes = {1, 7, 33, 1001, 4097, 70001, 3};
              for (int step = 0; step < 2; ++step) {
                std::vector<Tensor> ts;
                for (size_t k = 0; k < sizes.size(); ++k) {
                  ts.push_back(Tensor::from_vector(
                      random_floats(1000 * r + 10 * k + step, static_cast<size_t>(sizes[k])),
                      {sizes[k]}));
                }
                ts.push_back(Tensor::from_vector(random_doubles(7 + r, 999), {999}));
                if (step == 0)
                  ts.push_back(Tensor::from_vector<int32_t>({r, -3 * r, 1 << 20}, {3}));
                c.all_reduce(ts, step == 0 ? ReduceOp::kSum : ReduceOp::kMean);
                for (size_t k = 0; k < sizes.size(); ++k) append(mine, ts[k].to_vector<float>());
                append(mine, ts[sizes.size()].to_vector<double>());
                if (step == 0) append(mine, ts.back().to_vector<int32_t>());
              }
              // Ordered pieces: odd counts, every owner, some kept by one worker, some without
              // input, some summed in place (kept by one worker or by all).
              for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
                std::mt19937 gen(99);  // the same pieces on every rank
                std::vector<std::vector<double>> src, dst;
                std::vector<OrderedPiece> pieces;
                for (int i = 0; i < 23; ++i) {
                  const size_t count = std::uniform_int_distribution<size_t>(0, 9000)(gen);
                  const int owner = std::uniform_int_distribution<int>(0, n - 1)(gen);
                  const int keep = std::uniform_int_distribution<int>(-2, n - 1)(gen);
                  const bool no_input = i % 7 == 3;
                  src.push_back(random_doubles(50 * r + i, count));
                  if (dtype == DType::kFloat32) {
                    std::vector<float> f(src.back().begin(), src.back().end());
                    std::memcpy(src.back().data(), f.data(), f.size() * sizeof(float));
                  }
                  const bool has_output = keep < 0 || keep == r;
                  const bool in_place = i % 5 == 1 && !no_input && has_output;
                  dst.emplace_back(has_output && !in_place ? count : 0, -1.0);
                  pieces.push_back({.src = no_input ? nullptr : src.back().data(),
                                    .dst = in_place     ? src.back().data()
                                           : has_output ? dst.back().data()
                                                        : nullptr,
                                    .count = count,
                                    .owner = owner,
                                    .keep = std::max(keep, -1)});
                }
                c.all_reduce_in_order(pieces, dtype, 0);
                for (size_t i = 0; i < pieces.size(); ++i) {
                  if (pieces[i].dst == nullptr) continue;
                  const auto* p = static_cast<const char*>(pieces[i].dst);
                  mine.insert(mine.end(), p, p + pieces[i].count * dtype_size(dtype));
                }
              }
              // Gathers of odd sizes (one rank contributes nothing), larger than a window.
              std::vector<size_t> bytes(n);
              for (int k = 0; k < n; ++k) bytes[k] = k == 1 ? 0 : 13 + 70001 * k;
              size_t total = 0;
              for (size_t b : bytes) total += b;
              std::vector<char> local(bytes[r]), all(total, 0);
              for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<char>(i * 31 + r);
              c.all_gather_v(local.data(), all.data(), bytes);
              mine.insert(mine.end(), all.begin(), all.end());
              // The same gather scattered over odd ranges (one empty): the same bytes.
              std::vector<char> scattered(total, 0);
              const size_t cut1 = std::min<size_t>(total, 5), cut2 = std::min(total, total / 2 + 3);
              const std::vector<std::span<std::byte>> ranges = {
                  {reinterpret_cast<std::byte*>(scattered.data()), cut1},
                  {reinterpret_cast<std::byte*>(scattered.data()) + cut1, 0},
                  {reinterpret_cast<std::byte*>(scattered.data()) + cut1, cut2 - cut1},
                  {reinterpret_cast<std::byte*>(scattered.data()) + cut2, total - cut2}};
              c.all_gather_v(local.data(), ranges, bytes);
              EXPECT_EQ(scattered, all) << "rank " << r;
              mine.insert(mine.end(), scattered.begin(), scattered.end());
              Tensor one = Tensor::from_vector<int64_t>({r, 7 * r + 1}, {2});
              Tensor gathered(DType::kInt64, {n, 2});
              c.all_gather(one, gathered);
              append(mine, gathered.to_vector<int64_t>());
              std::vector<Tensor> vars{Tensor::from_vector(random_floats(r, 5), {5}),
                                       Tensor::from_vector(random_floats(r + 40, 90001), {90001})};
              c.broadcast(vars, n - 1);
              for (const Tensor& v : vars) append(mine, v.to_vector<float>());
              append(mine,
                     std::vector<double>{c.all_reduce_scalar(0.1 * (r + 1), ReduceOp::kMean)});
              c.barrier();
            },
            {.timeout = 60s, .bucket_bytes = 4096, .shared_memory = shared_memory});
  return out;
}

class ShmBitwiseTest : public ::testing::TestWithParam<int> {};

TEST_P(ShmBitwiseTest, EveryCollectiveGivesGloosBits) {
  const int n = GetParam();
  std::vector<int> gloo_used, shm_used;
  const std::vector<Bytes> gloo = run_everything(n, false, &gloo_used);
  const std::vector<Bytes> shm = run_everything(n, true, &shm_used);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(gloo_used[r], 0);
    EXPECT_EQ(shm_used[r], 1) << "rank " << r << " did not use shared memory";
    ASSERT_EQ(gloo[r].size(), shm[r].size());
    size_t first = 0;
    while (first < gloo[r].size() && gloo[r][first] == shm[r][first]) ++first;
    EXPECT_EQ(first, gloo[r].size())
        << "rank " << r << ": first differing byte " << first << " of " << gloo[r].size();
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmBitwiseTest, ::testing::Values(2, 3, 4));

TEST(ShmCollectivesTest, EveryWorkerMustAgree) {
  // One worker that says no keeps the whole generation on Gloo, and the collectives still work.
  auto store = std::make_shared<InMemoryKeyValueStore>();
  std::vector<int> used(2, -1);
  std::vector<float> sums(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = Collectives::connect(
          store, {.rank = r, .world_size = 2, .timeout = 30s, .shared_memory = r == 0});
      used[r] = c->uses_shared_memory();
      std::vector<Tensor> ts{Tensor::full({3}, r + 1.0)};
      c->all_reduce(ts, ReduceOp::kSum);
      sums[r] = ts[0].to_vector<float>()[0];
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(used, (std::vector<int>{0, 0}));
  EXPECT_EQ(sums, (std::vector<float>{3.0f, 3.0f}));
  // The environment's opt-out.
  setenv("DTRAIN_SHM_COLLECTIVES", "0", 1);
  run_ranks(2, [](int, Collectives& c) { EXPECT_FALSE(c.uses_shared_memory()); });
  unsetenv("DTRAIN_SHM_COLLECTIVES");
  // How long waits spin: any value gives the same sums; a malformed one is refused, named.
  for (const char* spin : {"0", "200"}) {
    setenv("DTRAIN_SHM_SPIN_US", spin, 1);
    run_ranks(2, [](int r, Collectives& c) {
      EXPECT_TRUE(c.uses_shared_memory());
      std::vector<Tensor> ts{Tensor::full({3}, r + 1.0)};
      c.all_reduce(ts, ReduceOp::kSum);
      EXPECT_EQ(ts[0].to_vector<float>()[0], 3.0f);
    });
  }
  setenv("DTRAIN_SHM_SPIN_US", "5us", 1);
  try {
    InMemoryKeyValueStore one;
    ShmOptions options;
    options.world_size = 2;
    ShmTransport::connect(one, options, nullptr);
    ADD_FAILURE() << "a malformed DTRAIN_SHM_SPIN_US was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_SHM_SPIN_US is '5us'"), std::string::npos)
        << e.what();
  }
  unsetenv("DTRAIN_SHM_SPIN_US");
}

// TCP sockets of this process, in any state (/proc/net/tcp and tcp6 matched to this process's
// descriptors by inode): a Gloo mesh holds a connected pair per peer.
int tcp_sockets() {
  std::set<std::string> inodes;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  int n = 0;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (inodes.count(inode) > 0) ++n;
    }
  }
  return n;
}

// Where every worker uses shared memory, no Gloo mesh is built (no device, no TCP pair): a
// restarted worker or a spare joins a generation without its handshake. With the transport
// turned off, the same two ranks hold TCP pairs.
TEST(ShmCollectivesTest, NoGlooMeshWhenEveryWorkerUsesSharedMemory) {
  const int before = tcp_sockets();
  std::atomic<int> during_shm{-1}, during_gloo{-1};
  run_ranks(2, [&](int r, Collectives& c) {
    EXPECT_TRUE(c.uses_shared_memory());
    c.barrier();  // both ranks connected
    if (r == 0) during_shm = tcp_sockets();
    c.barrier();
    std::vector<Tensor> ts{Tensor::full({3}, r + 1.0)};
    c.all_reduce(ts, ReduceOp::kSum);
    std::vector<Tensor> b{Tensor::full({5}, r + 7.0)};
    c.broadcast(b, 1);
    EXPECT_EQ(ts[0].to_vector<float>()[0], 3.0f);
    EXPECT_EQ(b[0].to_vector<float>()[4], 8.0f);
  });
  EXPECT_EQ(during_shm.load(), before);
  setenv("DTRAIN_SHM_COLLECTIVES", "0", 1);
  run_ranks(2, [&](int r, Collectives& c) {
    EXPECT_FALSE(c.uses_shared_memory());
    c.barrier();
    if (r == 0) during_gloo = tcp_sockets();
    c.barrier();
  });
  unsetenv("DTRAIN_SHM_COLLECTIVES");
  EXPECT_GE(during_gloo.load(), before + 2) << "the Gloo path's pairs are not seen: the count of "
                                               "TCP sockets cannot tell the two paths apart";
}

std::string pid_ns_digits() {
  char buf[128] = {};
  const ssize_t len = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  std::string d;
  for (ssize_t i = 0; i < len; ++i) {
    if (buf[i] >= '0' && buf[i] <= '9') d += buf[i];
  }
  return d;
}

// Names under /dev/shm of segments created by `pid`.
std::vector<std::string> segments_of(pid_t pid) {
  std::vector<std::string> out;
  const std::string prefix = "dtrain-coll-" + pid_ns_digits() + "-" + std::to_string(pid) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

TEST(ShmCollectivesTest, NoSegmentOutlivesSetupAndCrashedRunsAreCleaned) {
  // A leftover of a run whose creator died during setup.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);
  const std::string stale =
      "/dtrain-coll-" + pid_ns_digits() + "-" + std::to_string(child) + "-run-g0-0123456789abcdef";
  const int fd = shm_open(stale.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(segments_of(child).size(), 1u);
  std::vector<size_t> live(3, 99);
  run_ranks(3, [&](int r, Collectives& c) {
    ASSERT_TRUE(c.uses_shared_memory());
    c.barrier();  // every rank has connected: the segment is mapped and unlinked
    live[r] = segments_of(getpid()).size();
    std::vector<Tensor> ts{Tensor::full({5}, 1.0)};
    c.all_reduce(ts, ReduceOp::kSum);
    EXPECT_EQ(ts[0].to_vector<float>()[4], 3.0f);
  });
  EXPECT_EQ(live, (std::vector<size_t>{0, 0, 0}));
  EXPECT_TRUE(segments_of(child).empty()) << "the stale segment was not removed";
}

TEST(ShmCollectivesTest, PeerThatLeavesFailsTheWaitersNamingIt) {
  auto store = std::make_shared<InMemoryKeyValueStore>();
  std::string message;
  bool unavailable = false;
  std::thread leaver([&] {
    auto c = Collectives::connect(store, {.rank = 1, .world_size = 2, .timeout = 60s});
    std::this_thread::sleep_for(50ms);
    c.reset();  // without the collective rank 0 waits in
  });
  {
    auto c = Collectives::connect(store, {.rank = 0, .world_size = 2, .timeout = 60s});
    EXPECT_TRUE(c->uses_shared_memory());
    // The very first all-reduce fails: the leaver's context does not pass through a barrier on
    // its way out that this all-reduce could take for its peer's contribution.
    std::vector<Tensor> ts{Tensor::full({300000}, 1.0)};
    try {
      c->all_reduce(ts, ReduceOp::kSum);
    } catch (const UnavailableError& e) {
      unavailable = true;
      message = e.what();
    }
    EXPECT_TRUE(c->broken());
  }
  leaver.join();
  EXPECT_TRUE(unavailable) << message;
  EXPECT_NE(message.find("all_reduce on rank 0 of 2"), std::string::npos) << message;
  EXPECT_NE(message.find("lost a peer (rank 1)"), std::string::npos) << message;
  EXPECT_NE(message.find("left the shared-memory collectives"), std::string::npos) << message;
}

// Real processes on a file store: rank 2 is SIGKILLed while ranks 0 and 1 wait for it in an
// all-reduce; both fail with UnavailableError naming rank 2 (before their 60 s timeout, or they
// would throw DeadlineExceededError), then rebuild a 2-worker generation on a fresh segment.
// Threads of this process whose name is `name` (/proc/self/task/*/comm).
int threads_named(const std::string& name) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string comm;
    std::ifstream(e.path() / "comm") >> comm;
    n += comm == name;
  }
  return n;
}

TEST(ShmCollectivesTest, PeerKilledMidCollectiveFailsSurvivorsWhoThenRejoin) {
  testutil::TempDir dir("dtrain_shm");
  const std::string url = "file://" + dir.path() + "/store";
  auto flag = [&](const std::string& name) { return dir.path() + "/" + name; };
  auto touch = [&](const std::string& name, const std::string& text) {
    std::ofstream(flag(name) + ".tmp") << text;
    std::filesystem::rename(flag(name) + ".tmp", flag(name));
  };
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid > 0) {
      pids.push_back(pid);
      continue;
    }
    int code = 1;
    try {
      auto store = open_store(url);
      auto c = Collectives::connect(
          store,
          {.rank = r, .world_size = 3, .timeout = 60s, .run_id = "shm_kill", .generation = 0});
      std::vector<Tensor> ts{Tensor::full({200001}, r + 1.0)};
      c->all_reduce(ts, ReduceOp::kSum);
      if (!c->uses_shared_memory() || ts[0].to_vector<float>()[200000] != 6.0f) _exit(3);
      // A thread sleeps on the peers' pidfds while the transport lives (a peer's exit wakes
      // this process's waits at once), and is joined with it.
      const int watchers = threads_named(kWatcherThreadName);
      touch(str_cat("entered", r), "");
      if (r == 2) {
        for (;;) pause();  // killed here
      }
      std::string report;
      try {
        c->all_reduce(ts, ReduceOp::kSum);
        report = "no error";
      } catch (const UnavailableError& e) {
        report = str_cat("Unavailable: ", e.what());
      } catch (const std::exception& e) {
        report = str_cat("other: ", e.what());
      }
      c.reset();
      report += str_cat("\nwatchers ", watchers, " then ", threads_named(kWatcherThreadName));
      // Survivors' next generation: two workers, a fresh segment.
      auto c2 = Collectives::connect(
          store,
          {.rank = r, .world_size = 2, .timeout = 60s, .run_id = "shm_kill", .generation = 1});
      std::vector<Tensor> t2{Tensor::full({1001}, r + 1.0)};
      c2->all_reduce(t2, ReduceOp::kSum);
      report += str_cat("\nrejoined shm=", c2->uses_shared_memory(),
                        " sum=", t2[0].to_vector<float>()[1000]);
      touch(str_cat("report", r), report);
      code = 0;
    } catch (const std::exception& e) {
      touch(str_cat("report", r), str_cat("setup failed: ", e.what()));
    }
    _exit(code);
  }
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  auto exists = [&](const std::string& name) { return std::filesystem::exists(flag(name)); };
  while (!(exists("entered0") && exists("entered1") && exists("entered2")) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(200ms);  // ranks 0 and 1 are (most likely) waiting in the reduce
  kill(pids[2], SIGKILL);
  std::vector<int> status(3, -1);
  for (int r = 0; r < 3; ++r) {
    while (waitpid(pids[r], &status[r], WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) kill(pids[r], SIGKILL);
      std::this_thread::sleep_for(10ms);
    }
  }
  for (int r = 0; r < 2; ++r) {
    const std::string report = testutil::read_bytes(flag(str_cat("report", r)));
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << r << ": " << report;
    EXPECT_EQ(report.rfind("Unavailable: ", 0), 0u) << report;
    EXPECT_NE(report.find("lost a peer (rank 2)"), std::string::npos) << report;
    EXPECT_NE(report.find("exited during a shared-memory collective"), std::string::npos) << report;
    EXPECT_NE(report.find("rejoined shm=1 sum=3"), std::string::npos) << report;
    EXPECT_NE(report.find("watchers 1 then 0"), std::string::npos) << report;
  }
  for (pid_t p : pids) EXPECT_TRUE(segments_of(p).empty()) << "segment of " << p << " left";
}

}  // namespace
}  // namespace dtrain::distribute
