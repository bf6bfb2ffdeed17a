// sdpa: exact scaled dot-product attention on the CPU.
//
//   out = softmax(query @ key^T * scale + mask) @ value
//
// with the semantics of PyTorch's torch.nn.functional.scaled_dot_product_attention.
//
// Shape glossary (used everywhere in this project):
//   ...  leading batch dimensions, identical on query, key and value (may be none)
//   B    product of the leading batch dimensions (1 when there are none)
//   Hq   query heads      (dimension -3 of query; 1 for rank-2 inputs)
//   Hkv  key/value heads  (dimension -3 of key and value; 1 for rank-2 inputs)
//   L    query length     (target sequence)
//   S    key/value length (source sequence)
//   E    query/key feature size
//   Ev   value feature size
//
//   query (..., Hq, L, E)    key (..., Hkv, S, E)    value (..., Hkv, S, Ev)
//   out   (..., Hq, L, Ev)   lse (..., Hq, L)        mask broadcastable to (..., Hq, L, S)
//
// Semantics:
//   - scale defaults to 1/sqrt(E); any finite value may be given; NaN or +-inf is rejected.
//   - mask: boolean (true = the key takes part) or floating (added to the scaled scores;
//     -inf allowed). It broadcasts to (..., Hq, L, S) by NumPy's rules.
//   - causal: Causal::upper_left keeps key s for query l when s <= l (PyTorch's is_causal,
//     tril(ones(L, S))); Causal::lower_right keeps s <= l + (S - L) (FlashAttention's,
//     tril(ones(L, S), S - L)). Causal combines with a mask (both must allow a key).
//   - grouped-query attention: without enable_gqa, Hq must equal Hkv. With it, Hq must be a
//     multiple of Hkv and query head h reads key/value head h / (Hq / Hkv) (PyTorch's
//     repeat_interleave).
//   - lse[..., h, l] = log(sum_s exp(score[l, s])) with score = scale * q.k + mask (natural log).
//   - a row whose every key is masked gives out = 0, lse = -inf and zero gradients, never NaN.
//     (PyTorch 1.13 returns NaN for such rows.) A masked-out key is skipped entirely, so a NaN
//     or inf stored at a masked-out position of key or value never reaches the output; a query
//     row that sees no key produces zeros whatever its values.
//   - backward uses dS = P * (dP - rowsum(dout * out)), O(S) per row; the O(S^2) softmax
//     Jacobian is never formed.
//
// Errors: every function throws sdpa::Error (a std::invalid_argument) whose message names the
// argument, what was expected and what was given. Nothing is written to outputs on error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace sdpa {

/// The project's version, "MAJOR.MINOR.PATCH".
const char* version();

/// What kind of problem an sdpa::Error reports; front ends map it (the CLI exits 2 for every
/// kind, Python raises TypeError for bad_type, ValueError for bad_value and bad_shape, OSError
/// for io and MemoryError for resources) without reading the message.
enum class ErrorKind : std::uint8_t {
  bad_value,  ///< a value out of range or of the wrong form: a scale, a thread count, a seed
  bad_type,   ///< a dtype (or, in Python, an argument's type) that is not accepted
  bad_shape,  ///< shapes that are invalid or do not fit together
  io,         ///< a file that cannot be read or written, or is not what it must be
  resources,  ///< more memory than the process can get
};

/// "bad value", "bad type", "bad shape", "I/O" or "resources".
const char* error_kind_name(ErrorKind kind);

/// Thrown for every invalid argument; the message says which argument, what was expected and
/// what was found. kind() and argument() say the same as data, so that callers never sort errors
/// by their text. A std::invalid_argument, so older catches keep working.
class Error : public std::invalid_argument {
 public:
  /// The message is "<argument>: <detail>" (just <detail> when the argument is empty).
  Error(ErrorKind kind, const std::string& argument, const std::string& detail)
      : std::invalid_argument(argument.empty() ? detail : argument + ": " + detail),
        kind_(kind),
        argument_(argument) {}
  /// A whole message, of kind bad_value, concerning no argument in particular.
  explicit Error(const std::string& message) : std::invalid_argument(message) {}

  ErrorKind kind() const noexcept { return kind_; }
  /// The argument the error concerns as the caller spelled it ("query", "--out", a path), or "".
  const std::string& argument() const noexcept { return argument_; }

 private:
  ErrorKind kind_ = ErrorKind::bad_value;
  std::string argument_;
};

/// Element types. float16 is IEEE binary16; bfloat16 is the top half of a float32. Both are
/// stored as 16-bit patterns (docs/precision.md). Appended last so the older values keep theirs.
enum class DType : std::uint8_t { float32, float64, boolean, float16, bfloat16 };

/// "float32", "float64", "bool", "float16" or "bfloat16".
const char* dtype_name(DType dtype);
/// Bytes per element: 4, 8, 1, 2 or 2.
std::size_t dtype_size(DType dtype);

/// A read-only tensor owned by someone else.
/// strides: the step between neighbours along each dimension, in elements (not bytes); empty
/// means C-contiguous. Otherwise one per dimension, each >= 0, and the last dimension contiguous
/// (stride 1, unless its size is 1): (B, H, L, E) and (B, L, H, E) views, slices of a packed
/// QKV projection and broadcast (stride 0) batch or head dimensions all go in without a copy by
/// the caller. Outputs (MutableTensorRef) must not overlap themselves.
struct TensorRef {
  const void* data = nullptr;
  DType dtype = DType::float32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides = {};  // = {}: brace-initialising without it is warning-free

  std::int64_t numel() const;
};

