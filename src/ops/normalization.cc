// Batch and layer normalization kernels. Loops run over contiguous memory innermost: for
// channels-last layouts (inner = 1) along the channels of a row, otherwise along inner.
// parallel_for splits them along independent axes only: the normalizing passes over rows, the
// moment and gradient sums over channels (each channel's sum still runs over the rows in order),
// so every result is the same for any thread count.
#include "dtrain/ops/normalization.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dtrain/core/parallel_for.h"

namespace dtrain::ops {
namespace {

// Per-thread scratch of at least n doubles, zeroed; grows, never shrinks (no allocation once
// the largest layer has run).
double* scratch(size_t slot, int64_t n) {
  thread_local std::vector<double> buffers[3];
  std::vector<double>& b = buffers[slot];
  if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
  std::fill_n(b.data(), n, 0.0);
  return b.data();
}

}  // namespace

void channel_sums(const float* x, ChannelLayout l, double* sum, const float* shift, double* sq) {
  const int64_t c = l.channels, inner = l.inner;
  const int64_t grain =
      inner == 1 ? std::max<int64_t>(16, grain_for(l.outer)) : grain_for(l.outer * inner);
  parallel_for(c, grain, [&](int64_t j0, int64_t j1) {
    std::fill(sum + j0, sum + j1, 0.0);
    if (shift) std::fill(sq + j0, sq + j1, 0.0);
    if (inner == 1) {
      for (int64_t o = 0; o < l.outer; ++o) {
        const float* xr = x + o * c;
        for (int64_t j = j0; j < j1; ++j) sum[j] += xr[j];
        if (shift) {
          for (int64_t j = j0; j < j1; ++j) {
            const double d = static_cast<double>(xr[j]) - shift[j];
            sq[j] += d * d;
          }
        }
      }
      return;
    }
    for (int64_t o = 0; o < l.outer; ++o) {
      for (int64_t j = j0; j < j1; ++j) {
        const float* xr = x + (o * c + j) * inner;
        double s = 0, q = 0;
        for (int64_t i = 0; i < inner; ++i) s += xr[i];
        if (shift) {
          const double m = shift[j];
          for (int64_t i = 0; i < inner; ++i) {
            const double d = static_cast<double>(xr[i]) - m;
            q += d * d;
          }
          sq[j] += q;
        }
        sum[j] += s;
      }
    }
  });
}

void batch_norm_moments(const float* x, ChannelLayout l, float* mean, float* var) {
  const int64_t c = l.channels;
  double* sum = scratch(0, c);
  double* sq = scratch(1, c);
  const double inv_m = l.count() > 0 ? 1.0 / static_cast<double>(l.count()) : 0.0;
  channel_sums(x, l, sum, nullptr, nullptr);
  for (int64_t j = 0; j < c; ++j) mean[j] = static_cast<float>(sum[j] * inv_m);
  channel_sums(x, l, sum, mean, sq);
  for (int64_t j = 0; j < c; ++j) var[j] = static_cast<float>(sq[j] * inv_m);
}

void batch_norm_apply(const float* x, ChannelLayout l, const float* mean, const float* var,
                      const float* gamma, const float* beta, float epsilon, float* y,
                      float* inv_std) {
  const int64_t c = l.channels, inner = l.inner;
  // y = (x − mean)·a + β with a = γ·rsqrt(var + ε).
  double* a = scratch(0, c);
  double* b = scratch(1, c);
  for (int64_t j = 0; j < c; ++j) {
    const float inv = 1.0f / std::sqrt(var[j] + epsilon);
    if (inv_std) inv_std[j] = inv;
    a[j] = (gamma ? gamma[j] : 1.0f) * inv;
    b[j] = beta ? beta[j] : 0.0f;
  }
  parallel_for(l.outer, grain_for(c * inner), [&](int64_t o0, int64_t o1) {
    if (inner == 1) {
      for (int64_t o = o0; o < o1; ++o) {
        const float* xr = x + o * c;
        float* yr = y + o * c;
        for (int64_t j = 0; j < c; ++j) {
          yr[j] = (xr[j] - mean[j]) * static_cast<float>(a[j]) + static_cast<float>(b[j]);
        }
      }
      return;
    }
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t j = 0; j < c; ++j) {
        const float* xr = x + (o * c + j) * inner;
        float* yr = y + (o * c + j) * inner;
        const float aj = static_cast<float>(a[j]), mj = mean[j], bj = static_cast<float>(b[j]);
        for (int64_t i = 0; i < inner; ++i) yr[i] = (xr[i] - mj) * aj + bj;
      }
    }
  });
}

