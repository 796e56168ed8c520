// Collectives over Gloo: rendezvous, a full mesh of TCP pairs, bucketed all-reduce with
// persistent buckets, and the mapping of Gloo's exceptions to dtrain's error codes; the
// shared-memory transport (shm_transport.h) takes the collectives over when every worker is on
// this host. The state is Collectives::Impl (collectives_impl.h); the reductions in a fixed
// order of additions (summation_order, all_reduce_in_order) are in ordered_all_reduce.cc.
#include "dtrain/distribute/collectives.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "collectives_impl.h"
#include "dtrain/core/error.h"
#include "gloo_all_reduce.h"
#include "gloo_store.h"
#include "ordered_all_reduce.h"
#include "shm_transport.h"

namespace dtrain::distribute {
namespace {

bool supported_reduce_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kInt32 || d == DType::kInt64;
}

void scale(void* ptr, DType d, size_t count, double factor) {
  if (d == DType::kFloat32) {
    auto* p = static_cast<float*>(ptr);
    const float f = static_cast<float>(factor);
    for (size_t i = 0; i < count; ++i) p[i] *= f;
  } else if (d == DType::kFloat64) {
    auto* p = static_cast<double*>(ptr);
    for (size_t i = 0; i < count; ++i) p[i] *= factor;
  }
}

}  // namespace

Collectives::Collectives(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Collectives::~Collectives() {
  // Graceful shutdown: a worker that finished its part of the last collective early (old-style
  // algorithms finish at different times on different ranks) must not close its pairs while a
  // peer is still exchanging with it. Skipped after a failure; bounded by 10 s.
  // Over shared memory there is nothing to protect: a peer still reading this worker's last
  // window keeps the segment mapped, and the "left" flag the transport sets when it goes fails
  // only a peer that waits for this worker in a later collective. A barrier here could even pair
  // with a peer's all-reduce (a worker leaving after an error of its own) and hand it stale data.
  if (!impl_ || !impl_->context || impl_->broken || impl_->shm) return;
  try {
    gloo::BarrierOptions opts(impl_->context);
    opts.setTimeout(
        std::min<std::chrono::milliseconds>(impl_->options.timeout, std::chrono::seconds(10)));
    gloo::barrier(opts);
  } catch (...) {
    // A peer already gone: nothing left to protect.
  }
}

std::unique_ptr<Collectives> Collectives::connect(const std::shared_ptr<KeyValueStore>& store,
                                                  const CollectiveOptions& options) {
  DTRAIN_CHECK(options.bucket_bytes >= 64, "Collectives: bucket_bytes ", options.bucket_bytes,
               " is too small (at least 64)");
  DTRAIN_CHECK(options.timeout.count() > 0, "Collectives: timeout must be positive");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  // Gloo writes to sockets from its own thread without MSG_NOSIGNAL on every path: a write to a
  // peer that just died would raise SIGPIPE and kill this process instead of failing the
  // collective. Ignore SIGPIPE unless the program installed its own handler.
  static const bool sigpipe_ignored = [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
    return true;
  }();
  (void)sigpipe_ignored;
  RendezvousResult rdzv = rendezvous(store, {.rank = options.rank,
                                             .world_size = options.world_size,
                                             .host = options.host,
                                             .task = options.task,
                                             .run_id = options.run_id,
                                             .generation = options.generation,
                                             .timeout = options.timeout});
  impl->generation = rdzv.generation;
  impl->peers = rdzv.peers;
  if (options.world_size > 1) {
    // Every worker on this host: the shared-memory transport carries every collective, and no
    // Gloo mesh is built (its TCP pairs, device thread and handshake cost a restarted or spare
    // worker about 12 ms of a recovery on a 2-vCPU VM). The workers agree through the store.
    const char* shm_env = std::getenv("DTRAIN_SHM_COLLECTIVES");
    const AllreduceAlgorithm a = options.algorithm;
    // An old-style algorithm with three workers or more sums in an order of its own.
    const bool same_order = options.world_size == 2 || a == AllreduceAlgorithm::kAuto ||
                            a == AllreduceAlgorithm::kReduceScatter;
    std::string why_not;
    impl->shm =
        ShmTransport::connect(*rdzv.store,
                              {.rank = options.rank,
                               .world_size = options.world_size,
                               .enabled = options.shared_memory && same_order &&
                                          !(shm_env != nullptr && std::string(shm_env) == "0"),
                               .region_bytes = options.bucket_bytes,
                               .run_id = options.run_id,
                               .generation = rdzv.generation,
                               .timeout = options.timeout},
                              &why_not);
  }
  if (options.world_size > 1 && !impl->shm) {
    const char* what = "connecting the Gloo full mesh";
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = options.host;
      impl->device = gloo::transport::tcp::CreateDevice(attr);
      impl->context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
      impl->context->setTimeout(options.timeout);
      GlooStoreAdapter adapter(rdzv.store, options.timeout);
      std::shared_ptr<gloo::transport::Device> dev = impl->device;
      impl->context->connectFullMesh(adapter, dev);
      // A rank returns from connectFullMesh once its own pairs are up; without this barrier it
      // could close them (finish, fail, exit) while a peer is still completing its handshake.
      gloo::BarrierOptions barrier(impl->context);
      barrier.setTimeout(options.timeout);
      gloo::barrier(barrier);
      if (options.world_size == 2 && std::getenv("DTRAIN_GLOO_NO_BUSY_POLL") == nullptr) {
        impl->sync_context =
            std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
        impl->sync_context->setTimeout(options.timeout);
        GlooStoreAdapter sync_adapter(
            std::make_shared<PrefixKeyValueStore>(rdzv.store, "sync_pairs/"), options.timeout);
        impl->sync_context->connectFullMesh(sync_adapter, dev);
        const char* busy = std::getenv("DTRAIN_GLOO_BUSY_POLL");
        const bool busy_poll = busy != nullptr && std::string(busy) == "1";
        for (int i = 0; i < options.world_size; ++i) {
          if (i != options.rank) impl->sync_context->getPair(i)->setSync(true, busy_poll);
        }
      }
    } catch (const dtrain::Error&) {
      throw;
    } catch (const gloo::IoException& e) {
      impl->fail(what, e.what());
    } catch (const gloo::Exception& e) {
      impl->fail(what, e.what());
    } catch (const gloo::EnforceNotMet& e) {
      impl->fail(what, str_cat(e.what(), " (host '", options.host, "')"));
    }
  }
  return std::unique_ptr<Collectives>(new Collectives(std::move(impl)));
}

