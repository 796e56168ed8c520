// Private to distribute: the state behind a Collectives (Collectives::Impl), for the files that
// implement Collectives: collectives.cc (rendezvous, all-reduce, broadcast, gathers, barrier)
// and ordered_all_reduce.cc (the reductions in a fixed order of additions).
#pragma once

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/distribute/collectives.h"
#include "gloo_all_reduce.h"
#include "ordered_all_reduce.h"
#include "shm_transport.h"

namespace dtrain::distribute {

struct Collectives::Impl {
  // With two workers, buffers up to this size go through AllreduceRing (one send and one receive
  // of the whole buffer: the lowest latency); larger ones through gloo::allreduce.
  static constexpr size_t kSmallRingBytes = size_t{1} << 20;
  // Of those, buffers up to this size run on sync-mode pairs (see sync_context). In sync mode
  // both ranks write before they read, so a buffer must fit what the sockets absorb; 1 MiB
  // passes on loopback (CollectivesTest.SyncPairRingCompletesUpToItsLargestBuffer), and half of
  // that keeps a margin on real networks. DTRAIN_GLOO_NO_BUSY_POLL=1 turns them off.
  static constexpr size_t kSyncPairBytes = size_t{512} << 10;

  static bool is_timeout_message(const std::string& m) {
    return m.find("imed out") != std::string::npos || m.find("imeout") != std::string::npos;
  }

  CollectiveOptions options;
  int64_t generation = 0;
  std::vector<PeerInfo> peers;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  // Two workers only: a second full mesh whose pairs are in Gloo's sync mode, used for the small
  // old-style ring. The training thread then does the socket I/O itself instead of handing
  // every message through Gloo's event-loop thread, which on a 2-core machine costs as much CPU
  // as the training. Its reads block (the socket's receive timeout is the collective timeout)
  // unless DTRAIN_GLOO_BUSY_POLL=1 makes them spin: spinning saves a wake-up per message when
  // every worker has a core to itself, and starves the peer when the cores are shared (the
  // 2-worker test job: 11 s spinning against 1.0 s blocking at load 12 on 2 cores; see
  // docs/decisions.md). Null when not used.
  std::shared_ptr<gloo::rendezvous::Context> sync_context;
  std::vector<Bucket> buckets;
  Bucket scalar_bucket;
  std::vector<OrderedBuffer> ordered;
  // Every worker on this host: the collectives run here, and no Gloo mesh is built (device,
  // context and sync_context stay null). Null otherwise.
  std::unique_ptr<ShmTransport> shm;
  std::vector<ShmTransport::Segment> segments;  // all_reduce's bucket, without the copy
  std::vector<char> gathered, gathered_own;     // a scattered all_gather_v's over Gloo
  bool broken = false;

  std::string peers_text() const {
    std::string s;
    for (const auto& p : peers) {
      if (!s.empty()) s += "; ";
      s += str_cat("rank ", p.rank);
      if (!p.task.empty()) s += " (" + p.task + ")";
      s += str_cat(" = ", p.host, " pid ", p.pid);
    }
    return s;
  }

  // Names the peers whose host appears in a Gloo message ("... [127.0.0.1]:4242: ...").
  std::string suspects(const std::string& message) const {
    std::string s;
    for (const auto& p : peers) {
      if (p.rank == options.rank || p.host.empty()) continue;
      if (message.find("[" + p.host + "]") != std::string::npos ||
          message.find(p.host + ":") != std::string::npos) {
        s += (s.empty() ? "" : ", ") + str_cat("rank ", p.rank);
      }
    }
    return s;
  }

  [[noreturn]] void fail(const char* what, const std::string& message,
                         const std::string& suspect = "", bool timed_out = false) {
    broken = true;
    if (shm) shm->abort();  // peers waiting on this worker fail now, as on a closed TCP pair
    const std::string where = str_cat(what, " on rank ", options.rank, " of ", options.world_size,
                                      " (generation ", generation, ")");
    const std::string who = suspect.empty() ? suspects(message) : suspect;
    const std::string tail =
        str_cat(". Workers: ", peers_text(),
                ". This collective context is unusable now; rebuild it with a new rendezvous.");
    if (timed_out || is_timeout_message(message)) {
      throw DeadlineExceededError(
          str_cat(where, " timed out after ", options.timeout.count(), " ms waiting for a peer",
                  who.empty() ? "" : " (" + who + ")", ": ", message, tail));
    }
    throw UnavailableError(
        str_cat(where, " lost a peer", who.empty() ? "" : " (" + who + ")", ": ", message, tail));
  }

