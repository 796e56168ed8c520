// Shared-memory collectives: the segment's setup through the store, futex-backed phase counters
// with peer-death detection, and the reductions in Gloo's ring order.
#include "shm_transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "dtrain/core/error.h"

namespace dtrain::distribute {
namespace {

constexpr uint64_t kMagic = 0x3176686d73727464;  // "dtrshmv1"
constexpr size_t kLine = 64;
constexpr size_t kPage = 4096;
constexpr const char* kPrefix = "dtrain-coll-";
// How long a wait spins before it blocks in the kernel (DTRAIN_SHM_SPIN_US overrides it, 0 to
// 10000): the cores may be shared, so spinning longer would take the core from the peer being
// waited for (docs/decisions.md).
constexpr int64_t kDefaultSpinMicros = 10;  // about what 256 pauses took on the AMD EPYC
// A blocked wait wakes at least this often to see whether a peer exited.
constexpr std::chrono::milliseconds kSlice{20};
constexpr int kMaxRanks = 64;

size_t round_up(size_t a, size_t b) { return (a + b - 1) / b * b; }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

uint32_t* word(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }

void futex_wait(std::atomic<uint32_t>& a, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  syscall(SYS_futex, word(a), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>& a) {
  syscall(SYS_futex, word(a), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// One cache line per rank: its barrier count, how many peers sleep on it, whether it left.
struct alignas(kLine) RankControl {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> waiters;
  std::atomic<uint32_t> left;
};
static_assert(sizeof(RankControl) == kLine);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string namespace_of(const char* link) {
  char buf[128] = {};
  const ssize_t n = readlink(link, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

std::string pid_namespace() { return namespace_of("/proc/self/ns/pid"); }

// Digits of "pid:[4026531836]", for segment names.
std::string namespace_digits(const std::string& ns) {
  std::string d;
  for (char c : ns) {
    if (c >= '0' && c <= '9') d += c;
  }
  return d.empty() ? "0" : d;
}

// What must match for two processes to share a segment and see each other's pids: the boot,
// the pid namespace and the /dev/shm mount (device and inode). The network namespace too: workers
// in separate ones are hosts as far as the job is told (the netns test clusters), so they keep
// the network between them.
std::string host_identity() {
  struct stat st {};
  const bool shm_ok = stat("/dev/shm", &st) == 0;
  const std::string boot = read_first_line("/proc/sys/kernel/random/boot_id");
  const std::string ns = pid_namespace();
  const std::string net = namespace_of("/proc/self/ns/net");
  if (!shm_ok || boot.empty() || ns.empty()) return "";
  return str_cat(boot, "/", ns, "/", net, "/", static_cast<uint64_t>(st.st_dev), ":",
                 static_cast<uint64_t>(st.st_ino));
}

std::string sanitized(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.';
    out += ok ? c : '_';
    if (out.size() == 40) break;
  }
  return out;
}

// Unlinks segments of crashed runs: a segment lives under its name only between its creation and
// the moment every rank has mapped it, so one whose creator (same pid namespace) is gone is a
// leftover of a run that died during setup.
void remove_stale_segments(const std::string& ns_digits) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string mine = str_cat(kPrefix, ns_digits, "-");
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(mine, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + mine.size(), nullptr, 10);
    if (pid > 0 && kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH) {
      shm_unlink(("/" + name).c_str());
    }
  }
  closedir(dir);
}

// out[i] for i < count = the sum of in[k][offset + i] over the ranks k, in the ring order ending
// on `owner`: x_owner + (x_owner+1 + (... + (x_owner-2 + x_owner-1))), as Gloo's ring adds each
// rank's own value to the partial sum it receives from the next rank.
template <class T>
void sum_owned(char* out_bytes, const char* const* in, int n, int owner, size_t offset,
               size_t count) {
  T* out = reinterpret_cast<T*>(out_bytes);
  auto x = [&](int rank) { return reinterpret_cast<const T*>(in[rank] + offset); };
  const T* last = x((owner + n - 1) % n);
  const T* prev = x((owner + n - 2) % n);
  for (size_t i = 0; i < count; ++i) out[i] = prev[i] + last[i];
  for (int j = 3; j <= n; ++j) {
    const T* v = x((owner + n - j) % n);
    for (size_t i = 0; i < count; ++i) out[i] = v[i] + out[i];
  }
}

void sum_owned(DType d, char* out, const char* const* in, int n, int owner, size_t offset,
               size_t count) {
  switch (d) {
    case DType::kFloat32:
      return sum_owned<float>(out, in, n, owner, offset, count);
    case DType::kFloat64:
      return sum_owned<double>(out, in, n, owner, offset, count);
    case DType::kInt32:
      return sum_owned<int32_t>(out, in, n, owner, offset, count);
    case DType::kInt64:
      return sum_owned<int64_t>(out, in, n, owner, offset, count);
    default:
      DTRAIN_INTERNAL_CHECK(false, "shared-memory all-reduce: unsupported dtype");
  }
}

std::chrono::microseconds spin_from_environment() {
  const char* env = std::getenv("DTRAIN_SHM_SPIN_US");
  if (env == nullptr || *env == '\0') return std::chrono::microseconds(kDefaultSpinMicros);
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (*end != '\0' || v < 0 || v > 10000) {
    throw InvalidArgumentError(
        str_cat("DTRAIN_SHM_SPIN_US is '", env, "': expected microseconds from 0 to 10000"));
  }
  return std::chrono::microseconds(v);
}

}  // namespace

struct ShmTransport::Header {
  uint64_t magic;
  uint32_t world_size;
  uint32_t reserved;
  uint64_t region_bytes;
};

std::unique_ptr<ShmTransport> ShmTransport::connect(KeyValueStore& store, const ShmOptions& options,
                                                    std::string* why_not) {
  const int n = options.world_size;
  const int r = options.rank;
  const std::chrono::microseconds spin = spin_from_environment();  // a bad value throws here
  const std::string identity = host_identity();
  const bool vote = options.enabled && n >= 2 && n <= kMaxRanks && !identity.empty();
  store.set(str_cat("shm/host/", r), str_cat(vote ? "1" : "0", " ", ::getpid(), " ", identity));
  std::vector<int64_t> pids(n);
  std::string reason;
  for (int k = 0; k < n; ++k) {
    std::istringstream in(store.get(str_cat("shm/host/", k), options.timeout));
    std::string v, id;
    in >> v >> pids[k] >> id;
    if (!reason.empty()) continue;
    if (v != "1") {
      reason = str_cat("rank ", k, " does not use shared memory (DTRAIN_SHM_COLLECTIVES=0, ",
                       "an old-style all-reduce algorithm, more than ", kMaxRanks,
                       " workers, or no /dev/shm)");
    } else if (id != identity) {
      reason = str_cat("rank ", k, " is on another host (or pid namespace, or /dev/shm)");
    }
  }
  if (!reason.empty()) {
    if (why_not != nullptr) *why_not = reason;
    return nullptr;
  }

  std::unique_ptr<ShmTransport> t(new ShmTransport());
  t->options_ = options;
  t->pids_ = pids;
  t->region_bytes_ = round_up(std::clamp<size_t>(options.region_bytes, 64 << 10, 4 << 20), kPage);
  t->header_bytes_ = round_up(kLine + kLine * n, kPage);
  t->mapped_bytes_ = t->header_bytes_ + t->region_bytes_ * 2 * n;
  const std::string ns_digits = namespace_digits(pid_namespace());
  std::string name;
  bool created = false;
  auto unlink_created = [&] {
    if (created) shm_unlink(name.c_str());
    created = false;
  };
  auto map = [&](int fd) -> std::string {
    void* p = mmap(nullptr, t->mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return str_cat("mmap: ", std::strerror(errno));
    t->base_ = p;
    t->header_ = static_cast<Header*>(p);
    return "";
  };
  std::string error;
  try {
    if (r == 0) {
      remove_stale_segments(ns_digits);
      std::random_device rd;
      const uint64_t nonce = (uint64_t{rd()} << 32) ^ rd();
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(nonce));
      name = str_cat("/", kPrefix, ns_digits, "-", ::getpid(), "-", sanitized(options.run_id), "-g",
                     options.generation, "-", hex);
      const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) {
        error = str_cat("shm_open(", name, "): ", std::strerror(errno));
      } else {
        created = true;
        // Allocated now, not at first touch: a full /dev/shm (containers often give 64 MiB) must
        // turn the transport down here, not raise SIGBUS in the middle of a step.
        const int err = posix_fallocate(fd, 0, static_cast<off_t>(t->mapped_bytes_));
        if (err != 0) {
          error = str_cat("posix_fallocate(", name, ", ", t->mapped_bytes_,
                          " bytes): ", std::strerror(err));
          close(fd);
        } else {
          error = map(fd);
        }
      }
      if (error.empty()) {
        t->header_->world_size = static_cast<uint32_t>(n);
        t->header_->region_bytes = t->region_bytes_;
        std::atomic_ref<uint64_t>(t->header_->magic).store(kMagic, std::memory_order_release);
      }
      store.set("shm/segment", error.empty() ? name : "!" + error);
    } else {
      name = store.get("shm/segment", options.timeout);
      if (!name.empty() && name[0] == '!') {
        error = str_cat("rank 0 could not create the segment: ", name.substr(1));
      } else {
        const int fd = shm_open(name.c_str(), O_RDWR, 0);
        struct stat st {};
        if (fd < 0) {
          error = str_cat("shm_open(", name, "): ", std::strerror(errno));
        } else if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != t->mapped_bytes_) {
          error = str_cat(name, " has ", st.st_size, " bytes, expected ", t->mapped_bytes_);
          close(fd);
        } else {
          error = map(fd);
        }
        if (error.empty() &&
            (std::atomic_ref<uint64_t>(t->header_->magic).load(std::memory_order_acquire) !=
                 kMagic ||
             t->header_->world_size != static_cast<uint32_t>(n))) {
          error = str_cat(name, " is not this generation's segment");
        }
      }
    }
    store.set(str_cat("shm/attached/", r), error.empty() ? "1" : "0 " + error);
    for (int k = 0; k < n; ++k) {
      const std::string v = store.get(str_cat("shm/attached/", k), options.timeout);
      if (v != "1" && reason.empty())
        reason = str_cat("rank ", k, ": ", v.size() > 2 ? v.substr(2) : v);
    }
  } catch (...) {
    unlink_created();
    throw;
  }
  unlink_created();  // every rank has mapped it (or given up): the name is no longer needed
  if (!reason.empty()) {
    if (why_not != nullptr) *why_not = reason;
    return nullptr;  // the destructor unmaps; nobody waits on the segment
  }
  t->name_ = name;
  t->spin_ = spin;
  t->pidfds_.assign(n, -1);
  for (int k = 0; k < n; ++k) {
    if (k == r || pids[k] == ::getpid()) continue;
#ifdef SYS_pidfd_open
    t->pidfds_[k] = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pids[k]), 0));
