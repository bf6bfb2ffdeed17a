// The model of `sdpa lab train`: forward, backward (each backward line names the forward line it
// differentiates) and Adam. See train_model.h for the shapes.
#include "lab/train_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/problem.h"
#include "lab/stats.h"
#include "reference/reference.h"

namespace sdpa::lab::train {

std::string task_name(const TaskSpec& task) {
  return task.matches <= 1 ? std::string("recall") : "majority-" + std::to_string(task.matches);
}

namespace {

// Majority recall: the query key at `m` positions, (m + 1) / 2 of them with the target value and
// the other m - (m + 1) / 2 with distinct values other than the target; the remaining P - m
// positions hold distinct other keys with uniform values; then the positions are shuffled.
void majority_sequence(const TaskSpec& task, Stream& stream, std::vector<int>& pool, int* keys,
                       int* values, int& query, int& target) {
  const int P = task.pairs, m = task.matches, others = P - m;
  std::iota(pool.begin(), pool.end(), 0);
  for (int i = 0; i <= others; ++i) {
    const int j = i + static_cast<int>(stream.below(static_cast<std::uint32_t>(task.n_keys - i)));
    std::swap(pool[i], pool[j]);
  }
  query = pool[0];
  target = static_cast<int>(stream.below(static_cast<std::uint32_t>(task.n_values)));
  const int carry = (m + 1) / 2;
  std::vector<int> distract;  // distinct values other than the target
  while (static_cast<int>(distract.size()) < m - carry) {
    const int v = static_cast<int>(stream.below(static_cast<std::uint32_t>(task.n_values)));
    if (v != target && std::find(distract.begin(), distract.end(), v) == distract.end())
      distract.push_back(v);
  }
  for (int i = 0; i < m; ++i) {
    keys[i] = query;
    values[i] = i < carry ? target : distract[i - carry];
  }
  for (int i = 0; i < others; ++i) {
    keys[m + i] = pool[1 + i];
    values[m + i] = static_cast<int>(stream.below(static_cast<std::uint32_t>(task.n_values)));
  }
  for (int i = P - 1; i > 0; --i) {
    const int j = static_cast<int>(stream.below(static_cast<std::uint32_t>(i + 1)));
    std::swap(keys[i], keys[j]);
    std::swap(values[i], values[j]);
  }
}

}  // namespace

Batch make_batch(const TaskSpec& task, int size, Stream& stream) {
  Batch b;
  b.size = size;
  b.pairs = task.pairs;
  const auto n = static_cast<std::size_t>(size) * task.pairs;
  b.keys.resize(n);
  b.values.resize(n);
  b.query.resize(size);
  b.target.resize(size);
  std::vector<int> pool(task.n_keys);
  for (int s = 0; s < size; ++s) {
    if (task.matches > 1) {
      majority_sequence(task, stream, pool, &b.keys[s * task.pairs], &b.values[s * task.pairs],
                        b.query[s], b.target[s]);
      continue;
    }
    // The first `pairs` steps of a Fisher-Yates shuffle: distinct keys, uniformly.
    std::iota(pool.begin(), pool.end(), 0);
    for (int i = 0; i < task.pairs; ++i) {
      const int j = i + static_cast<int>(stream.below(static_cast<std::uint32_t>(task.n_keys - i)));
      std::swap(pool[i], pool[j]);
      b.keys[s * task.pairs + i] = pool[i];
      b.values[s * task.pairs + i] =
          static_cast<int>(stream.below(static_cast<std::uint32_t>(task.n_values)));
    }
    const int pick = static_cast<int>(stream.below(static_cast<std::uint32_t>(task.pairs)));
    b.query[s] = b.keys[s * task.pairs + pick];
    b.target[s] = b.values[s * task.pairs + pick];
  }
  return b;
}

template <class T>
Params<T>::Params(const ModelShape& s) : shape(s) {
  const auto D = static_cast<std::size_t>(s.width),
             d = static_cast<std::size_t>(s.d) * static_cast<std::size_t>(s.heads);
  emb_k.assign(s.n_keys * D, T(0));
  emb_v.assign(s.n_values * D, T(0));
  wq.assign(D * d, T(0));
  wk.assign(D * d, T(0));
  wv.assign(D * d, T(0));
  wo.assign(d * s.n_values, T(0));
}

template <class T>
void Params<T>::set_zero() {
  for (auto* v : {&emb_k, &emb_v, &wq, &wk, &wv, &wo}) std::fill(v->begin(), v->end(), T(0));
  log_tau = T(0);
}

template <class T>
std::vector<T*> Params<T>::tensors() {
  return {emb_k.data(), emb_v.data(), wq.data(), wk.data(), wv.data(), wo.data(), &log_tau};
}

template <class T>
std::vector<std::size_t> Params<T>::sizes() const {
  return {emb_k.size(), emb_v.size(), wq.size(), wk.size(), wv.size(), wo.size(), 1};
}

template <class T>
Params<T> init_params(const ModelShape& shape, Stream& stream) {
  Params<T> p(shape);
  auto fill = [&stream](std::vector<T>& x, double stddev) {
    for (auto& e : x) e = static_cast<T>(stddev * stream.normal());
  };
  fill(p.emb_k, 1.0);
  fill(p.emb_v, 1.0);
  // Variance 1/fan-in: with unit-variance inputs q, k and v start with unit variance per
  // component, which is the article's assumption (then Var(q.k) = d).
  fill(p.wq, 1.0 / std::sqrt(double(shape.width)));
  fill(p.wk, 1.0 / std::sqrt(double(shape.width)));
  fill(p.wv, 1.0 / std::sqrt(double(shape.width)));
  fill(p.wo, 1.0 / std::sqrt(double(shape.d) * shape.heads));
  if (shape.zero_query) std::fill(p.wq.begin(), p.wq.end(), T(0));
  // qk-norm: (q/|q|).(k/|k|) has variance 1/d at initialisation; tau = sqrt(d) makes the scores
  // unit-variance, the same start as 1/sqrt(d).
  p.log_tau = static_cast<T>(0.5 * std::log(double(shape.d)));
  return p;
}

namespace {

// C (n x k) = A (n x m) B (m x k); the inner loop runs over contiguous columns of B and C.
template <class T>
void matmul(const T* A, const T* B, T* C, std::size_t n, std::size_t m, std::size_t k) {
  for (std::size_t r = 0; r < n; ++r) {
    T* c = C + r * k;
    std::fill(c, c + k, T(0));
    for (std::size_t i = 0; i < m; ++i) {
      const T a = A[r * m + i];
      const T* b = B + i * k;
      for (std::size_t j = 0; j < k; ++j) c[j] += a * b[j];
    }
  }
}

// W (m x k) = A^T (m x n) G (n x k).
template <class T>
void matmul_at_b(const T* A, const T* G, T* W, std::size_t n, std::size_t m, std::size_t k) {
  std::fill(W, W + m * k, T(0));
  for (std::size_t r = 0; r < n; ++r) {
    const T* g = G + r * k;
    for (std::size_t i = 0; i < m; ++i) {
      const T a = A[r * m + i];
      T* w = W + i * k;
      for (std::size_t j = 0; j < k; ++j) w[j] += a * g[j];
    }
  }
}

// out (m x n) = in (n x m)^T.
template <class T>
void transpose(const T* in, T* out, std::size_t n, std::size_t m) {
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t c = 0; c < m; ++c) out[c * n + r] = in[r * m + c];
  }
}

