// 2x2, stride-2 max pooling on NHWC, 8 channels per AVX2 register: the four positions of a window
// stay in registers, where the general tiled path (pooling.cc) keeps per-channel maxima and masks
// in arrays on the stack over a runtime-sized channel block. Without AVX2 in the build the
// general path takes every shape.
#include "max_pool_2x2.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>

#include "dtrain/core/parallel_for.h"

namespace dtrain::ops::detail {

#if defined(__AVX2__)

bool max_pool_2x2_applies(const MaxPool2x2& g) {
  return g.c > 0 && g.c % 8 == 0 && g.oh > 0 && g.ow > 0 && 2 * g.oh <= g.h && 2 * g.ow <= g.w;
}

void max_pool_2x2_forward(const MaxPool2x2& g, const float* x, float* y) {
  const int64_t row = g.w * g.c;
  const __m256 lowest = _mm256_set1_ps(-__builtin_inff());
  // Images are independent: split the batch.
  parallel_for(g.n, grain_for(g.h * row), [&](int64_t n_begin, int64_t n_end) {
    for (int64_t n = n_begin; n < n_end; ++n) {
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const float* top = x + (n * g.h + 2 * oy) * row;
        float* out = y + (n * g.oh + oy) * g.ow * g.c;
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const float* p = top + 2 * ox * g.c;
          float* o = out + ox * g.c;
          for (int64_t c = 0; c < g.c; c += 8) {
            // _mm256_max_ps(v, m) is v > m ? v : m: the scan's "replace only when greater".
            __m256 m = _mm256_max_ps(_mm256_loadu_ps(p + c), lowest);
            m = _mm256_max_ps(_mm256_loadu_ps(p + g.c + c), m);
            m = _mm256_max_ps(_mm256_loadu_ps(p + row + c), m);
            m = _mm256_max_ps(_mm256_loadu_ps(p + row + g.c + c), m);
            _mm256_storeu_ps(o + c, m);
          }
        }
      }
    }
  });
}

void max_pool_2x2_backward(const MaxPool2x2& g, const float* x, const float* dy, float* dx) {
  const int64_t row = g.w * g.c;
  const __m256 zero = _mm256_setzero_ps();
  const __m256 ones = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  parallel_for(g.n, grain_for(g.h * row), [&](int64_t n_begin, int64_t n_end) {
    for (int64_t n = n_begin; n < n_end; ++n) {
      const float* img = x + n * g.h * row;
      float* dimg = dx + n * g.h * row;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const float* top = img + 2 * oy * row;
        float* dtop = dimg + 2 * oy * row;
        const float* gy = dy + (n * g.oh + oy) * g.ow * g.c;
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const int64_t at = 2 * ox * g.c;
          for (int64_t c = 0; c < g.c; c += 8) {
            const float* p = top + at + c;
            float* d = dtop + at + c;
            const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + g.c),
                         e = _mm256_loadu_ps(p + row), f = _mm256_loadu_ps(p + row + g.c);
            // The maximum as the scan finds it from the first position (a NaN there stays).
            const __m256 m = _mm256_max_ps(f, _mm256_max_ps(e, _mm256_max_ps(b, a)));
            // 0 + dy, as the general path's += into zeros (−0 becomes +0).
            const __m256 grad = _mm256_add_ps(zero, _mm256_loadu_ps(gy + ox * g.c + c));
            // The first position equal to m takes the gradient (ordered compares: NaN equals
            // nothing, and then no position is hit and the first one takes it).
            const __m256 ha = _mm256_cmp_ps(a, m, _CMP_EQ_OQ);
            __m256 taken = ha;
            const __m256 hb = _mm256_andnot_ps(taken, _mm256_cmp_ps(b, m, _CMP_EQ_OQ));
            taken = _mm256_or_ps(taken, hb);
            const __m256 he = _mm256_andnot_ps(taken, _mm256_cmp_ps(e, m, _CMP_EQ_OQ));
            taken = _mm256_or_ps(taken, he);
            const __m256 hf = _mm256_andnot_ps(taken, _mm256_cmp_ps(f, m, _CMP_EQ_OQ));
            taken = _mm256_or_ps(taken, hf);
            const __m256 first = _mm256_or_ps(ha, _mm256_xor_ps(taken, ones));
            _mm256_storeu_ps(d, _mm256_and_ps(grad, first));
            _mm256_storeu_ps(d + g.c, _mm256_and_ps(grad, hb));
            _mm256_storeu_ps(d + row, _mm256_and_ps(grad, he));
            _mm256_storeu_ps(d + row + g.c, _mm256_and_ps(grad, hf));
          }
        }
        // Columns right of the last window in this band of two rows.
        for (int64_t iy = 2 * oy; iy < 2 * oy + 2; ++iy) {
          std::fill(dimg + iy * row + 2 * g.ow * g.c, dimg + (iy + 1) * row, 0.0f);
        }
      }
      std::fill(dimg + 2 * g.oh * row, dimg + g.h * row, 0.0f);  // rows below the last window
    }
  });
}

#else

bool max_pool_2x2_applies(const MaxPool2x2&) { return false; }
void max_pool_2x2_forward(const MaxPool2x2&, const float*, float*) {}
void max_pool_2x2_backward(const MaxPool2x2&, const float*, const float*, float*) {}

#endif

}  // namespace dtrain::ops::detail