#endif
  }
  return t;
}

ShmTransport::~ShmTransport() {
  if (base_ != nullptr) {
    abort();
    munmap(base_, mapped_bytes_);
  }
  for (int fd : pidfds_) {
    if (fd >= 0) close(fd);
  }
}

char* ShmTransport::input(int r, int parity) const {
  return static_cast<char*>(base_) + header_bytes_ + region_bytes_ * (2 * r + parity);
}

namespace {
RankControl& control(void* base, int r) {
  return *reinterpret_cast<RankControl*>(static_cast<char*>(base) + kLine * (r + 1));
}
bool reached(uint32_t value, uint32_t epoch) { return static_cast<int32_t>(value - epoch) >= 0; }
}  // namespace

void ShmTransport::abort() noexcept {
  if (left_ || base_ == nullptr || name_.empty()) return;
  left_ = true;
  control(base_, options_.rank).left.store(1, std::memory_order_seq_cst);
  for (int k = 0; k < options_.world_size; ++k) futex_wake(control(base_, k).arrived);
}

void ShmTransport::throw_left(int peer) {
  throw ShmPeerError(peer, false,
                     str_cat("rank ", peer, " (pid ", pids_[peer],
                             ") left the shared-memory collectives (its own collective failed or "
                             "it closed its context)"));
}

