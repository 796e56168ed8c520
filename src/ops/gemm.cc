// GEMM via OpenBLAS. Only this file includes cblas.h.
#include "dtrain/ops/gemm.h"

#include <cblas.h>

#include "dtrain/core/error.h"
#include "dtrain/core/float_env.h"
#include "dtrain/core/parallel_for.h"

namespace dtrain::ops {
namespace {

// parallel_for's team starts with OpenBLAS's own count (OPENBLAS_NUM_THREADS, else the cores),
// so that a program that never calls set_num_threads runs every kernel on the same threads.
const bool g_intra_op_synced = (set_intra_op_threads(openblas_get_num_threads()), true);

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // A malformed DTRAIN_FLUSH_DENORMALS is reported by the first GEMM of a program that reads the
  // setting nowhere else (after that, one initialized-static check per call).
  static const bool checked = (flush_denormals_enabled(), true);
  (void)checked;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void set_num_threads(int n) {
  DTRAIN_CHECK(n >= 1, "set_num_threads: need at least one thread, got ", n);
  openblas_set_num_threads(n);
  set_intra_op_threads(n);
}

int num_threads() { return openblas_get_num_threads(); }

}  // namespace dtrain::ops