void batch_norm_backward_sums(const float* dy, const float* x, ChannelLayout l, const float* mean,
                              const float* inv_std, double* sums) {
  const int64_t c = l.channels, inner = l.inner;
  double* sdy = sums;
  double* sdyx = sums + c;
  const int64_t grain =
      inner == 1 ? std::max<int64_t>(16, grain_for(2 * l.outer)) : grain_for(2 * l.outer * inner);
  parallel_for(c, grain, [&](int64_t j0, int64_t j1) {
    std::fill(sdy + j0, sdy + j1, 0.0);
    std::fill(sdyx + j0, sdyx + j1, 0.0);
    if (inner == 1) {
      for (int64_t o = 0; o < l.outer; ++o) {
        const float* g = dy + o * c;
        const float* xr = x + o * c;
        for (int64_t j = j0; j < j1; ++j) {
          sdy[j] += g[j];
          sdyx[j] += static_cast<double>(g[j]) * ((xr[j] - mean[j]) * inv_std[j]);
        }
      }
      return;
    }
    for (int64_t o = 0; o < l.outer; ++o) {
      for (int64_t j = j0; j < j1; ++j) {
        const float* g = dy + (o * c + j) * inner;
        const float* xr = x + (o * c + j) * inner;
        const float mj = mean[j], ij = inv_std[j];
        double s = 0, q = 0;
        for (int64_t i = 0; i < inner; ++i) {
          s += g[i];
          q += static_cast<double>(g[i]) * ((xr[i] - mj) * ij);
        }
        sdy[j] += s;
        sdyx[j] += q;
      }
    }
  });
}

void batch_norm_backward(const float* dy, const float* x, ChannelLayout l, const float* mean,
                         const float* inv_std, const float* gamma, float* dx, float* dgamma,
                         float* dbeta, const double* sums, int64_t count) {
  const int64_t c = l.channels, inner = l.inner;
  double* local = scratch(2, 2 * c);
  batch_norm_backward_sums(dy, x, l, mean, inv_std, local);
  for (int64_t j = 0; j < c; ++j) {
    if (dbeta) dbeta[j] = static_cast<float>(local[j]);
    if (dgamma) dgamma[j] = static_cast<float>(local[c + j]);
  }
  if (!dx) return;
  const double* s = sums ? sums : local;
  const double m = static_cast<double>(sums ? count : l.count());
  // dx = k·(dy − Σdy/M − x̂·Σ(dy·x̂)/M) with k = γ·inv_std.
  double* k = scratch(0, c);
  double* mdy = scratch(1, 2 * c);
  for (int64_t j = 0; j < c; ++j) {
    k[j] = (gamma ? gamma[j] : 1.0f) * inv_std[j];
    mdy[j] = m > 0 ? s[j] / m : 0.0;
    mdy[c + j] = m > 0 ? s[c + j] / m : 0.0;
  }
  parallel_for(l.outer, grain_for(2 * c * inner), [&](int64_t o0, int64_t o1) {
    if (inner == 1) {
      for (int64_t o = o0; o < o1; ++o) {
        const float* g = dy + o * c;
        const float* xr = x + o * c;
        float* d = dx + o * c;
        for (int64_t j = 0; j < c; ++j) {
          const double xh = (xr[j] - mean[j]) * inv_std[j];
          d[j] = static_cast<float>(k[j] * (g[j] - mdy[j] - xh * mdy[c + j]));
        }
      }
      return;
    }
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t j = 0; j < c; ++j) {
        const float* g = dy + (o * c + j) * inner;
        const float* xr = x + (o * c + j) * inner;
        float* d = dx + (o * c + j) * inner;
        const float kj = static_cast<float>(k[j]), a = static_cast<float>(mdy[j]),
                    b = static_cast<float>(mdy[c + j]), mj = mean[j], ij = inv_std[j];
        for (int64_t i = 0; i < inner; ++i) d[i] = kj * (g[i] - a - (xr[i] - mj) * ij * b);
      }
    }
  });
}

void batch_norm_inference_backward(const float* dy, const float* x, ChannelLayout l,
                                   const float* mean, const float* inv_std, const float* gamma,
                                   float* dx, float* dgamma, float* dbeta) {
  const int64_t c = l.channels, inner = l.inner;
  if (dgamma || dbeta) {
    double* local = scratch(2, 2 * c);
    batch_norm_backward_sums(dy, x, l, mean, inv_std, local);
    for (int64_t j = 0; j < c; ++j) {
      if (dbeta) dbeta[j] = static_cast<float>(local[j]);
      if (dgamma) dgamma[j] = static_cast<float>(local[c + j]);
    }
  }
  if (!dx) return;
  parallel_for(l.outer, grain_for(c * inner), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t j = 0; j < c; ++j) {
        const float k = (gamma ? gamma[j] : 1.0f) * inv_std[j];
        if (inner == 1) {
          dx[o * c + j] = dy[o * c + j] * k;
        } else {
          const int64_t base = (o * c + j) * inner;
          for (int64_t i = 0; i < inner; ++i) dx[base + i] = dy[base + i] * k;
        }
      }
    }
  });
}

