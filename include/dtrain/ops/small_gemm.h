// A register-blocked float GEMM for the small per-head products of causal attention (T×T×H with
// H = 32 or so), which OpenBLAS serves poorly: it packs both operands on every call, and cannot
// skip the masked triangle. C = A·B with A read through two strides (so Aᵀ costs nothing) and
// B row-major; optionally only the causal part of C or of the inner dimension. AVX2 + FMA when
// the build targets them (a 6×16 block in 12 registers; with AVX-512 a 12×32 block in 24),
// plain loops otherwise.
// Thread-safe for distinct outputs; allocates nothing.
#pragma once

#include <cstdint>

namespace dtrain::ops {

// Which part of the product a causal (lower-triangular, key s ≤ query t) attention needs, for
// square products whose row index i and inner or column index are positions in one sequence.
enum class CausalPart {
  kNone,            // the whole product
  kColumnsUpToRow,  // C(i, j) for j ≤ i; C(i, j) = 0 for j > i
  kInnerUpToRow,    // C(i, :) = Σ_{l ≤ i} A(i, l) B(l, :): A(i, l), l > i, is not read
  kInnerFromRow,    // C(i, :) = Σ_{l ≥ i} A(i, l) B(l, :): A(i, l), l < i, is not read
};

struct SmallGemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;  // A(i, l) = a[i·a_row_stride + l·a_inner_stride]
  int64_t a_row_stride = 0;
  int64_t a_inner_stride = 1;
  const float* b = nullptr;  // B(l, j) = b[l·ldb + j]
  int64_t ldb = 0;
  float* c = nullptr;  // C(i, j) = c[i·ldc + j], overwritten (or added to: `accumulate`)
  int64_t ldc = 0;
  CausalPart causal = CausalPart::kNone;
  // C += A·B instead of C = A·B (not with kColumnsUpToRow, which writes C's upper triangle).
  bool accumulate = false;
};

// C = A·B over the part `causal` selects. Each C(i, j) adds its terms by one FMA each in
// increasing l (from 0, or from C's value with `accumulate`), so the bits are the same on every
// instruction set the build may target.
void small_gemm(const SmallGemmArgs& g);

}  // namespace dtrain::ops
