// Dense matrix multiply through OpenBLAS's cblas_sgemm, and control of BLAS threads.
// Thread-safe (OpenBLAS is built with thread-safe pthreads); callers sharing cores with
// replica threads should set num_threads so BLAS and replicas do not oversubscribe.
#pragma once

#include <cstdint>

namespace dtrain::ops {

// C[m, n] = alpha * op(A) · op(B) + beta * C, row-major. op(A) is [m, k]: A is [m, k] with
// leading dimension lda, or [k, m] when trans_a. op(B) is [k, n]: B is [k, n], or [n, k] when
// trans_b. Blocks until done.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The dense layers' product: C[m, n] = op(A) · op(B) + bias (bias [n], broadcast over the rows;
// nullptr: none), overwriting C; op as for gemm. Packs op(B) once and reads A in place, and every
// element's bits are the same for any thread count and for AVX2 and AVX-512 builds. Below 2^20
// multiply-adds, and where the build has no AVX2 + FMA, OpenBLAS's gemm. b_column_sums [n], if not
// null (only without trans_b), receives Σ_l B(l, j) for each column, summed in increasing l from 0
// in float (ops::column_sum's order and bits): a dense layer's bias gradient from the pass that
// packs dz for dW = xᵀ·dz.
void dense_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                int64_t lda, const float* b, int64_t ldb, const float* bias, float* c, int64_t ldc,
                float* b_column_sums = nullptr);

// Sets the number of threads OpenBLAS, oneDNN's convolutions and dtrain's own kernels
// (core/parallel_for.h) use (process-wide). n >= 1.
void set_num_threads(int n);
// The number of threads OpenBLAS uses.
int num_threads();

}  // namespace dtrain::ops
