// GEMM via OpenBLAS. Only this file includes cblas.h.
//
// Threads: with DTRAIN_GEMM_THREADS=team (the default) OpenBLAS runs single-threaded and a large
// GEMM runs as fixed row blocks spread over parallel_for's team, the libgomp team oneDNN and
// dtrain's other kernels run on: one set of worker threads for the whole step instead of two
// that spin against each other on the same cores, and the same bits for any thread count
// (docs/decisions.md). DTRAIN_GEMM_THREADS=openblas hands the threads to OpenBLAS's own pool
// instead (faster for some shapes, but its results change with the thread count).
#include "dtrain/ops/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "dtrain/core/cpus.h"
#include "dtrain/core/error.h"
#include "dtrain/core/float_env.h"
#include "dtrain/core/parallel_for.h"

namespace dtrain::ops {
namespace {

// Whether GEMMs split over parallel_for's team (DTRAIN_GEMM_THREADS: unset, "" or "team") or
// run on OpenBLAS's pool ("openblas"); anything else is reported by set_num_threads and gemm.
enum class GemmThreads { kTeam, kOpenBlas, kMalformed };

GemmThreads gemm_threads_setting() {
  static const GemmThreads setting = [] {
    const char* v = std::getenv("DTRAIN_GEMM_THREADS");
    const std::string s = v == nullptr ? "" : v;
    if (s.empty() || s == "team") return GemmThreads::kTeam;
    if (s == "openblas") return GemmThreads::kOpenBlas;
    return GemmThreads::kMalformed;
  }();
  return setting;
}

bool gemm_on_team() {
  const GemmThreads setting = gemm_threads_setting();
  if (setting == GemmThreads::kMalformed) {
    throw InvalidArgumentError(str_cat("DTRAIN_GEMM_THREADS is '",
                                       std::getenv("DTRAIN_GEMM_THREADS"),
                                       "'; expected 'team' (the default) or 'openblas'"));
  }
  return setting == GemmThreads::kTeam;
}

// parallel_for's team starts with OpenBLAS's own count, so that a program that never calls
// set_num_threads runs every kernel on the same threads; in team mode OpenBLAS itself then runs
// single-threaded. OpenBLAS's count is the variable a user set (OPENBLAS_NUM_THREADS,
// GOTO_NUM_THREADS, OMP_NUM_THREADS), else the host's CPUs, which a container's CPU quota does
// not reduce: without a variable the team is capped at usable_cpus().
bool thread_count_variable_set() {
  for (const char* name : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && std::atoi(v) > 0) return true;
  }
  return false;
}

const bool g_intra_op_synced = [] {
  const int n = std::max(1, openblas_get_num_threads());
  const int team = thread_count_variable_set() ? n : std::min(n, usable_cpus());
  set_intra_op_threads(team);
  if (gemm_threads_setting() == GemmThreads::kTeam) {
    openblas_set_num_threads(1);
  } else if (team != n) {
    openblas_set_num_threads(team);
  }
  return true;
}();

// Team mode computes a large GEMM as row blocks of C, each one single-threaded OpenBLAS call
// over all of K, and hands the blocks to parallel_for's threads. The blocks depend on the shape
// only, never on the thread count: OpenBLAS's result for an element depends on how the call is
// blocked internally (splitting a product's rows anywhere but at its internal block size changes
// the last bits, and so does OpenBLAS's own threading), so a fixed split is what makes the result
// the same for every thread count. At most kMaxBlocks blocks (each repacks B), each of at least
// kMinBlockWork multiply-adds and a multiple of 16 rows (whole micro-tiles).
constexpr int64_t kMaxBlocks = 8;
constexpr int64_t kMinBlockWork = int64_t{1} << 21;

int64_t block_rows(int64_t m, int64_t n, int64_t k) {
  const int64_t per_row = std::max<int64_t>(1, n * k);
  const int64_t by_work = (kMinBlockWork + per_row - 1) / per_row;
  const int64_t by_count = (m + kMaxBlocks - 1) / kMaxBlocks;
  return (std::max({int64_t{16}, by_work, by_count}) + 15) / 16 * 16;
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // A malformed DTRAIN_FLUSH_DENORMALS is reported by the first GEMM of a program that reads the
  // setting nowhere else (after that, one initialized-static check per call).
  static const bool checked = (flush_denormals_enabled(), true);
  (void)checked;
  if (k > 0 && gemm_on_team()) {
    const int64_t rows = block_rows(m, n, k);
    if (m >= 2 * rows) {
      // Ranges start on block boundaries; each block is its own call whatever the range.
      parallel_for(m, rows, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i += rows) {
          const int64_t r = std::min(rows, i1 - i);
          sgemm(trans_a, trans_b, r, n, k, alpha, trans_a ? a + i : a + i * lda, lda, b, ldb, beta,
                c + i * ldc, ldc);
        }
      });
      return;
    }
  }
  sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void set_num_threads(int n) {
  DTRAIN_CHECK(n >= 1, "set_num_threads: need at least one thread, got ", n);
  openblas_set_num_threads(gemm_on_team() ? 1 : n);
  set_intra_op_threads(n);
}

int num_threads() { return intra_op_threads(); }

}  // namespace dtrain::ops
