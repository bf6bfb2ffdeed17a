// sdpa attention: read .npy inputs, run forward (and backward), write .npy outputs atomically.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "commands.h"
#include "io/npy.h"
#include "io/output.h"
#include "options.h"
#ifdef SDPA_HAS_MPI
#include "cmd_context_parallel.h"
#include "mpi/context_parallel.h"
#endif
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {
namespace {

struct AttentionArgs {
  std::string query, key, value, out, mask, lse, causal = "none", impl = "fast";
  std::optional<double> scale;
  bool enable_gqa = false;
  int threads = 0;
  std::string grad_output, grad_query, grad_key, grad_value;
  // Variants (docs/variants.md).
  std::string window, alibi_slopes, sinks, grad_sinks;
  double softcap = 0.0, dropout_p = 0.0;
  std::uint64_t seed = 0;
#ifdef SDPA_HAS_MPI
  ContextParallelCall context_parallel;
#endif
};

void check_gradient_flags(const AttentionArgs& a) {
  const bool any_grad = !a.grad_query.empty() || !a.grad_key.empty() || !a.grad_value.empty() ||
                        !a.grad_sinks.empty();
  if (!a.grad_output.empty() && !any_grad) {
    throw Error(ErrorKind::bad_value, "--grad-output",
                "expected with at least one of --grad-query, --grad-key, --grad-value, "
                "--grad-sinks, got none of them");
  }
  if (a.grad_output.empty() && any_grad) {
    throw Error(ErrorKind::bad_value, "--grad-output",
                "expected when --grad-query, --grad-key, --grad-value or --grad-sinks is given, "
                "got none");
  }
}

// --window LEFT,RIGHT: two integers, -1 for an unbounded side.
std::pair<std::int64_t, std::int64_t> parse_window(const std::string& text) {
  const auto comma = text.find(',');
  std::int64_t v[2] = {0, 0};
  bool ok = comma != std::string::npos;
  const std::string parts[2] = {ok ? text.substr(0, comma) : text,
                                ok ? text.substr(comma + 1) : std::string()};
  for (int i = 0; i < 2 && ok; ++i) {
    const char* begin = parts[i].data();
    const char* end = begin + parts[i].size();
    const auto [ptr, ec] = std::from_chars(begin, end, v[i]);
    ok = !parts[i].empty() && ec == std::errc() && ptr == end && v[i] >= -1;
  }
  if (!ok) {
    throw Error(
        ErrorKind::bad_value, "--window",
        fmt::format("expected LEFT,RIGHT, two integers >= -1 (-1 = unbounded), got '{}'", text));
  }
  return {v[0], v[1]};
}

// The options of the call; bad values are rejected here, before anything is read.
AttentionOptions make_options(const AttentionArgs& a) {
  AttentionOptions options;
  options.scale = a.scale;
  const std::map<std::string, std::string> flags = {{"causal", "--causal"}, {"impl", "--impl"}};
  options.causal = naming_flags(flags, [&] { return parse_causal(a.causal); });
  options.enable_gqa = a.enable_gqa;
  options.impl = naming_flags(flags, [&] { return parse_impl(a.impl); });
  options.threads = a.threads;
  resolve_threads(options.threads);
  if (!a.window.empty()) {
    const auto [left, right] = parse_window(a.window);
    options.window_left = left;
    options.window_right = right;
  }
  options.softcap = a.softcap;
  options.dropout_p = a.dropout_p;
  options.seed = a.seed;
  return options;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += std::to_string(shape[i]);
    text += i + 1 < shape.size() || shape.size() == 1 ? "," : "";
    if (i + 1 < shape.size()) text += " ";
  }
  return text + ")";
}

// The values of a float .npy (--alibi-slopes, --sinks) as float64, flattened, after checking
// that its shape is one of `allowed` (the flat data alone cannot tell (B, Hq) from (Hq, B)).
std::vector<double> read_values(const std::string& flag, const std::string& path,
                                const std::vector<std::vector<std::int64_t>>& allowed,
                                const std::string& allowed_text) {
  const Array raw = read_npy(path);
  if (raw.dtype() == DType::boolean) {
    throw Error(ErrorKind::bad_type, flag + " " + path, "expected float32 or float64, got bool");
  }
  if (std::find(allowed.begin(), allowed.end(), raw.shape()) == allowed.end()) {
    throw Error(ErrorKind::bad_shape, flag + " " + path,
                fmt::format("expected shape {}, got {}", allowed_text, shape_text(raw.shape())));
  }
  const Array a = raw.astype(DType::float64);
  return std::vector<double>(a.data_as<double>(), a.data_as<double>() + a.numel());
}

void run(const AttentionArgs& a) {
#ifdef SDPA_HAS_MPI
  // Context parallel: every rank runs this; the outputs are written (atomically) by the ranks
  // that hold them at the end, so no rank may leave temporaries behind if another one dies.
  if (!a.context_parallel.strategy.empty()) {
    check_gradient_flags(a);
    const AttentionOptions o = make_options(a);
    // The library refuses the same options on every rank; here before MPI starts, in flags.
    if (!mpi::unsupported_variant(o).empty() || !a.grad_sinks.empty()) {
      throw Error(ErrorKind::bad_value, "--context-parallel",
                  "expected without --window, --softcap, --alibi-slopes, --sinks, --dropout-p "
                  "(the ranks compute plain attention), got some of them");
    }
    return run_context_parallel_attention({a.query, a.key, a.value, a.mask, a.out, a.lse,
                                           a.grad_output, a.grad_query, a.grad_key, a.grad_value},
                                          make_options(a), a.context_parallel);
  }
#endif
  // Every output is validated, and its temporary created beside it, before any input is read:
  // an unwritable place fails in milliseconds, not after the computation.
  io::OutputCommit commit;
  commit.protect_input("--query", a.query);
  commit.protect_input("--key", a.key);
  commit.protect_input("--value", a.value);
  if (!a.mask.empty()) commit.protect_input("--mask", a.mask);
  if (!a.grad_output.empty()) commit.protect_input("--grad-output", a.grad_output);
  if (!a.alibi_slopes.empty()) commit.protect_input("--alibi-slopes", a.alibi_slopes);
  if (!a.sinks.empty()) commit.protect_input("--sinks", a.sinks);
  const std::size_t out_file = commit.add_file("--out", a.out);
  std::optional<std::size_t> lse_file, dq_file, dk_file, dv_file;
  if (!a.lse.empty()) lse_file = commit.add_file("--lse", a.lse);
  if (!a.grad_query.empty()) dq_file = commit.add_file("--grad-query", a.grad_query);
  if (!a.grad_key.empty()) dk_file = commit.add_file("--grad-key", a.grad_key);
  if (!a.grad_value.empty()) dv_file = commit.add_file("--grad-value", a.grad_value);
  std::optional<std::size_t> dsink_file;
  if (!a.grad_sinks.empty()) dsink_file = commit.add_file("--grad-sinks", a.grad_sinks);
  check_gradient_flags(a);
  if (!a.grad_sinks.empty() && a.sinks.empty()) {
    throw Error(ErrorKind::bad_value, "--grad-sinks", "expected only with --sinks, got no --sinks");
  }

  AttentionOptions options = make_options(a);
  const Array q = read_npy(a.query);
  // Hq is the query's third dimension from the end ((L, E) has one head); the batch dimensions
  // come before it.
  const auto& qs = q.shape();
  const std::vector<std::int64_t> per_head = {qs.size() >= 3 ? qs[qs.size() - 3] : 1};
  const std::vector<std::int64_t> per_batch_and_head(qs.begin(),
                                                     qs.size() >= 2 ? qs.end() - 2 : qs.begin());
  if (!a.alibi_slopes.empty()) {
    options.alibi_slopes = read_values(
        "--alibi-slopes", a.alibi_slopes, {per_head, per_batch_and_head},
        shape_text(per_head) +
            (qs.size() >= 4 ? " or " + shape_text(per_batch_and_head) + " (..., Hq)" : "") +
            " for a query of shape " + shape_text(qs));
  }
  if (!a.sinks.empty()) {
    options.sinks =
        read_values("--sinks", a.sinks, {per_head},
                    shape_text(per_head) + " (Hq,) for a query of shape " + shape_text(qs));
  }
  // The API's parameters, as this command spells them.
  const std::map<std::string, std::string> flags = {
      {"query", "--query " + a.query},
      {"key", "--key " + a.key},
      {"value", "--value " + a.value},
      {"mask", "--mask " + a.mask},
      {"enable_gqa", "--enable-gqa"},
      {"causal", "--causal"},
      {"impl", "--impl"},
      {"window_left", "--window"},
      {"window_right", "--window"},
      {"softcap", "--softcap"},
      {"dropout_p", "--dropout-p"},
      {"alibi_slopes", "--alibi-slopes " + a.alibi_slopes},
      {"sinks", "--sinks " + a.sinks},
      {"grad_out", "--grad-output " + a.grad_output},
      {"grad_sinks", "--grad-sinks " + a.grad_sinks}};
  const Array k = read_npy(a.key);
  const Array v = read_npy(a.value);
  std::optional<Array> mask;
  if (!a.mask.empty()) mask = read_npy(a.mask);
  // A 16-bit mask over float32 or float64 inputs is read as its exact float32 values, as the
  // library does; converting it here keeps the call off the 16-bit path, which refuses
  // --grad-sinks for want of a half-precision query, key or value.
  auto is_16bit = [](DType t) { return t == DType::float16 || t == DType::bfloat16; };
  if (mask && is_16bit(mask->dtype()) && !is_16bit(q.dtype()) && !is_16bit(k.dtype()) &&
      !is_16bit(v.dtype())) {
    mask = mask->astype(DType::float32);
  }
  const TensorRef mask_ref = mask ? mask->ref() : TensorRef{};

  Array out(q.dtype() == DType::boolean ? DType::float32 : q.dtype(),
            naming_flags(flags, [&] { return attention_output_shape(q, k, v, options); }));
  const bool half = out.dtype() == DType::float16 || out.dtype() == DType::bfloat16;
  Array lse(half ? DType::float32 : out.dtype(), attention_lse_shape(q));  // float32 for 16-bit
  const MutableTensorRef lse_ref = lse.mut();
  naming_flags(flags, [&] {
    attention_forward(q, k, v, mask ? &mask_ref : nullptr, options, out.mut(), &lse_ref);
  });

  io::write_npy(commit, out_file, out.ref());
  if (lse_file) io::write_npy(commit, *lse_file, lse.ref());
  if (!a.grad_output.empty()) {
    const Array dout = read_npy(a.grad_output);
    Array dq(q.dtype(), q.shape()), dk(k.dtype(), k.shape()), dv(v.dtype(), v.shape());
    Array dsinks(q.dtype(), {static_cast<std::int64_t>(options.sinks.size())});
    const MutableTensorRef dsinks_ref = dsinks.mut();
    naming_flags(flags, [&] {
      attention_backward(q, k, v, mask ? &mask_ref : nullptr, out, lse, dout, options, dq.mut(),
                         dk.mut(), dv.mut(), dsink_file ? &dsinks_ref : nullptr);
    });
    if (dq_file) io::write_npy(commit, *dq_file, dq.ref());
    if (dk_file) io::write_npy(commit, *dk_file, dk.ref());
    if (dv_file) io::write_npy(commit, *dv_file, dv.ref());
    if (dsink_file) io::write_npy(commit, *dsink_file, dsinks.ref());
  }
  commit.commit();
}

}  // namespace

