// The naive baseline (--impl naive): a plain three-pass attention in the input precision,
// materialising the L x S score matrix of one head at a time, with OpenBLAS for the products.
//
// It is what a careful person writes first, and it is kept for two purposes:
//   - the accuracy contract: the fused kernel's error against the float64 reference must be at
//     most twice this implementation's error (plus a small floor);
//   - the benchmarks: every `sdpa bench` run can show the fused kernel beside it.
// Forward per head:  S = scale * Q K^T (sgemm) ; P = softmax(S + mask) row by row ; O = P V (sgemm)
// Backward per head: P recomputed ; dV += P^T dO ; dP = dO V^T ; dS = P * (dP - rowsum(P * dP)) ;
//                    dQ = scale * dS K ; dK += scale * dS^T Q      (five sgemm calls)
// Every operand is read and written through its strides (BLAS leading dimensions for the rows,
// the operand views of core/problem.h for the heads and batches), in place.
// Memory: 2 * L * S elements (reused between calls). Threads: OpenBLAS's own for the products,
// OpenMP for the softmax rows. Masked keys get probability exactly 0; unlike the fused kernel,
// a NaN or inf stored at a masked-out key or value position can still leak through 0 * NaN in
// the BLAS products, so this path does not give that guarantee. A query row that sees no key is
// the exception: its q and dO are zeroed before the backward's products (zero_rows_without_keys).
// float32 calls whose intermediates might pass float32's range never come here (core/attention.cpp
// sends them to the reference).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/flash_common.h"
#include "kernels/kernels.h"
#include "kernels/workspace.h"

namespace sdpa::detail {
namespace {

using std::int64_t;

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

// P = softmax(S + mask) of one head, in place; lse_out (nullable) gets each row's log-sum-exp,
// row l at lse_out[l * lse_ld].
template <class T>
void softmax_rows(const Problem& p, int64_t b, int64_t h, T* P, T* lse_out, int64_t lse_ld) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const int64_t L = p.L, S = p.S;
#pragma omp parallel for num_threads(p.threads) schedule(static)
  for (int64_t l = 0; l < L; ++l) {
    T* row = P + l * S;
    flash::mask_row(p, b, h, l, 0, S, S, row);
    T mx = kNegInf;
    bool any_nan = false;
    for (int64_t s = 0; s < S; ++s) {
      mx = std::max(mx, row[s]);
      any_nan = any_nan || std::isnan(row[s]);
    }
    if (any_nan) {  // std::max drops NaN; the row must not pass for one without visible keys
      std::fill_n(row, S, std::numeric_limits<T>::quiet_NaN());
      if (lse_out != nullptr) lse_out[l * lse_ld] = std::numeric_limits<T>::quiet_NaN();
      continue;
    }
    if (mx == kNegInf) {
      std::fill_n(row, S, T(0));
      if (lse_out != nullptr) lse_out[l * lse_ld] = kNegInf;
      continue;
    }
    T sum = 0;
    for (int64_t s = 0; s < S; ++s) {
      row[s] = std::exp(row[s] - mx);
      sum += row[s];
    }
    const T inv = T(1) / sum;
    for (int64_t s = 0; s < S; ++s) row[s] *= inv;
    if (lse_out != nullptr) lse_out[l * lse_ld] = mx + std::log(sum);
  }
}

// BLAS rejects a leading dimension below the row width (or 1), which a tensor of one row may
// have (its row stride never matters there).
int64_t ld_of(int64_t stride, int64_t rows, int64_t width) {
  return rows <= 1 ? std::max<int64_t>(width, 1) : stride;
}

// One query head h of batch b: its slices of Q, K and V with their row strides (BLAS leading
// dimensions), and P = softmax(scale Q K^T + mask) in P (passes 1 and 2; lse, nullable, gets the
// head's rows).
template <class T>
struct Head {
  int64_t hk;  // kv head
  const T *q, *k, *v;
  int64_t ldq, ldk, ldv;
};

template <class T>
Head<T> probabilities(const Problem& p, int64_t b, int64_t h, T* P, const OutputView* lse) {
  const int64_t L = p.L, S = p.S, E = p.E;
  Head<T> hd;
  hd.hk = h / p.group;
  hd.q = p.q.row<T>(b, h, 0);
  hd.k = p.k.row<T>(b, hd.hk, 0);
  hd.v = p.v.row<T>(b, hd.hk, 0);
  hd.ldq = ld_of(p.q.sl, L, E);
  hd.ldk = ld_of(p.k.sl, S, E);
  hd.ldv = ld_of(p.v.sl, S, p.Ev);
  gemm(false, true, L, S, E, T(p.scale), hd.q, hd.ldq, hd.k, hd.ldk, T(0), P, S);  // scale Q K^T
  const bool want_lse = lse != nullptr && lse->data != nullptr;
  softmax_rows(p, b, h, P, want_lse ? lse->row<T>(b, h, 0) : nullptr, want_lse ? lse->sl : 0);
  return hd;
}

template <class T>
void forward(const Problem& p) {
  const int64_t L = p.L, S = p.S, Ev = p.Ev;
  T* P = static_cast<T*>(call_shared().reserve(static_cast<std::size_t>(L * S) * sizeof(T)));
  openblas_set_num_threads(p.threads);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.Hq; ++h) {
      const Head<T> hd = probabilities(p, b, h, P, &p.lse);
      // pass 3: O = P V
      gemm(false, false, L, Ev, S, T(1), P, S, hd.v, hd.ldv, T(0), p.out.row<T>(b, h, 0),
           ld_of(p.out.sl, L, Ev));
    }
  }
}

