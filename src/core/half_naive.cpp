// The naive three-pass baseline in half precision: the accuracy baseline of the contract for
// 16-bit inputs (docs/precision.md), computed the way PyTorch's CPU composite attention
// (matmul, softmax, matmul on bfloat16 or float16 tensors) computes it:
//   every product accumulates in float32 (OpenBLAS sgemm on the inputs converted exactly to
//   float32), and each intermediate tensor is rounded to the working precision W (the query's
//   dtype) as it is formed:
//     forward   S = W(scale * Q K^T) ; S = W(S + mask) ; P = W(softmax(S)) (float32 inside) ;
//               O = W(P V) ; lse = log-sum-exp of S in float32
//     backward  P recomputed ; dP = W(dO V^T) ; dS = W(W(P * (dP - rowsum(P * dP))) * scale) ;
//               dQ = Wq(dS K) ; dK = Wk(sum over the group's heads of dS^T Q) ;
//               dV = Wk(sum over the group's heads of P^T dO)
// where Wq and Wk round to the query's and the key's dtypes. (PyTorch repeats K and V for GQA
// and rounds each head's gradient before summing; here the group's sum is float32 and rounded
// once: a baseline no worse than PyTorch's.) With a float32 query W is float32 and only the
// inputs are 16-bit: this is then the float32 naive attention of the converted inputs.
// Memory: two L x S float32 matrices per call, one head at a time. Threads: OpenMP for the rows
// of the softmax and dS; the products on one thread, since OpenBLAS's blocking (so its order of
// summation) depends on its thread count and the results must not.
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "core/half.h"
#include "core/half_attention.h"
#include "core/problem.h"
#include "kernels/flash_common.h"

namespace sdpa::detail {
namespace {

using std::int64_t;

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(std::max<int64_t>(lda, 1)), b,
              static_cast<blasint>(std::max<int64_t>(ldb, 1)), beta, c,
              static_cast<blasint>(std::max<int64_t>(ldc, 1)));
}

/// Rounds every element of x[0, n) to `w` (identity for float32).
void round_all(DType w, float* x, int64_t n) {
  if (w == DType::float16) {
    for (int64_t i = 0; i < n; ++i) x[i] = float16_to_float(float_to_float16(x[i]));
  } else if (w == DType::bfloat16) {
    for (int64_t i = 0; i < n; ++i) x[i] = bfloat16_to_float(float_to_bfloat16(x[i]));
  }
}

/// The inputs as float32 (exact) and the Problem resolved from them.
struct Staged32 {
  Array q, k, v;
  std::optional<Array> mask;  // a C-contiguous copy (the Problem's mask view reads C order)
  Problem p;
  DType w;  // working precision: the query's dtype

  Staged32(const TensorRef& query, const TensorRef& key, const TensorRef& value, const TensorRef* m,
           const AttentionOptions& options)
      : q(converted_copy(query, DType::float32)),
        k(converted_copy(key, DType::float32)),
        v(converted_copy(value, DType::float32)),
        w(query.dtype) {
    if (m != nullptr) mask.emplace(converted_copy(*m, m->dtype));
    const TensorRef mref = mask ? mask->ref() : TensorRef{};
    p = resolve_problem(q, k, v, mask ? &mref : nullptr, options);
    check_allocation(
        p.L * p.S * 2 * static_cast<int64_t>(sizeof(float)),
        fmt::format("impl naive: its L x S scratch (L = {}, S = {}, 2 matrices)", p.L, p.S));
  }
  const float* qh(int64_t b, int64_t h) const {
    return q.data_as<float>() + (b * p.Hq + h) * p.L * p.E;
  }
  const float* kh(int64_t b, int64_t hk) const {
    return k.data_as<float>() + (b * p.Hkv + hk) * p.S * p.E;
  }
  const float* vh(int64_t b, int64_t hk) const {
    return v.data_as<float>() + (b * p.Hkv + hk) * p.S * p.Ev;
  }
};

// P (L x S) of head (b, h) in the working precision; lse (nullable) gets each row's float32
// log-sum-exp (-inf for a row that sees no key: its P row is zeros).
void probabilities(const Staged32& st, int64_t b, int64_t h, float* P, float* lse) {
  const Problem& p = st.p;
  const int64_t L = p.L, S = p.S;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  sgemm(false, true, L, S, p.E, static_cast<float>(p.scale), st.qh(b, h), p.E,
        st.kh(b, h / p.group), p.E, 0.0f, P, S);
  round_all(st.w, P, L * S);
#pragma omp parallel for num_threads(p.threads) schedule(static)
  for (int64_t l = 0; l < L; ++l) {
    float* row = P + l * S;
    flash::mask_row(p, b, h, l, 0, S, S, row);
    if (p.mask.present) round_all(st.w, row, S);
    float mx = kNegInf;
    bool any_nan = false;
    for (int64_t s = 0; s < S; ++s) {
      mx = std::max(mx, row[s]);
      any_nan = any_nan || std::isnan(row[s]);
    }
    if (any_nan || mx == kNegInf) {  // NaN in, NaN out; no visible key: zeros, lse -inf
      std::fill_n(row, S, any_nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
      if (lse != nullptr) lse[l] = any_nan ? std::numeric_limits<float>::quiet_NaN() : kNegInf;
      continue;
    }
    float sum = 0;
    for (int64_t s = 0; s < S; ++s) {
      row[s] = std::exp(row[s] - mx);
      sum += row[s];
    }
    const float inv = 1.0f / sum;
    for (int64_t s = 0; s < S; ++s) row[s] *= inv;
    round_all(st.w, row, S);
    if (lse != nullptr) lse[l] = mx + std::log(sum);
  }
}

}  // namespace