  template <class F>
  void guarded(const char* what, F&& f) {
    if (broken) {
      throw FailedPreconditionError(
          str_cat(what,
                  ": the collective context failed earlier and cannot be used again; rebuild it "
                  "with a new rendezvous"));
    }
    try {
      f();
    } catch (const dtrain::Error&) {
      throw;
    } catch (const ShmPeerError& e) {
      fail(what, e.what(), str_cat("rank ", e.peer), e.timed_out);
    } catch (const gloo::IoException& e) {
      fail(what, e.what());
    } catch (const gloo::Exception& e) {
      fail(what, e.what());
    } catch (const gloo::EnforceNotMet& e) {
      fail(what, e.what());
    }
  }

  AllreduceAlgorithm choose(size_t bytes) const {
    if (options.algorithm != AllreduceAlgorithm::kAuto) return options.algorithm;
    if (options.world_size == 2 && bytes <= kSmallRingBytes) return AllreduceAlgorithm::kRing;
    return AllreduceAlgorithm::kReduceScatter;
  }

  // All-reduces `count` elements at `ptr`; `bucket` is the persistent state when `ptr` is its
  // storage (old-style algorithms are bound to a buffer), or null for an in-place buffer.
  void reduce_buffer(Bucket* bucket, void* ptr, DType d, size_t count) {
    if (shm) {
      const ShmTransport::Segment whole{ptr, count};
      return shm_reduce({&whole, 1}, d, count);
    }
    const AllreduceAlgorithm a = choose(count * dtype_size(d));
    if (a == AllreduceAlgorithm::kReduceScatter) {
      new_style_allreduce(context, d, ptr, count, options.timeout);
      return;
    }
    DTRAIN_INTERNAL_CHECK(bucket != nullptr && ptr == bucket->data());
    if (!bucket->algo || bucket->algo_ptr != ptr || bucket->count != count || bucket->dtype != d ||
        bucket->algorithm != a) {
      const bool sync = sync_context != nullptr && a == AllreduceAlgorithm::kRing &&
                        count * dtype_size(d) <= kSyncPairBytes;
      bucket->algo = make_old_style(sync ? sync_context : context, a, d, ptr, count);
      bucket->algo_ptr = ptr;
      bucket->count = count;
      bucket->dtype = d;
      bucket->algorithm = a;
    }
    bucket->algo->run();
  }

  // The shared-memory all-reduce of `count` elements in `segments`, taken as one buffer: Gloo's
  // ring order of additions, chunk by chunk (see summation_order).
  void shm_reduce(std::span<const ShmTransport::Segment> segments, DType d, size_t count) {
    const size_t elem = dtype_size(d);
    shm->all_reduce(segments, d, ring_chunk_elements(count * elem, elem, options.world_size));
  }

  bool in_place_ok(size_t bytes) const {
    return choose(bytes) == AllreduceAlgorithm::kReduceScatter;
  }

  // all_reduce's packing, which summation_order replays: the tensors from `i` on that one
  // reduction takes, [i, end). Alone (and `*in_place`) when tensor i is large enough to be
  // reduced where it is; else the longest run of tensors of its dtype whose bytes fit
  // bucket_bytes, which a large tensor always ends. `*bytes`: the run's.
  size_t bucket_end(std::span<const Tensor> tensors, size_t i, bool* in_place,
                    size_t* bytes) const {
    *bytes = tensors[i].nbytes();
    *in_place = *bytes >= options.bucket_bytes && in_place_ok(*bytes);
    if (*in_place) return i + 1;
    const DType d = tensors[i].dtype();
    size_t j = i, total = 0;
    while (j < tensors.size() && tensors[j].dtype() == d &&
           (j == i || total + tensors[j].nbytes() <= options.bucket_bytes) &&
           !(j > i && tensors[j].nbytes() >= options.bucket_bytes)) {
      total += tensors[j].nbytes();
      ++j;
    }
    *bytes = total;
    return j;
  }
};

}  // namespace dtrain::distribute