namespace {

// Σ term(j) over j < d in double, in 8 lanes (lane j mod 8 sums its terms in increasing j; the
// lanes are combined in a fixed order, then the tail): a layer norm row is short (d ≈ 128), and
// one chain of dependent double additions bounded the row at ~4 cycles per element.
constexpr int kSumLanes = 8;
inline double combine_lanes(const double* l) {
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

template <class Term>
double lane_sum(int64_t d, Term term) {
  double lanes[kSumLanes] = {};
  int64_t j = 0;
  for (; j + kSumLanes <= d; j += kSumLanes) {
    for (int l = 0; l < kSumLanes; ++l) lanes[l] += term(j + l);
  }
  double sum = combine_lanes(lanes);
  for (; j < d; ++j) sum += term(j);
  return sum;
}

// Two such sums over one pass: term(j, &t1, &t2).
template <class Terms>
void lane_sums(int64_t d, double* s1, double* s2, Terms terms) {
  double a[kSumLanes] = {}, b[kSumLanes] = {};
  int64_t j = 0;
  for (; j + kSumLanes <= d; j += kSumLanes) {
    for (int l = 0; l < kSumLanes; ++l) {
      double t1, t2;
      terms(j + l, &t1, &t2);
      a[l] += t1;
      b[l] += t2;
    }
  }
  double x = combine_lanes(a), y = combine_lanes(b);
  for (; j < d; ++j) {
    double t1, t2;
    terms(j, &t1, &t2);
    x += t1;
    y += t2;
  }
  *s1 = x;
  *s2 = y;
}

}  // namespace

void layer_norm_forward(const float* x, int64_t rows, int64_t d, const float* gamma,
                        const float* beta, float epsilon, float* y, float* stats) {
  const double inv_d = d > 0 ? 1.0 / static_cast<double>(d) : 0.0;
  parallel_for(rows, grain_for(3 * d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      const double s = lane_sum(d, [&](int64_t j) { return static_cast<double>(xr[j]); });
      const float mean = static_cast<float>(s * inv_d);
      const double q = lane_sum(d, [&](int64_t j) {
        const double dv = static_cast<double>(xr[j]) - mean;
        return dv * dv;
      });
      const float inv = 1.0f / std::sqrt(static_cast<float>(q * inv_d) + epsilon);
      if (stats) {
        stats[2 * r] = mean;
        stats[2 * r + 1] = inv;
      }
      for (int64_t j = 0; j < d; ++j) {
        const float xh = (xr[j] - mean) * inv;
        yr[j] = xh * (gamma ? gamma[j] : 1.0f) + (beta ? beta[j] : 0.0f);
      }
    }
  });
}

void layer_norm_backward(const float* dy, const float* x, int64_t rows, int64_t d,
                         const float* stats, const float* gamma, float* dx, float* dgamma,
                         float* dbeta) {
  const double inv_d = d > 0 ? 1.0 / static_cast<double>(d) : 0.0;
  // dx row by row (each row's sums stay within the row), split over rows.
  if (dx) {
    parallel_for(rows, grain_for(4 * d), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* g = dy + r * d;
        const float* xr = x + r * d;
        const float mean = stats[2 * r], inv = stats[2 * r + 1];
        double s1 = 0, s2 = 0;
        lane_sums(d, &s1, &s2, [&](int64_t j, double* t1, double* t2) {
          const float xh = (xr[j] - mean) * inv;
          const float gh = g[j] * (gamma ? gamma[j] : 1.0f);
          *t1 = gh;
          *t2 = static_cast<double>(gh) * xh;
        });
        const float a = static_cast<float>(s1 * inv_d), b = static_cast<float>(s2 * inv_d);
        float* dr = dx + r * d;
        for (int64_t j = 0; j < d; ++j) {
          const float xh = (xr[j] - mean) * inv;
          const float gh = g[j] * (gamma ? gamma[j] : 1.0f);
          dr[j] = inv * (gh - a - xh * b);
        }
      }
    });
  }
  if (!dgamma && !dbeta) return;
  // dγ and dβ: sums over rows per column, split over columns; each column's sum runs over the
  // rows in order (with x̂ recomputed exactly as above).
  double* sg = scratch(0, d);
  double* sb = scratch(1, d);
  parallel_for(d, std::max<int64_t>(16, grain_for(3 * rows)), [&](int64_t j0, int64_t j1) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* g = dy + r * d;
      const float* xr = x + r * d;
      const float mean = stats[2 * r], inv = stats[2 * r + 1];
      for (int64_t j = j0; j < j1; ++j) {
        const float xh = (xr[j] - mean) * inv;
        sg[j] += static_cast<double>(g[j]) * xh;
        sb[j] += g[j];
      }
    }
    for (int64_t j = j0; j < j1; ++j) {
      if (dgamma) dgamma[j] = static_cast<float>(sg[j]);
      if (dbeta) dbeta[j] = static_cast<float>(sb[j]);
    }
  });
}

}  // namespace dtrain::ops