// A peer that exited or left before reaching the barrier now being waited at fails the wait; one
// that got there first and went is no cause (its part is done).
void ShmTransport::check_peers() {
  const int n = options_.world_size;
  for (int k = 0; k < n; ++k) {
    if (k == options_.rank || reached(control(base_, k).arrived.load(), epoch_)) continue;
    bool dead = false;
    if (pidfds_[k] >= 0) {
      pollfd p{.fd = pidfds_[k], .events = POLLIN, .revents = 0};
      dead = poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    } else if (pids_[k] != ::getpid()) {
      dead = kill(static_cast<pid_t>(pids_[k]), 0) == -1 && errno == ESRCH;
    }
    if (dead) {
      throw ShmPeerError(
          k, false,
          str_cat("rank ", k, " (pid ", pids_[k], ") exited during a shared-memory collective"));
    }
  }
  for (int k = 0; k < n; ++k) {
    if (k == options_.rank) continue;
    RankControl& c = control(base_, k);
    if (c.left.load() != 0 && !reached(c.arrived.load(), epoch_)) throw_left(k);
  }
}

void ShmTransport::wait_for(int peer, uint32_t epoch, Clock::time_point deadline) {
  RankControl& c = control(base_, peer);
  const auto spin_until = Clock::now() + spin_;
  for (int i = 0;; ++i) {
    if (reached(c.arrived.load(std::memory_order_acquire), epoch)) return;
    cpu_relax();
    if ((i & 31) == 31 && Clock::now() >= spin_until) break;
  }
  while (true) {
    check_peers();
    c.waiters.fetch_add(1);
    const uint32_t v = c.arrived.load();
    if (reached(v, epoch)) {
      c.waiters.fetch_sub(1);
      return;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      c.waiters.fetch_sub(1);
      throw ShmPeerError(peer, true,
                         str_cat("timed out: rank ", peer, " (pid ", pids_[peer],
                                 ") did not reach the shared-memory collective"));
    }
    futex_wait(c.arrived, v, std::min<Clock::duration>(deadline - now, kSlice));
    c.waiters.fetch_sub(1);
    if (reached(c.arrived.load(std::memory_order_acquire), epoch)) return;
  }
}