template <class T>
bool all_finite(const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

// A row that sees no key has P = 0 and must contribute nothing, but 0 * NaN in the products
// would still carry a NaN or inf stored in its q or dO into dK and dV. When one head has such a
// row, its q and dO (rows ldq and ldg apart) are read from C-order copies in which those rows
// are zero.
template <class T>
void zero_rows_without_keys(const T* P, int64_t L, int64_t S, int64_t E, int64_t Ev, const T*& q,
                            int64_t& ldq, const T*& g, int64_t& ldg, std::vector<T>& q_copy,
                            std::vector<T>& g_copy) {
  std::vector<int64_t> dirty;
  for (int64_t l = 0; l < L; ++l) {
    const T* pr = P + l * S;
    if (std::all_of(pr, pr + S, [](T x) { return x == T(0); }) &&
        (!all_finite(q + l * ldq, E) || !all_finite(g + l * ldg, Ev))) {
      dirty.push_back(l);
    }
  }
  if (dirty.empty()) return;
  q_copy.resize(static_cast<std::size_t>(L * E));
  g_copy.resize(static_cast<std::size_t>(L * Ev));
  for (int64_t l = 0; l < L; ++l) {
    std::copy_n(q + l * ldq, E, q_copy.begin() + l * E);
    std::copy_n(g + l * ldg, Ev, g_copy.begin() + l * Ev);
  }
  for (const int64_t l : dirty) {
    std::fill_n(q_copy.begin() + l * E, E, T(0));
    std::fill_n(g_copy.begin() + l * Ev, Ev, T(0));
  }
  q = q_copy.data();
  g = g_copy.data();
  ldq = std::max<int64_t>(E, 1);
  ldg = std::max<int64_t>(Ev, 1);
}

template <class T>
void backward(const Problem& p) {
  const int64_t L = p.L, S = p.S, E = p.E, Ev = p.Ev;
  T* P = static_cast<T*>(call_shared().reserve(static_cast<std::size_t>(2 * L * S) * sizeof(T)));
  T* dS = P + L * S;
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.Hkv; ++h) {
      for (int64_t s = 0; s < S; ++s) {
        std::fill_n(p.dk.row<T>(b, h, s), E, T(0));
        std::fill_n(p.dv.row<T>(b, h, s), Ev, T(0));
      }
    }
  }
  const int64_t lddq = ld_of(p.dq.sl, L, E), lddk = ld_of(p.dk.sl, S, E);
  const int64_t lddv = ld_of(p.dv.sl, S, Ev);
  openblas_set_num_threads(p.threads);
  std::vector<T> q_copy, g_copy;
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.Hq; ++h) {
      const Head<T> hd = probabilities<T>(p, b, h, P, nullptr);
      const T *q = hd.q, *k = hd.k, *v = hd.v;
      int64_t ldq = hd.ldq, ldg = ld_of(p.dout.sl, L, Ev);
      const T* g = p.dout.row<T>(b, h, 0);
      zero_rows_without_keys(P, L, S, E, Ev, q, ldq, g, ldg, q_copy, g_copy);
      T* dk = p.dk.row<T>(b, hd.hk, 0);
      T* dv = p.dv.row<T>(b, hd.hk, 0);
      gemm(true, false, S, Ev, L, T(1), P, S, g, ldg, T(1), dv, lddv);    // dV += P^T dO
      gemm(false, true, L, S, Ev, T(1), g, ldg, v, hd.ldv, T(0), dS, S);  // dP = dO V^T
#pragma omp parallel for num_threads(p.threads) schedule(static)
      for (int64_t l = 0; l < L; ++l) {  // dS = P * (dP - rowsum(P * dP))
        const T* pr = P + l * S;
        T* dr = dS + l * S;
        T D = 0;
        for (int64_t s = 0; s < S; ++s) D += pr[s] * dr[s];
        for (int64_t s = 0; s < S; ++s) dr[s] = pr[s] == T(0) ? T(0) : pr[s] * (dr[s] - D);
      }
      gemm(false, false, L, E, S, T(p.scale), dS, S, k, hd.ldk, T(0), p.dq.row<T>(b, h, 0), lddq);
      gemm(true, false, S, E, L, T(p.scale), dS, S, q, ldq, T(1), dk, lddk);
    }
  }
}

}  // namespace

bool naive_reads_in_place(const Problem& p) {
  const auto fits = [](const InputView& v, int64_t rows, int64_t width) {
    return v.data == nullptr || rows <= 1 || v.sl >= std::max<int64_t>(width, 1);
  };
  return fits(p.q, p.L, p.E) && fits(p.k, p.S, p.E) && fits(p.v, p.S, p.Ev) &&
         fits(p.dout, p.L, p.Ev);
}

void naive_forward(const Problem& p) {
  if (p.dtype == DType::float64) {
    forward<double>(p);
  } else {
    forward<float>(p);
  }
}

void naive_backward(const Problem& p) {
  if (p.dtype == DType::float64) {
    backward<double>(p);
  } else {
    backward<float>(p);
  }
}

}  // namespace sdpa::detail