int Collectives::rank() const { return impl_->options.rank; }
int Collectives::size() const { return impl_->options.world_size; }
int64_t Collectives::generation() const { return impl_->generation; }
const std::vector<PeerInfo>& Collectives::peers() const { return impl_->peers; }
bool Collectives::broken() const { return impl_->broken; }
bool Collectives::uses_shared_memory() const { return impl_->shm != nullptr; }

void Collectives::all_reduce(std::span<Tensor> tensors, ReduceOp op) {
  for (const Tensor& t : tensors) {
    DTRAIN_CHECK(t.defined(), "all_reduce: undefined tensor");
    DTRAIN_CHECK(supported_reduce_dtype(t.dtype()), "all_reduce: dtype ", dtype_name(t.dtype()),
                 " is not supported (float32, float64, int32, int64)");
    DTRAIN_CHECK(
        op == ReduceOp::kSum || t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat64,
        "all_reduce: MEAN needs a floating-point dtype, got ", dtype_name(t.dtype()));
  }
  if (size() == 1) return;
  Impl& m = *impl_;
  const double factor = op == ReduceOp::kMean ? 1.0 / size() : 1.0;
  m.guarded("all_reduce", [&] {
    size_t bucket_index = 0;
    size_t i = 0;
    while (i < tensors.size()) {
      const DType d = tensors[i].dtype();
      bool in_place = false;
      size_t total = 0;
      const size_t j = m.bucket_end(tensors, i, &in_place, &total);
      if (in_place) {
        // A big tensor is reduced where it is: no copy.
        m.reduce_buffer(nullptr, tensors[i].raw_data(), d, tensors[i].num_elements());
        if (factor != 1.0) scale(tensors[i].raw_data(), d, tensors[i].num_elements(), factor);
        ++i;
        continue;
      }
      // Tensors [i, j) of dtype d go into one bucket.
      if (m.shm) {  // the same bucket, summed straight from and into the tensors
        m.segments.clear();
        for (size_t k = i; k < j; ++k) {
          m.segments.push_back(
              {tensors[k].raw_data(), static_cast<size_t>(tensors[k].num_elements())});
        }
        m.shm_reduce(m.segments, d, total / dtype_size(d));
        for (size_t k = i; k < j; ++k) {
          if (factor != 1.0) scale(tensors[k].raw_data(), d, tensors[k].num_elements(), factor);
        }
        i = j;
        continue;
      }
      if (m.buckets.size() <= bucket_index) m.buckets.resize(bucket_index + 1);
      Bucket& b = m.buckets[bucket_index++];
      b.reserve_bytes(total);
      auto* dst = reinterpret_cast<char*>(b.data());
      for (size_t k = i; k < j; ++k) {
        std::memcpy(dst, tensors[k].raw_data(), tensors[k].nbytes());
        dst += tensors[k].nbytes();
      }
      const size_t count = total / dtype_size(d);
      m.reduce_buffer(&b, b.data(), d, count);
      if (factor != 1.0) scale(b.data(), d, count, factor);
      const char* src = reinterpret_cast<const char*>(b.data());
      for (size_t k = i; k < j; ++k) {
        std::memcpy(tensors[k].raw_data(), src, tensors[k].nbytes());
        src += tensors[k].nbytes();
      }
      i = j;
    }
  });
}