void ShmTransport::arrive_and_wait(Clock::time_point deadline) {
  const uint32_t e = ++epoch_;
  RankControl& me = control(base_, options_.rank);
  me.arrived.store(e);
  if (me.waiters.load() != 0) futex_wake(me.arrived);
  for (int k = 0; k < options_.world_size; ++k) {
    if (k != options_.rank) wait_for(k, e, deadline);
  }
}

void ShmTransport::barrier(std::chrono::milliseconds timeout) {
  arrive_and_wait(Clock::now() + timeout);
}

// Every collective moves windows through the input regions of the current parity: each rank fills
// its own, one barrier, then each reads what it needs from every rank's, and the parity flips.
// A rank refills a region of one parity only after the barrier of the next window, which every
// rank reaches only once it is done reading this one: one barrier per window.
template <class Pack, class Consume>
void ShmTransport::windows(size_t total, size_t window, Pack&& pack, Consume&& consume) {
  const int n = options_.world_size;
  const char* in[kMaxRanks];
  for (size_t w0 = 0; w0 < total; w0 += window) {
    const size_t len = std::min(window, total - w0);
    pack(input(options_.rank, parity_), w0, len);
    arrive_and_wait(Clock::now() + options_.timeout);
    for (int k = 0; k < n; ++k) in[k] = input(k, parity_);
    consume(in, w0, len);
    parity_ ^= 1;
  }
}

// Calls fn(run, b, e) for the part [b, e) of each run of runs_ inside [b0, e0).
template <class Fn>
void ShmTransport::each_run(size_t b0, size_t e0, Fn&& fn) const {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), b0,
                             [](size_t v, const Run& run) { return v < run.begin; });
  if (it != runs_.begin()) --it;
  for (; it != runs_.end() && it->begin < e0; ++it) {
    const size_t b = std::max(b0, it->begin), e = std::min(e0, it->begin + it->count);
    if (b < e) fn(*it, b, e);
  }
}

