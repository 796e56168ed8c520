// Private to distribute: collectives over one POSIX shared-memory segment for a generation whose
// workers all share this host's /dev/shm (docs/distributed.md, "Performance"). Every rank has two
// input regions (alternating windows); each rank copies its window in, and after one barrier sums
// every rank's window straight into its own tensors, each element in the ring order of its owner
// (so the bits are Gloo's); futex-backed counters are the barriers. A peer that exits (seen through
// a pidfd) or gives up (a flag in the segment) fails every survivor's wait with ShmPeerError; a
// watcher thread sleeps on the peers' pidfds and wakes this process's waits the moment one exits.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/distribute/collectives.h"
#include "dtrain/distribute/key_value_store.h"

namespace dtrain::distribute {

// The segment's layout, for shm_segment.cc (its setup) and shm_transport.cc (its use): one
// cache line of control per rank after the header, and at most this many ranks.
inline constexpr size_t kShmLine = 64;
inline constexpr int kShmMaxRanks = 64;
// The name of the thread that watches the peers' pidfds (one per transport, joined by its
// destructor).
inline constexpr const char* kWatcherThreadName = "dtrain-shmwatch";

// A collective over shared memory failed: `peer` exited, left or did not arrive in time.
struct ShmPeerError : std::runtime_error {
  ShmPeerError(int peer, bool timed_out, const std::string& message)
      : std::runtime_error(message), peer(peer), timed_out(timed_out) {}
  int peer;
  bool timed_out;
};

struct ShmOptions {
  int rank = 0;
  int world_size = 1;
  bool enabled = true;                    // this rank's vote; shared memory needs every rank's
  size_t region_bytes = size_t{4} << 20;  // per-rank window (rounded to pages)
  std::string run_id;
  int64_t generation = 0;
  std::chrono::milliseconds timeout{30000};  // setup and each collective
};

class ShmTransport {
 public:
  // Publishes this worker's host identity (boot id, pid namespace, /dev/shm's device and inode)
  // under "shm/" in `store` (a generation's store: every rank must call this at the same point)
  // and reads every peer's. When every rank votes yes and shares the identity, rank 0 creates the
  // segment, the others map it, and rank 0 unlinks it once all have: returns the transport.
  // Returns null (on every rank alike) when a rank votes no, a host differs, or a rank cannot map
  // the segment; `why_not` then says why. Throws what the store throws (a rank that never
  // publishes: DeadlineExceededError after options.timeout).
  static std::unique_ptr<ShmTransport> connect(KeyValueStore& store, const ShmOptions& options,
                                               std::string* why_not);
  // Tells the peers this rank left (a survivor waiting on it fails at once) and unmaps.
  ~ShmTransport();
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  // Elements [0, count) of one side of a reduction, somewhere in memory.
  struct Segment {
    void* data = nullptr;
    size_t count = 0;
  };
  // Sums the concatenation of `segments` (float32, float64, int32, int64) in place, as if they
  // were one buffer: its element i is summed in the ring order ending on owner
  // min(i / chunk, n - 1) (SumRange's order). Copies straight between the segments and the
  // segment, so a bucket of tensors needs no staging buffer.
  void all_reduce(std::span<const Segment> segments, DType dtype, size_t chunk);
  // Collectives::all_reduce_in_order over shared memory (float32, float64).
  void all_reduce_in_order(std::span<const OrderedPiece> pieces, DType dtype);
  // out = every rank's `local` (bytes_per_rank[r] bytes from rank r), concatenated in rank order.
  void all_gather_v(const void* local, void* out, std::span<const size_t> bytes_per_rank);
  // all_gather_v with the output scattered: the concatenation lands in `out` (byte ranges taken
  // end to end, together as long as the concatenation), straight from every rank's region.
  // `local` null: in place (this rank's part is read from `out`, and not written).
  void all_gather_v(const void* local, std::span<const std::span<std::byte>> out,
                    std::span<const size_t> bytes_per_rank);
  // Overwrites `bytes` at `data` with root's.
  void broadcast(void* data, size_t bytes, int root);
  // Returns once every rank has called barrier(); `timeout` replaces the collective timeout.
  void barrier(std::chrono::milliseconds timeout);
  void barrier() { barrier(options_.timeout); }
  // Marks this rank as gone, waking every waiting peer; they fail with ShmPeerError naming it.
  void abort() noexcept;

  const std::string& segment_name() const { return name_; }

 private:
  struct Header;
  struct Run {
    size_t begin = 0;  // element offset in the packed stream
    size_t count = 0;
    int owner = 0;
  };
  ShmTransport() = default;
  using Clock = std::chrono::steady_clock;
  void arrive_and_wait(Clock::time_point deadline);
  void wait_for(int peer, uint32_t epoch, Clock::time_point deadline);
  void check_peers();
  // The watcher thread's body: poll(2) on the peers' pidfds and stop_fd_; a peer's exit wakes
  // every wait of this process (check_peers then names it).
  void watch_peers();
  void start_watcher();
  [[noreturn]] void throw_left(int peer);
  char* input(int r, int parity) const;
  template <class Pack, class Consume>
  void windows(size_t total, size_t window, Pack&& pack, Consume&& consume);
  template <class Fn>
  void each_run(size_t b0, size_t e0, Fn&& fn) const;

  ShmOptions options_;
  std::string name_;
  void* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  size_t header_bytes_ = 0;
  size_t region_bytes_ = 0;
  Header* header_ = nullptr;
  uint32_t epoch_ = 0;       // barriers passed; the same on every rank
  int parity_ = 0;           // which input regions the next window uses
  std::vector<int> pidfds_;  // per rank; -1 for this process and where pidfd_open failed
  std::vector<int64_t> pids_;
  int stop_fd_ = -1;     // an eventfd that stops the watcher
  std::thread watcher_;  // only where some peer has a pidfd
  std::vector<Run> runs_;
  std::vector<size_t> starts_;          // each segment's element offset in the packed stream
  std::chrono::microseconds spin_{10};  // how long a wait spins before it sleeps
  bool left_ = false;
};

}  // namespace dtrain::distribute