double Collectives::all_reduce_scalar(double value, ReduceOp op) {
  if (size() == 1) return value;
  Impl& m = *impl_;
  Bucket& b = m.scalar_bucket;
  b.reserve_bytes(sizeof(double));
  std::memcpy(b.data(), &value, sizeof(double));
  m.guarded("all_reduce_scalar", [&] { m.reduce_buffer(&b, b.data(), DType::kFloat64, 1); });
  double out;
  std::memcpy(&out, b.data(), sizeof(double));
  return op == ReduceOp::kMean ? out / size() : out;
}

void Collectives::broadcast(std::span<Tensor> tensors, int root) {
  DTRAIN_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is out of range for ",
               size(), " workers");
  for (const Tensor& t : tensors) DTRAIN_CHECK(t.defined(), "broadcast: undefined tensor");
  if (size() == 1) return;
  Impl& m = *impl_;
  m.guarded("broadcast", [&] {
    auto run = [&](void* ptr, size_t bytes) {
      if (m.shm) return m.shm->broadcast(ptr, bytes, root);
      gloo::BroadcastOptions opts(m.context);
      opts.setOutput(static_cast<uint8_t*>(ptr), bytes);
      opts.setRoot(root);
      opts.setTimeout(m.options.timeout);
      gloo::broadcast(opts);
    };
    if (m.buckets.empty()) m.buckets.resize(1);
    Bucket& b = m.buckets[0];
    size_t i = 0;
    while (i < tensors.size()) {
      if (tensors[i].nbytes() >= m.options.bucket_bytes) {
        run(tensors[i].raw_data(), tensors[i].nbytes());
        ++i;
        continue;
      }
      size_t j = i, total = 0;
      while (j < tensors.size() && tensors[j].nbytes() < m.options.bucket_bytes &&
             total + tensors[j].nbytes() <= m.options.bucket_bytes) {
        total += tensors[j].nbytes();
        ++j;
      }
      b.reserve_bytes(total);
      auto* p = reinterpret_cast<char*>(b.data());
      if (rank() == root) {
        for (size_t k = i; k < j; ++k) {
          std::memcpy(p, tensors[k].raw_data(), tensors[k].nbytes());
          p += tensors[k].nbytes();
        }
      }
      if (total > 0) run(b.data(), total);
      p = reinterpret_cast<char*>(b.data());
      for (size_t k = i; k < j; ++k) {
        std::memcpy(tensors[k].raw_data(), p, tensors[k].nbytes());
        p += tensors[k].nbytes();
      }
      i = j;
    }
  });
}