void ShmTransport::all_reduce(std::span<const Segment> segments, DType dtype, size_t chunk) {
  const int n = options_.world_size;
  const size_t elem = dtype_size(dtype);
  starts_.clear();
  size_t count = 0;
  for (const Segment& g : segments) {
    starts_.push_back(count);
    count += g.count;
  }
  chunk = std::max<size_t>(chunk, 1);
  runs_.clear();
  for (int o = 0; o < n && o * chunk < count; ++o) {
    const size_t b = o * chunk;
    const size_t e = o == n - 1 ? count : std::min(count, b + chunk);
    runs_.push_back({b, e - b, o});
  }
  // Segments overlapping [w0, w0 + len): fn(segment bytes at the overlap, stream offset, count).
  auto each = [&](size_t w0, size_t len, auto&& fn) {
    size_t k = std::upper_bound(starts_.begin(), starts_.end(), w0) - starts_.begin();
    if (k > 0) --k;
    for (; k < segments.size() && starts_[k] < w0 + len; ++k) {
      const size_t b = std::max(w0, starts_[k]);
      const size_t e = std::min(w0 + len, starts_[k] + segments[k].count);
      if (b < e) fn(static_cast<char*>(segments[k].data) + (b - starts_[k]) * elem, b, e - b);
    }
  };
  windows(
      count, region_bytes_ / elem,
      [&](char* dst, size_t w0, size_t len) {
        each(w0, len, [&](char* p, size_t at, size_t c) {
          std::memcpy(dst + (at - w0) * elem, p, c * elem);
        });
      },
      [&](const char* const* in, size_t w0, size_t len) {
        // Every rank sums the whole window straight into its tensors, each element in its
        // owner's order: the same bits everywhere, and no second copy.
        each(w0, len, [&](char* p, size_t at, size_t c) {
          each_run(at, at + c, [&](const Run& run, size_t b, size_t e) {
            sum_owned(dtype, p + (b - at) * elem, in, n, run.owner, (b - w0) * elem, e - b);
          });
        });
      });
}

void ShmTransport::all_reduce_in_order(std::span<const OrderedPiece> pieces, DType dtype) {
  const int n = options_.world_size;
  const size_t elem = dtype_size(dtype);
  runs_.clear();
  size_t total = 0;
  for (const OrderedPiece& p : pieces) {
    runs_.push_back({total, p.count, p.owner});
    total += p.count;
  }
  const int me = options_.rank;
  // A piece only this rank keeps is summed with its own part read where it is: no peer reads it
  // from the region, so it is not copied there (with two workers and ZeRO, half the copy-in).
  // Not for a piece summed in place (its output would overwrite its input between the passes of
  // three or more ranks).
  auto direct = [&](const OrderedPiece& p) {
    if (p.keep != me || p.src == nullptr) return false;
    const auto s = reinterpret_cast<uintptr_t>(p.src), d = reinterpret_cast<uintptr_t>(p.dst);
    return s + p.count * elem <= d || d + p.count * elem <= s;
  };
  windows(
      total, region_bytes_ / elem,
      [&](char* dst, size_t w0, size_t len) {
        each_run(w0, w0 + len, [&](const Run& run, size_t b, size_t e) {
          const OrderedPiece& p = pieces[&run - runs_.data()];
          if (direct(p)) return;
          if (p.src == nullptr) {
            std::memset(dst + (b - w0) * elem, 0, (e - b) * elem);
          } else {
            std::memcpy(dst + (b - w0) * elem,
                        static_cast<const char*>(p.src) + (b - run.begin) * elem, (e - b) * elem);
          }
        });
      },
      [&](const char* const* in, size_t w0, size_t len) {
        each_run(w0, w0 + len, [&](const Run& run, size_t b, size_t e) {
          const OrderedPiece& p = pieces[&run - runs_.data()];
          if (p.keep >= 0 && p.keep != me) return;  // another worker's: not even summed here
          char* out = static_cast<char*>(p.dst) + (b - run.begin) * elem;
          if (!direct(p)) return sum_owned(dtype, out, in, n, run.owner, (b - w0) * elem, e - b);
          const char* from[kMaxRanks];
          for (int k = 0; k < n; ++k) from[k] = in[k] + (b - w0) * elem;
          from[me] = static_cast<const char*>(p.src) + (b - run.begin) * elem;
          sum_owned(dtype, out, from, n, run.owner, 0, e - b);
        });
      });
}