template <class T>
void normalize_rows(const std::vector<T>& x, std::vector<T>& xn, std::vector<T>& norms,
                    std::size_t rows, std::size_t d) {
  xn.resize(rows * d);
  norms.resize(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (std::size_t j = 0; j < d; ++j) ss += double(x[r * d + j]) * double(x[r * d + j]);
    // 1e-30 only guards an exactly zero row; |q| is about sqrt(d) in practice.
    const double n = std::sqrt(ss + 1e-30);
    norms[r] = static_cast<T>(n);
    for (std::size_t j = 0; j < d; ++j) xn[r * d + j] = static_cast<T>(x[r * d + j] / n);
  }
}

// dx = (dxn - xn (xn . dxn)) / |x|: the backward of xn = x / |x|, in place on dxn.
template <class T>
void normalize_rows_backward(const std::vector<T>& xn, const std::vector<T>& norms,
                             std::vector<T>& dxn, std::size_t rows, std::size_t d) {
  for (std::size_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (std::size_t j = 0; j < d; ++j) dot += double(xn[r * d + j]) * double(dxn[r * d + j]);
    for (std::size_t j = 0; j < d; ++j) {
      dxn[r * d + j] = static_cast<T>((dxn[r * d + j] - xn[r * d + j] * dot) / norms[r]);
    }
  }
}