void naive_half_forward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                        const TensorRef* mask, const AttentionOptions& options,
                        const MutableTensorRef& out, const MutableTensorRef* lse) {
  const Staged32 st(query, key, value, mask, options);
  const Problem& p = st.p;
  const int64_t L = p.L, S = p.S, Ev = p.Ev;
  Array o(DType::float32, out.shape), l(DType::float32, lse != nullptr ? lse->shape : out.shape);
  std::vector<float> P(static_cast<std::size_t>(L * S));
  openblas_set_num_threads(1);  // sgemm on one thread: the same bits for every thread count
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.Hq; ++h) {
      const int64_t bh = b * p.Hq + h;
      probabilities(st, b, h, P.data(), lse != nullptr ? l.data_as<float>() + bh * L : nullptr);
      float* ob = o.data_as<float>() + bh * L * Ev;
      sgemm(false, false, L, Ev, S, 1.0f, P.data(), S, st.vh(b, h / p.group), Ev, 0.0f, ob, Ev);
    }
  }
  store_converted(o, out);  // O = W(P V): W is the query's dtype, out's dtype
  if (lse != nullptr) store_converted(l, *lse);
}

void naive_half_backward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                         const TensorRef* mask, const TensorRef& grad_out,
                         const AttentionOptions& options, const MutableTensorRef& grad_query,
                         const MutableTensorRef& grad_key, const MutableTensorRef& grad_value) {
  const Staged32 st(query, key, value, mask, options);
  const Problem& p = st.p;
  const int64_t L = p.L, S = p.S, E = p.E, Ev = p.Ev;
  const Array dout = converted_copy(grad_out, DType::float32);
  Array dq(DType::float32, grad_query.shape), dk(DType::float32, grad_key.shape),
      dv(DType::float32, grad_value.shape);
  std::vector<float> P(static_cast<std::size_t>(L * S)), dP(static_cast<std::size_t>(L * S));
  const float scale = static_cast<float>(p.scale);
  openblas_set_num_threads(1);  // sgemm on one thread: the same bits for every thread count
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.Hq; ++h) {
      const int64_t bh = b * p.Hq + h, hk = h / p.group, bk = b * p.Hkv + hk;
      probabilities(st, b, h, P.data(), nullptr);
      const float* go = dout.data_as<float>() + bh * L * Ev;
      // dV += P^T dO ; dP = W(dO V^T)
      sgemm(true, false, S, Ev, L, 1.0f, P.data(), S, go, Ev, 1.0f,
            dv.data_as<float>() + bk * S * Ev, Ev);
      sgemm(false, true, L, S, Ev, 1.0f, go, Ev, st.vh(b, hk), Ev, 0.0f, dP.data(), S);
      round_all(st.w, dP.data(), L * S);
      // dS = W(W(P * (dP - rowsum(P * dP))) * scale), in dP's place
#pragma omp parallel for num_threads(p.threads) schedule(static)
      for (int64_t l = 0; l < L; ++l) {
        const float* pr = P.data() + l * S;
        float* dr = dP.data() + l * S;
        float dot = 0;
        for (int64_t s = 0; s < S; ++s) dot += pr[s] * dr[s];
        for (int64_t s = 0; s < S; ++s) dr[s] = pr[s] * (dr[s] - dot);
        round_all(st.w, dr, S);
        for (int64_t s = 0; s < S; ++s) dr[s] *= scale;
        round_all(st.w, dr, S);
      }
      // dQ = dS K ; dK += dS^T Q
      sgemm(false, false, L, E, S, 1.0f, dP.data(), S, st.kh(b, hk), E, 0.0f,
            dq.data_as<float>() + bh * L * E, E);
      sgemm(true, false, S, E, L, 1.0f, dP.data(), S, st.qh(b, h), E, 1.0f,
            dk.data_as<float>() + bk * S * E, E);
    }
  }
  store_converted(dq, grad_query);
  store_converted(dk, grad_key);
  store_converted(dv, grad_value);
}

}  // namespace sdpa::detail