void add_attention_command(CLI::App& app) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = app.add_subcommand(
      "attention",
      "Compute softmax(Q K^T * scale + mask) V from .npy files.\n"
      "Shapes: query (..., Hq, L, E), key (..., Hkv, S, E), value (..., Hkv, S, Ev) -> out "
      "(..., Hq, L, Ev).\nOutputs have the query's dtype and are written atomically.");
  cmd->add_option("--query", args->query,
                  "query .npy, (..., Hq, L, E): float32, float64, float16 ('<f2') or bfloat16 "
                  "(its bits as '<u2'); key and value have its dtype, or a float32 or bfloat16 "
                  "query reads float16 or bfloat16 key and value")
      ->required();
  cmd->add_option("--key", args->key, "key .npy, (..., Hkv, S, E)")->required();
  cmd->add_option("--value", args->value, "value .npy, (..., Hkv, S, Ev)")->required();
  cmd->add_option("--out", args->out, "output .npy, (..., Hq, L, Ev)")->required();
  cmd->add_option("--mask", args->mask,
                  "mask .npy broadcastable to (..., Hq, L, S): bool (true = attend) or float "
                  "(added to the scores, -inf allowed)");
  cmd->add_option("--causal", args->causal,
                  "causal mask: none, upper-left (PyTorch is_causal) or lower-right "
                  "(FlashAttention)")
      ->capture_default_str();
  cmd->add_option("--scale", args->scale, "score scale (default 1/sqrt(E)); must be finite")
      ->check(finite_number_validator());
  cmd->add_flag("--enable-gqa", args->enable_gqa,
                "grouped-query attention: Hq a multiple of Hkv, query head h uses kv head "
                "h / (Hq/Hkv)");
  cmd->add_option("--lse", args->lse, "also write the log-sum-exp of each row, (..., Hq, L)");
  cmd->add_option("--impl", args->impl, "fast (fused kernel), reference (float64 oracle) or naive")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "threads; 0 = one per core")
      ->check(threads_validator())
      ->capture_default_str();
  cmd->add_option("--grad-output", args->grad_output,
                  "gradient of the loss with respect to out, (..., Hq, L, Ev): runs backward");
  cmd->add_option("--grad-query", args->grad_query, "write dL/dquery here");
  cmd->add_option("--grad-key", args->grad_key, "write dL/dkey here");
  cmd->add_option("--grad-value", args->grad_value, "write dL/dvalue here");
  cmd->add_option("--window", args->window,
                  "sliding window LEFT,RIGHT: query i sees keys i+d-LEFT .. i+d+RIGHT, "
                  "d = S - L; -1 = unbounded side (FlashAttention's window_size)");
  cmd->add_option("--softcap", args->softcap,
                  "logit softcap c: score = c * tanh(scale * q.k / c); 0 = off")
      ->capture_default_str();
  cmd->add_option("--alibi-slopes", args->alibi_slopes,
                  "ALiBi slopes .npy, (Hq,) or (..., Hq): adds -slope * |i + d - j| to the score");
  cmd->add_option("--sinks", args->sinks,
                  "attention sinks .npy, (Hq,): one logit per head in the softmax denominator");
  cmd->add_option("--grad-sinks", args->grad_sinks,
                  "write dL/dsinks here (with --sinks; float32 or float64 query, key and value "
                  "only)");
  cmd->add_option("--dropout-p", args->dropout_p,
                  "dropout probability in [0, 1) on the attention weights (Philox, --seed)")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "seed of the dropout mask")
      ->check(seed_validator())
      ->capture_default_str();
#ifdef SDPA_HAS_MPI
  add_context_parallel_options(cmd, args->context_parallel);
#endif
  cmd->callback([args] { run(*args); });
}

}  // namespace sdpa::cli
