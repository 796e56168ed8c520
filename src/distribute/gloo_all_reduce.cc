// The Gloo all-reduce algorithms behind Collectives::all_reduce, by dtype.
#include "gloo_all_reduce.h"

#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/math.h>

#include "dtrain/core/error.h"

namespace dtrain::distribute {
namespace {
template <class T>
std::unique_ptr<gloo::Algorithm> make_old_style(const std::shared_ptr<gloo::Context>& ctx,
                                                AllreduceAlgorithm a, void* ptr, size_t count) {
  std::vector<T*> ptrs{static_cast<T*>(ptr)};
  const int n = static_cast<int>(count);
  switch (a) {
    case AllreduceAlgorithm::kRing:
      return std::make_unique<gloo::AllreduceRing<T>>(ctx, ptrs, n);
    case AllreduceAlgorithm::kRingChunked:
      return std::make_unique<gloo::AllreduceRingChunked<T>>(ctx, ptrs, n);
    case AllreduceAlgorithm::kHalvingDoubling:
      return std::make_unique<gloo::AllreduceHalvingDoubling<T>>(ctx, ptrs, n);
    default:
      DTRAIN_INTERNAL_CHECK(false, "not an old-style algorithm");
  }
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <class T>
void new_style_allreduce(const std::shared_ptr<gloo::Context>& ctx, void* ptr, size_t count,
                         std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(static_cast<T*>(ptr), count);
  opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<T>));
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

}  // namespace

std::unique_ptr<gloo::Algorithm> make_old_style(const std::shared_ptr<gloo::Context>& ctx,
                                                AllreduceAlgorithm a, DType d, void* ptr,
                                                size_t count) {
  switch (d) {
    case DType::kFloat32:
      return make_old_style<float>(ctx, a, ptr, count);
    case DType::kFloat64:
      return make_old_style<double>(ctx, a, ptr, count);
    case DType::kInt32:
      return make_old_style<int32_t>(ctx, a, ptr, count);
    case DType::kInt64:
      return make_old_style<int64_t>(ctx, a, ptr, count);
    default:
      DTRAIN_INTERNAL_CHECK(false, "unsupported dtype");
  }
}

void new_style_allreduce(const std::shared_ptr<gloo::Context>& ctx, DType d, void* ptr,
                         size_t count, std::chrono::milliseconds timeout) {
  switch (d) {
    case DType::kFloat32:
      return new_style_allreduce<float>(ctx, ptr, count, timeout);
    case DType::kFloat64:
      return new_style_allreduce<double>(ctx, ptr, count, timeout);
    case DType::kInt32:
      return new_style_allreduce<int32_t>(ctx, ptr, count, timeout);
    case DType::kInt64:
      return new_style_allreduce<int64_t>(ctx, ptr, count, timeout);
    default:
      DTRAIN_INTERNAL_CHECK(false, "unsupported dtype");
  }
}

}  // namespace dtrain::distribute