/// A writable tensor owned by someone else; strides as in TensorRef.
struct MutableTensorRef {
  void* data = nullptr;
  DType dtype = DType::float32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides = {};  // = {}: brace-initialising without it is warning-free

  std::int64_t numel() const;
  operator TensorRef() const { return TensorRef{data, dtype, shape, strides}; }  // NOLINT
};

enum class Causal : std::uint8_t { none, upper_left, lower_right };

/// Which implementation serves a call.
///   fast:      the fused, tiled, online-softmax SIMD kernel (the default).
///   reference: float64 accumulation, readable, the oracle every other path is tested against.
///   naive:     a plain three-pass baseline (matmul, softmax, matmul) in the input precision,
///              materialising L x S; kept for benchmarks and accuracy baselines.
enum class Impl : std::uint8_t { fast, reference, naive };

/// "none", "upper-left", "lower-right"; parse_causal accepts the same spellings.
const char* causal_name(Causal causal);
Causal parse_causal(const std::string& text);
/// "fast", "reference", "naive"; parse_impl accepts the same spellings.
const char* impl_name(Impl impl);
Impl parse_impl(const std::string& text);

struct AttentionOptions {
  std::optional<double> scale;  ///< default 1/sqrt(E)
  Causal causal = Causal::none;
  bool enable_gqa = false;
  Impl impl = Impl::fast;
  int threads = 0;  ///< 0: one per core of this machine; otherwise 1..1024

  // Variants, with FlashAttention's semantics (docs/variants.md); i is the query row, j the key,
  // d = S - L. Every one works with every impl but naive, forward and backward.
  /// Sliding window: query i sees keys j in [i + d - window_left, i + d + window_right]; -1
  /// leaves that side unbounded. Combines with causal and the mask (a key must pass all).
  std::int64_t window_left = -1, window_right = -1;
  /// Logit softcap c (0 = off): the score is c * tanh(scale * q.k / c), before ALiBi and mask.
  double softcap = 0.0;
  /// ALiBi slopes, Hq values (one per query head) or B * Hq (per batch and head, batch-major):
  /// -slope * |i + d - j| is added to the score. Empty: off.
  std::vector<double> alibi_slopes = {};
  /// Attention sinks, Hq logits: each joins its head's softmax denominator,
  /// p_j = exp(s_j) / (exp(sink) + sum_k exp(s_k)); lse includes it. Empty: off.
  std::vector<double> sinks = {};
  /// Dropout on the probabilities (scaled by 1 / (1 - p)), p in [0, 1), used rounded to a
  /// multiple of 2^-16 (16-bit draws); the mask comes from Philox4x32-10 keyed by `seed` and
  /// counted by (batch, head, i, j), so that the backward regenerates it. lse is the softmax's,
  /// before dropout.
  double dropout_p = 0.0;
  std::uint64_t seed = 0;
};

/// Number of threads a call with `threads` would use (resolves 0 to the core count).
int resolve_threads(int threads);

/// The shapes of `out` and `lse` for these inputs; validates like attention_forward.
std::vector<std::int64_t> attention_output_shape(const TensorRef& query, const TensorRef& key,
                                                 const TensorRef& value,
                                                 const AttentionOptions& options);
std::vector<std::int64_t> attention_lse_shape(const TensorRef& query);

/// out (and lse when given) from query, key, value and an optional mask (nullptr for none).
/// query, key and value share one dtype (float32, float64, float16 or bfloat16), except that a
/// float32 or bfloat16 query may read key and value of one 16-bit dtype (a half-precision KV
/// cache). out has the query's dtype; lse too, but float32 for a 16-bit query. A mask is bool
/// or additive of any float dtype. 16-bit arithmetic: docs/precision.md.
void attention_forward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                       const TensorRef* mask, const AttentionOptions& options,
                       const MutableTensorRef& out, const MutableTensorRef* lse = nullptr);

/// Gradients of sum(out * grad_out) with respect to query, key and value, each of its input's
/// dtype (grad_out: out's), and, when grad_sinks is given (float32 or float64 inputs, the
/// query's dtype, shape (Hq,)), the options' sinks. `out` and `lse` are
/// the forward's results for the same inputs and options. The reference implementation
/// recomputes them in float64 from the inputs (it is the oracle) and only checks their shapes.
void attention_backward(const TensorRef& query, const TensorRef& key, const TensorRef& value,
                        const TensorRef* mask, const TensorRef& out, const TensorRef& lse,
                        const TensorRef& grad_out, const AttentionOptions& options,
                        const MutableTensorRef& grad_query, const MutableTensorRef& grad_key,
                        const MutableTensorRef& grad_value,
                        const MutableTensorRef* grad_sinks = nullptr);

// ---- Numerically stable softmax on one row -------------------------------------------------
// These accumulate in float64 whatever T is. softmax(c * x): the max is subtracted before exp,
// so nothing overflows for finite logits (|x| up to 1e30 and beyond, as long as scale * x is
// finite in float64). Entries equal to -inf get probability 0; a row that is all -inf gives all
// zeros (log_softmax: all -inf). If some entries are +inf, the probability is shared equally
// among them. NaN in, NaN out.

template <class T>
void softmax(std::span<const T> logits, std::span<T> probabilities, double scale = 1.0);
template <class T>
void log_softmax(std::span<const T> logits, std::span<T> log_probabilities, double scale = 1.0);
/// grad_logits = p * (grad_p - sum(p * grad_p)) for p = softmax(x): the vector-Jacobian product
/// of softmax (times `scale` if the softmax was of scale * x).
template <class T>
void softmax_backward(std::span<const T> probabilities, std::span<const T> grad_probabilities,
                      std::span<T> grad_logits, double scale = 1.0);

}  // namespace sdpa
