// The model and task of `sdpa lab train` (claim C8): associative recall solved by one attention
// layer whose scores go through sdpa::attention_forward / sdpa::attention_backward.
//
// Layout: every matrix is row-major; a batch of B sequences with P pairs each.
//   x_q    = E_k[query]                                  (B x D)
//   x_i    = (E_k[key_i] + E_v[value_i]) / sqrt(2)       (B x P x D)
//   q      = x_q W_q, k = x W_k, v = x W_v               (W: D x d)
//   o      = attention(q, k, v, scale)                   (B x d), one query row per sequence
//   logits = o W_o                                       (W_o: d x n_values)
//   loss   = mean_b -log_softmax(logits_b)[target_b]
// For ScaleKind::qk_norm, q and k are divided by their norms and scale = tau = exp(theta).
// T is float (training) or double (the finite-difference gradient check).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lab/random.h"
#include "lab/scales.h"
#include "sdpa/sdpa.h"

namespace sdpa::lab::train {

/// The variants trained: Scale::one, inv_sqrt_d, inv_d and qk_norm (lab/scales.h gives their
/// names and fixed values; qk_norm's value is the initial temperature).
using ScaleKind = Scale;

struct TaskSpec {
  int n_keys = 32;
  int n_values = 16;
  int pairs = 16;  // P: keys of the attention
  /// 1: associative recall (the query key occurs once). m > 1 (odd): majority recall, the query
  /// key occurs at m positions, (m + 1) / 2 of them carrying the target value and the others
  /// distinct other values, so that attention to any one matching position is right with
  /// probability (m + 1) / (2m) at best (2/3 for m = 3): reaching 90% needs attention spread
  /// over the matching positions.
  int matches = 1;
};

/// "recall" or "majority-m" (m = matches).
std::string task_name(const TaskSpec& task);

/// A batch of associative-recall sequences.
struct Batch {
  int size = 0;
  int pairs = 0;
  std::vector<int> keys;    // size x pairs, distinct within a sequence (but for the matches)
  std::vector<int> values;  // size x pairs
  std::vector<int> query;   // size: a key of the sequence
  std::vector<int> target;  // size: the value paired with it
};

/// `size` sequences drawn from `stream`.
Batch make_batch(const TaskSpec& task, int size, Stream& stream);

struct ModelShape {
  int n_keys = 32, n_values = 16, width = 32, d = 16;  // width: D
  double temperature = 1;   // multiplies the fixed scales: c/sqrt(d) is inv_sqrt_d with c
  int heads = 1;            // h heads of dimension d each: W_q, W_k, W_v are D x (h d)
  double softcap = 0;       // the kernel's logit softcap (0 = off): c tanh(scale q.k / c)
  bool zero_query = false;  // muP: W_q starts at zero (then every score starts at 0, uniform)
};

template <class T>
struct Params {
  ModelShape shape;
  std::vector<T> emb_k, emb_v;  // n_keys x D, n_values x D
  std::vector<T> wq, wk, wv;    // D x (h d); head j owns columns j d .. j d + d - 1
  std::vector<T> wo;            // (h d) x n_values
  T log_tau = 0;                // qk_norm only (its gradient is 0 for the fixed scales)

  explicit Params(const ModelShape& s = {});
  void set_zero();
  /// Every parameter in one order (for Adam and the gradient check).
  std::vector<T*> tensors();
  std::vector<std::size_t> sizes() const;
};

/// Unit-variance embeddings, W_q, W_k, W_v ~ N(0, 1/D), W_o ~ N(0, 1/(h d)); log_tau =
/// ln sqrt(d); W_q = 0 when shape.zero_query.
template <class T>
Params<T> init_params(const ModelShape& shape, Stream& stream);

/// Measurements of one forward pass.
struct Stats {
  double loss = 0;       // mean cross-entropy, nats
  double accuracy = 0;   // fraction with argmax logits == target
  double entropy = 0;    // mean attention entropy of the query rows, nats (only if asked)
  double max_logit = 0;  // largest |score| (only if asked)
  double dead = 0;       // fraction of query rows (all heads) with 1 - max p < kDeadRow (ditto)
};

/// An attention row is dead in training when 1 - max_j p_j is below this: every entry of its
/// softmax Jacobian diag(p) - p p^T is then below 1e-3, a thousandth of a typical unsaturated
/// row's (uniform over P = 16 keys gives 1/16 - 1/256 on the diagonal, about 0.06).
inline constexpr double kDeadRow = 1e-3;

/// Reusable buffers so that a training step allocates nothing after the first.
template <class T>
struct Workspace {
  std::vector<T> xq, xs, q, k, v, qn, kn, qnorm, knorm, o, lse, logits, dlogits, dout, dq, dk, dv,
      dxq, dxs, wt, row;
  std::vector<double> scores, probs;  // the reference's float64 attention matrices (stats only)
};

/// Forward pass, and when `grad` is not null the gradients of the mean loss (overwritten).
/// `attention_stats` adds entropy and max_logit (from the float64 reference's scores and P).
template <class T>
Stats forward_backward(const Params<T>& params, ScaleKind kind, const Batch& batch, Params<T>* grad,
                       bool attention_stats, Workspace<T>& ws);

/// Adam (beta1 0.9, beta2 0.999, eps 1e-8), constant rate.
template <class T>
class Adam {
 public:
  Adam(const Params<T>& params, double lr);
  void step(Params<T>& params, Params<T>& grad);

 private:
  double lr_;
  long t_ = 0;
  Params<T> m_, v_;
};

/// sqrt(sum of squares) of a tensor.
template <class T>
double norm(const std::vector<T>& x);

}  // namespace sdpa::lab::train
