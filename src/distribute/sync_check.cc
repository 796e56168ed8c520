// verify_sync: all-gather CRC-32Cs of the variables (plus a digest of their names) and compare.
#include "dtrain/distribute/sync_check.h"

#include "dtrain/core/crc32c.h"
#include "dtrain/core/error.h"

namespace dtrain::distribute {

uint32_t tensor_checksum(const Tensor& t) {
  const int32_t dtype = static_cast<int32_t>(t.dtype());
  uint32_t crc = crc32c::extend(0, &dtype, sizeof(dtype));
  for (int i = 0; i < t.rank(); ++i) {
    const int64_t d = t.dim(i);
    crc = crc32c::extend(crc, &d, sizeof(d));
  }
  return crc32c::extend(crc, t.raw_data(), t.nbytes());
}

void verify_sync(Strategy& strategy, std::span<const NamedTensor> variables, int64_t step) {
  const int workers = strategy.num_workers();
  const int64_t n = static_cast<int64_t>(variables.size());
  // Row layout per worker: [count, names digest, crc_0, ..., crc_{n-1}]. The first gather makes
  // sure the rows have the same length before the second one.
  uint32_t names = 0;
  for (const auto& v : variables) names = crc32c::extend(names, v.name.data(), v.name.size() + 1);
  Tensor head = Tensor::from_vector<int64_t>({n, static_cast<int64_t>(names)}, {2});
  Tensor heads(DType::kInt64, {workers, 2});
  strategy.all_gather_across_workers(head, heads);
  const int64_t* h = heads.data<int64_t>();
  const std::string at = step >= 0 ? str_cat(" at step ", step) : std::string();
  for (int w = 1; w < workers; ++w) {
    if (h[2 * w] != h[0]) {
      throw InternalError(str_cat("verify_sync", at, ": worker ", w, " has ", h[2 * w],
                                  " variables, the chief has ", h[0]));
    }
    if (h[2 * w + 1] != h[1]) {
      throw InternalError(str_cat("verify_sync", at, ": worker ", w,
                                  " names its variables differently from the chief"));
    }
  }
  if (n == 0) return;
  Tensor mine(DType::kInt64, {n});
  int64_t* m = mine.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) m[i] = tensor_checksum(variables[i].value);
  Tensor all(DType::kInt64, {workers, n});
  strategy.all_gather_across_workers(mine, all);
  const int64_t* a = all.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::string differing;
    for (int w = 1; w < workers; ++w) {
      if (a[w * n + i] != a[i]) differing += (differing.empty() ? "" : ", ") + std::to_string(w);
    }
    if (!differing.empty()) {
      throw InternalError(str_cat("verify_sync", at, ": replicas diverged: variable '",
                                  variables[i].name, "' ", variables[i].value.to_string(0),
                                  " differs from the chief (worker 0) on worker(s) ", differing,
                                  " (CRC-32C ", std::hex, a[i],
                                  " on the chief); variables are no longer "
                                  "mirrored"));
    }
  }
}

void verify_sync(Strategy& strategy, std::span<Variable* const> variables, int64_t step) {
  std::vector<NamedTensor> named;
  named.reserve(variables.size());
  for (Variable* v : variables) named.push_back({v->name(), v->tensor()});
  verify_sync(strategy, named, step);
}

}  // namespace dtrain::distribute