template <class T>
constexpr DType dtype_of() {
  return sizeof(T) == 8 ? DType::float64 : DType::float32;
}

}  // namespace

template <class T>
Stats forward_backward(const Params<T>& params, ScaleKind kind, const Batch& batch, Params<T>* grad,
                       bool attention_stats, Workspace<T>& ws) {
  const ModelShape& s = params.shape;
  // d here is the projections' width h d; dh is one head's dimension.
  const std::size_t B = batch.size, P = batch.pairs, D = s.width, H = s.heads, dh = s.d, d = H * dh,
                    V = s.n_values;
  const double inv_sqrt2 = 1.0 / std::sqrt(2.0);

  // pass 1: inputs. x_q = E_k[query]; x_i = (E_k[key_i] + E_v[value_i]) / sqrt(2)
  ws.xq.resize(B * D);
  ws.xs.resize(B * P * D);
  for (std::size_t b = 0; b < B; ++b) {
    std::copy_n(&params.emb_k[batch.query[b] * D], D, &ws.xq[b * D]);
    for (std::size_t i = 0; i < P; ++i) {
      const T* ek = &params.emb_k[batch.keys[b * P + i] * D];
      const T* ev = &params.emb_v[batch.values[b * P + i] * D];
      T* x = &ws.xs[(b * P + i) * D];
      for (std::size_t j = 0; j < D; ++j) x[j] = static_cast<T>((ek[j] + ev[j]) * inv_sqrt2);
    }
  }
  // pass 2: projections. q = x_q W_q, k = x W_k, v = x W_v
  ws.q.resize(B * d);
  ws.k.resize(B * P * d);
  ws.v.resize(B * P * d);
  matmul(ws.xq.data(), params.wq.data(), ws.q.data(), B, D, d);
  matmul(ws.xs.data(), params.wk.data(), ws.k.data(), B * P, D, d);
  matmul(ws.xs.data(), params.wv.data(), ws.v.data(), B * P, D, d);

  // pass 3: attention. qk-norm: q^ = q/|q|, k^ = k/|k|, scale tau = exp(log_tau)
  const bool qk_norm = kind == ScaleKind::qk_norm;
  const double scale =
      qk_norm ? std::exp(double(params.log_tau)) : scale_value(kind, s.d) * s.temperature;
  if (qk_norm) {
    normalize_rows(ws.q, ws.qn, ws.qnorm, B * H, dh);  // per head: rows of dh
    normalize_rows(ws.k, ws.kn, ws.knorm, B * P * H, dh);
  }
  const std::vector<T>& qa = qk_norm ? ws.qn : ws.q;
  const std::vector<T>& ka = qk_norm ? ws.kn : ws.k;
  const auto Bi = static_cast<std::int64_t>(B), Pi = static_cast<std::int64_t>(P),
             Hi = static_cast<std::int64_t>(H), di = static_cast<std::int64_t>(dh);
  const DType dt = dtype_of<T>();
  // q and o are (B, h, 1, dh) as they lie; k and v lie (B, P, h, dh) and are read as
  // (B, h, P, dh) views, without a copy.
  const std::vector<std::int64_t> kv_strides{Pi * Hi * di, di, Hi * di, 1};
  const TensorRef q_ref{qa.data(), dt, {Bi, Hi, 1, di}};
  const TensorRef k_ref{ka.data(), dt, {Bi, Hi, Pi, di}, kv_strides};
  const TensorRef v_ref{ws.v.data(), dt, {Bi, Hi, Pi, di}, kv_strides};
  AttentionOptions opt;
  opt.scale = scale;
  opt.softcap = s.softcap;
  opt.impl = Impl::fast;
  opt.threads = 1;  // runs are parallel, each single-threaded: same numbers for any --threads
  ws.o.resize(B * d);
  ws.lse.resize(B * H);
  const MutableTensorRef o_ref{ws.o.data(), dt, {Bi, Hi, 1, di}};
  const MutableTensorRef lse_ref{ws.lse.data(), dt, {Bi, Hi, 1}};
  attention_forward(q_ref, k_ref, v_ref, nullptr, opt, o_ref, &lse_ref);

  // pass 4: logits = o W_o; log-probabilities by sdpa::log_softmax
  ws.logits.resize(B * V);
  ws.dlogits.resize(B * V);
  matmul(ws.o.data(), params.wo.data(), ws.logits.data(), B, d, V);
  Stats st;
  double loss = 0;
  std::size_t correct = 0;
  for (std::size_t b = 0; b < B; ++b) {
    std::span<const T> row(&ws.logits[b * V], V);
    std::span<T> logp(&ws.dlogits[b * V], V);
    log_softmax<T>(row, logp);
    const auto target = static_cast<std::size_t>(batch.target[b]);
    loss -= double(logp[target]);
    // argmax, first index on ties
    std::size_t best = 0;
    for (std::size_t u = 1; u < V; ++u) {
      if (row[u] > row[best]) best = u;
    }
    correct += best == target;
  }
  st.loss = loss / double(B);
  st.accuracy = double(correct) / double(B);

  if (attention_stats) {
    // The attention weights of each query row: the float64 reference's scores and P for the
    // same q, k and scale (its P-only forward, which does not read v).
    ws.scores.resize(B * H * P);
    ws.probs.resize(B * H * P);
    const detail::Problem problem = detail::resolve_problem(q_ref, k_ref, v_ref, nullptr, opt);
    detail::reference_forward(problem, nullptr, nullptr, {ws.scores.data(), ws.probs.data()});
    double entropy = 0, max_logit = 0;
    std::size_t dead = 0;
    for (std::size_t r = 0; r < B * H; ++r) {
      const std::span<const double> p(&ws.probs[r * P], P);
      entropy += lab::entropy(p);
      dead += 1.0 - *std::max_element(p.begin(), p.end()) < kDeadRow;
      for (std::size_t i = 0; i < P; ++i)
        max_logit = std::max(max_logit, std::fabs(ws.scores[r * P + i]));
    }
    st.entropy = entropy / double(B * H);
    st.max_logit = max_logit;
    st.dead = double(dead) / double(B * H);
  }
  if (grad == nullptr) return st;

  // ---- backward -------------------------------------------------------------------------
  // loss = mean_b -logp[target]: dlogits = (softmax(logits) - onehot(target)) / B
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t u = 0; u < V; ++u) {
      ws.dlogits[b * V + u] = static_cast<T>(std::exp(double(ws.dlogits[b * V + u])) / double(B));
    }
    ws.dlogits[b * V + batch.target[b]] -= static_cast<T>(1.0 / double(B));
  }
  // logits = o W_o: dW_o = o^T dlogits, do = dlogits W_o^T
  matmul_at_b(ws.o.data(), ws.dlogits.data(), grad->wo.data(), B, d, V);
  ws.wt.resize(std::max(V * d, d * D));
  transpose(params.wo.data(), ws.wt.data(), d, V);
  ws.dout.resize(B * d);
  matmul(ws.dlogits.data(), ws.wt.data(), ws.dout.data(), B, V, d);

  // o = attention(q, k, v, scale): sdpa::attention_backward
  ws.dq.resize(B * d);
  ws.dk.resize(B * P * d);
  ws.dv.resize(B * P * d);
  const TensorRef dout_ref{ws.dout.data(), dt, {Bi, Hi, 1, di}};
  const MutableTensorRef dq_ref{ws.dq.data(), dt, {Bi, Hi, 1, di}};
  const MutableTensorRef dk_ref{ws.dk.data(), dt, {Bi, Hi, Pi, di}, kv_strides};
  const MutableTensorRef dv_ref{ws.dv.data(), dt, {Bi, Hi, Pi, di}, kv_strides};
  attention_backward(q_ref, k_ref, v_ref, nullptr, o_ref, lse_ref, dout_ref, opt, dq_ref, dk_ref,
                     dv_ref);

  grad->log_tau = T(0);
  if (qk_norm) {
    // scores = tau q^.k^: the backward gave dq^ = tau sum_s dS_s k^_s, so
    // dL/dtau = sum_b sum_s dS_s q^_b.k^_s = sum_b q^_b.dq^_b / tau, and with tau = exp(log_tau)
    // dL/dlog_tau = tau dL/dtau = sum_b q^_b.dq^_b.
    double dlog_tau = 0;
    for (std::size_t i = 0; i < B * d; ++i) dlog_tau += double(ws.qn[i]) * double(ws.dq[i]);
    grad->log_tau = static_cast<T>(dlog_tau);
    // q^ = q/|q|, k^ = k/|k|
    normalize_rows_backward(ws.qn, ws.qnorm, ws.dq, B * H, dh);
    normalize_rows_backward(ws.kn, ws.knorm, ws.dk, B * P * H, dh);
  }

  // q = x_q W_q, k = x W_k, v = x W_v: dW = x^T dy, dx = dy W^T
  matmul_at_b(ws.xq.data(), ws.dq.data(), grad->wq.data(), B, D, d);
  matmul_at_b(ws.xs.data(), ws.dk.data(), grad->wk.data(), B * P, D, d);
  matmul_at_b(ws.xs.data(), ws.dv.data(), grad->wv.data(), B * P, D, d);
  ws.dxq.resize(B * D);
  ws.dxs.resize(B * P * D);
  transpose(params.wq.data(), ws.wt.data(), D, d);
  matmul(ws.dq.data(), ws.wt.data(), ws.dxq.data(), B, d, D);
  transpose(params.wk.data(), ws.wt.data(), D, d);
  matmul(ws.dk.data(), ws.wt.data(), ws.dxs.data(), B * P, d, D);
  ws.row.resize(B * P * D);  // dv W_v^T, added to dxs
  transpose(params.wv.data(), ws.wt.data(), D, d);
  matmul(ws.dv.data(), ws.wt.data(), ws.row.data(), B * P, d, D);
  for (std::size_t i = 0; i < B * P * D; ++i) ws.dxs[i] += ws.row[i];

  // x_q = E_k[query]; x_i = (E_k[key_i] + E_v[value_i]) / sqrt(2): scatter-add
  std::fill(grad->emb_k.begin(), grad->emb_k.end(), T(0));
  std::fill(grad->emb_v.begin(), grad->emb_v.end(), T(0));
  for (std::size_t b = 0; b < B; ++b) {
    T* gq = &grad->emb_k[batch.query[b] * D];
    for (std::size_t j = 0; j < D; ++j) gq[j] += ws.dxq[b * D + j];
    for (std::size_t i = 0; i < P; ++i) {
      T* gk = &grad->emb_k[batch.keys[b * P + i] * D];
      T* gv = &grad->emb_v[batch.values[b * P + i] * D];
      const T* dx = &ws.dxs[(b * P + i) * D];
      for (std::size_t j = 0; j < D; ++j) {
        const T g = static_cast<T>(dx[j] * inv_sqrt2);
        gk[j] += g;
        gv[j] += g;
      }
    }
  }
  return st;
}

