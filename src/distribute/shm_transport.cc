// Shared-memory collectives: futex-backed phase counters with peer-death detection, and the
// reductions in Gloo's ring order (the segment's setup is in shm_segment.cc).
#include "shm_transport.h"

#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

#include "dtrain/core/error.h"

namespace dtrain::distribute {
namespace {

// A blocked wait wakes at least this often to see whether a peer exited (the watcher thread wakes
// it at once where pidfds exist; this bounds the rest: kill(pid, 0) and a peer's `left` flag).
constexpr std::chrono::milliseconds kSlice{20};

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
struct alignas(kShmLine) RankControl {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> waiters;
  std::atomic<uint32_t> left;
};
static_assert(sizeof(RankControl) == kShmLine);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

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

}  // namespace

char* ShmTransport::input(int r, int parity) const {
  return static_cast<char*>(base_) + header_bytes_ + region_bytes_ * (2 * r + parity);
}

namespace {
RankControl& control(void* base, int r) {
  return *reinterpret_cast<RankControl*>(static_cast<char*>(base) + kShmLine * (r + 1));
}
bool reached(uint32_t value, uint32_t epoch) { return static_cast<int32_t>(value - epoch) >= 0; }
}  // namespace

void ShmTransport::start_watcher() {
  if (std::none_of(pidfds_.begin(), pidfds_.end(), [](int fd) { return fd >= 0; })) return;
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (stop_fd_ < 0) return;  // the slices still see an exit, within kSlice
  watcher_ = std::thread([this] { watch_peers(); });
}

void ShmTransport::watch_peers() {
  ::pthread_setname_np(::pthread_self(), kWatcherThreadName);
  std::vector<pollfd> fds;
  for (int fd : pidfds_) {
    if (fd >= 0) fds.push_back({.fd = fd, .events = POLLIN, .revents = 0});
  }
  fds.push_back({.fd = stop_fd_, .events = POLLIN, .revents = 0});
  const auto wake_all = [this] {
    for (int k = 0; k < options_.world_size; ++k) futex_wake(control(base_, k).arrived);
  };
  // A wait that checked its peers just before the wake and sleeps just after misses it: the
  // wake is repeated twice, 2 ms apart (kSlice bounds what still slips through).
  int rewakes = 0;
  while (true) {
    const int ready = ::poll(fds.data(), fds.size(), rewakes > 0 ? 2 : -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || fds.back().revents != 0) return;
    if (ready == 0) {
      wake_all();
      --rewakes;
      continue;
    }
    bool exited = false;
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      fds[i].fd = -1;  // a pidfd stays readable once its process is gone: poll it no more
      exited = true;
    }
    if (exited) {
      wake_all();
      rewakes = 2;
    }
  }
}

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
  const char* in[kShmMaxRanks];
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
          const char* from[kShmMaxRanks];
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