void Collectives::all_gather(const Tensor& local, Tensor& out) {
  DTRAIN_CHECK(local.defined() && out.defined(), "all_gather: undefined tensor");
  DTRAIN_CHECK(out.dtype() == local.dtype() &&
                   out.nbytes() == local.nbytes() * static_cast<size_t>(size()) &&
                   out.rank() >= 1 && out.dim(0) == size(),
               "all_gather: output ", out.to_string(0), " does not hold ", size(), " copies of ",
               local.to_string(0));
  if (size() == 1) {
    out.copy_from(local.reshape(out.shape()));
    return;
  }
  Impl& m = *impl_;
  m.guarded("all_gather", [&] {
    if (m.shm) {
      const std::vector<size_t> bytes(size(), local.nbytes());
      return m.shm->all_gather_v(local.raw_data(), out.raw_data(), bytes);
    }
    gloo::AllgatherOptions opts(m.context);
    opts.setInput(static_cast<uint8_t*>(const_cast<void*>(local.raw_data())), local.nbytes());
    opts.setOutput(static_cast<uint8_t*>(out.raw_data()), out.nbytes());
    opts.setTimeout(m.options.timeout);
    gloo::allgather(opts);
  });
}

void Collectives::all_gather_v(const void* local, void* out,
                               std::span<const size_t> bytes_per_rank) {
  DTRAIN_CHECK(static_cast<int>(bytes_per_rank.size()) == size(),
               "all_gather_v: ", bytes_per_rank.size(), " sizes for ", size(), " workers");
  size_t total = 0;
  for (size_t b : bytes_per_rank) total += b;
  if (size() == 1) {
    if (total > 0 && out != local) std::memmove(out, local, total);
    return;
  }
  if (total == 0) return;
  Impl& m = *impl_;
  m.guarded("all_gather_v", [&] {
    if (m.shm) return m.shm->all_gather_v(local, out, bytes_per_rank);
    gloo::AllgathervOptions opts(m.context);
    opts.setInput(static_cast<uint8_t*>(const_cast<void*>(local)), bytes_per_rank[rank()]);
    opts.setOutput(static_cast<uint8_t*>(out),
                   std::vector<size_t>(bytes_per_rank.begin(), bytes_per_rank.end()));
    opts.setTimeout(m.options.timeout);
    gloo::allgatherv(opts);
  });
}

void Collectives::all_gather_v(const void* local, std::span<const std::span<std::byte>> out,
                               std::span<const size_t> bytes_per_rank) {
  DTRAIN_CHECK(static_cast<int>(bytes_per_rank.size()) == size(),
               "all_gather_v: ", bytes_per_rank.size(), " sizes for ", size(), " workers");
  size_t total = 0, room = 0;
  for (size_t b : bytes_per_rank) total += b;
  for (const std::span<std::byte>& o : out) room += o.size();
  DTRAIN_CHECK(room == total, "all_gather_v: the output ranges hold ", room, " bytes, the ranks ",
               total);
  Impl& m = *impl_;
  if (size() > 1 && total > 0 && m.shm) {
    m.guarded("all_gather_v", [&] { m.shm->all_gather_v(local, out, bytes_per_rank); });
    return;
  }
  m.gathered.resize(total);
  size_t own_at = 0;  // this rank's part of the concatenation
  for (int k = 0; k < rank(); ++k) own_at += bytes_per_rank[k];
  const size_t own_end = own_at + bytes_per_rank[rank()];
  // Copies the ranges' bytes [b, e) of the concatenation to (or from) the buffer.
  const auto each = [&](size_t b, size_t e, bool into_ranges) {
    size_t at = 0;
    for (const std::span<std::byte>& o : out) {
      const size_t lo = std::max(b, at), hi = std::min(e, at + o.size());
      if (lo < hi) {
        char* range = reinterpret_cast<char*>(o.data()) + (lo - at);
        char* buffer = m.gathered.data() + lo;
        into_ranges ? std::memcpy(range, buffer, hi - lo) : std::memcpy(buffer, range, hi - lo);
      }
      at += o.size();
    }
  };
  if (local == nullptr) {
    if (size() == 1) return;  // everything is in place
    each(own_at, own_end, /*into_ranges=*/false);
    m.gathered_own.assign(m.gathered.begin() + own_at, m.gathered.begin() + own_end);
  }
  all_gather_v(local == nullptr ? m.gathered_own.data() : local, m.gathered.data(), bytes_per_rank);
  each(0, own_at, true);
  each(own_end, total, true);
  if (local != nullptr) each(own_at, own_end, true);
}

void Collectives::barrier() {
  if (size() == 1) return;
  Impl& m = *impl_;
  m.guarded("barrier", [&] {
    if (m.shm) return m.shm->barrier();
    gloo::BarrierOptions opts(m.context);
    opts.setTimeout(m.options.timeout);
    gloo::barrier(opts);
  });
}

}  // namespace dtrain::distribute