template <class T>
Adam<T>::Adam(const Params<T>& params, double lr) : lr_(lr), m_(params.shape), v_(params.shape) {}

template <class T>
void Adam<T>::step(Params<T>& params, Params<T>& grad) {
  constexpr double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  ++t_;
  const double c1 = 1.0 - std::pow(b1, double(t_)), c2 = 1.0 - std::pow(b2, double(t_));
  const auto p = params.tensors(), g = grad.tensors(), m = m_.tensors(), v = v_.tensors();
  const auto n = params.sizes();
  for (std::size_t t = 0; t < p.size(); ++t) {
    for (std::size_t i = 0; i < n[t]; ++i) {
      const double gi = g[t][i];
      const double mi = b1 * m[t][i] + (1 - b1) * gi, vi = b2 * v[t][i] + (1 - b2) * gi * gi;
      m[t][i] = static_cast<T>(mi);
      v[t][i] = static_cast<T>(vi);
      p[t][i] = static_cast<T>(p[t][i] - lr_ * (mi / c1) / (std::sqrt(vi / c2) + eps));
    }
  }
}

template <class T>
double norm(const std::vector<T>& x) {
  double s = 0;
  for (const T e : x) s += double(e) * double(e);
  return std::sqrt(s);
}

template struct Params<float>;
template struct Params<double>;
template Params<float> init_params<float>(const ModelShape&, Stream&);
template Params<double> init_params<double>(const ModelShape&, Stream&);
template Stats forward_backward<float>(const Params<float>&, ScaleKind, const Batch&,
                                       Params<float>*, bool, Workspace<float>&);
template Stats forward_backward<double>(const Params<double>&, ScaleKind, const Batch&,
                                        Params<double>*, bool, Workspace<double>&);
template class Adam<float>;
template class Adam<double>;
template double norm<float>(const std::vector<float>&);
template double norm<double>(const std::vector<double>&);

}  // namespace sdpa::lab::train