void ShmTransport::all_gather_v(const void* local, void* out,
                                std::span<const size_t> bytes_per_rank) {
  const int n = options_.world_size;
  size_t largest = 0;
  for (size_t b : bytes_per_rank) largest = std::max(largest, b);
  auto* dst = static_cast<char*>(out);
  const auto* mine = static_cast<const char*>(local);
  const size_t own = bytes_per_rank[options_.rank];
  windows(
      largest, region_bytes_,
      [&](char* region, size_t w0, size_t len) {
        if (w0 < own) std::memcpy(region, mine + w0, std::min(len, own - w0));
      },
      [&](const char* const* in, size_t w0, size_t len) {
        size_t offset = 0;
        for (int k = 0; k < n; ++k) {
          const size_t b = bytes_per_rank[k];
          if (w0 < b) std::memcpy(dst + offset + w0, in[k], std::min(len, b - w0));
          offset += b;
        }
      });
}

void ShmTransport::all_gather_v(const void* local, std::span<const std::span<std::byte>> out,
                                std::span<const size_t> bytes_per_rank) {
  const int n = options_.world_size;
  size_t largest = 0;
  for (size_t b : bytes_per_rank) largest = std::max(largest, b);
  starts_.clear();
  size_t total = 0;
  for (const std::span<std::byte>& o : out) {
    starts_.push_back(total);
    total += o.size();
  }
  // Bytes [at, at + len) of the concatenation: copied from `src` (gather), or into `dst` (pack).
  auto each = [&](size_t at, size_t len, auto&& copy) {
    size_t k = std::upper_bound(starts_.begin(), starts_.end(), at) - starts_.begin();
    if (k > 0) --k;
    for (; k < out.size() && starts_[k] < at + len; ++k) {
      const size_t b = std::max(at, starts_[k]), e = std::min(at + len, starts_[k] + out[k].size());
      if (b < e) copy(reinterpret_cast<char*>(out[k].data()) + (b - starts_[k]), b - at, e - b);
    }
  };
  auto scatter = [&](const char* src, size_t at, size_t len) {
    each(at, len, [&](char* o, size_t off, size_t c) { std::memcpy(o, src + off, c); });
  };
  const auto* mine = static_cast<const char*>(local);
  const size_t own = bytes_per_rank[options_.rank];
  size_t own_at = 0;  // this rank's offset in the concatenation
  for (int k = 0; k < options_.rank; ++k) own_at += bytes_per_rank[k];
  windows(
      largest, region_bytes_,
      [&](char* region, size_t w0, size_t len) {
        if (w0 >= own) return;
        if (mine != nullptr) {
          std::memcpy(region, mine + w0, std::min(len, own - w0));
        } else {
          each(own_at + w0, std::min(len, own - w0),
               [&](char* o, size_t off, size_t c) { std::memcpy(region + off, o, c); });
        }
      },
      [&](const char* const* in, size_t w0, size_t len) {
        size_t offset = 0;
        for (int k = 0; k < n; ++k) {
          const size_t b = bytes_per_rank[k];
          // This rank's part comes from `local` (the same bytes, already in cache), or is there.
          if (w0 < b && !(k == options_.rank && mine == nullptr))
            scatter(k == options_.rank ? mine + w0 : in[k], offset + w0, std::min(len, b - w0));
          offset += b;
        }
      });
}

void ShmTransport::broadcast(void* data, size_t bytes, int root) {
  auto* p = static_cast<char*>(data);
  const bool is_root = options_.rank == root;
  windows(
      bytes, region_bytes_,
      [&](char* region, size_t w0, size_t len) {
        if (is_root) std::memcpy(region, p + w0, len);
      },
      [&](const char* const* in, size_t w0, size_t len) {
        if (!is_root) std::memcpy(p + w0, in[root], len);
      });
}

}  // namespace dtrain::distribute
