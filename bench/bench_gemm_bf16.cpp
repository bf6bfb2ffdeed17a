// The bfloat16 micro-kernel (kernels/gemm_bf16.h) against the float32 one on the products of one
// tile of the fused kernel: S = Q K^T (M = 64 query rows, N = 128 keys, K = E) and P V (M = 64,
// N = Ev, K = 128 keys). Operands are packed once, outside the timed loop; the counter is
// GFLOP/s = 2 M N K per call. Arguments: {path (0 float32, 1 bf16 vdpbf16ps, 2 bf16 fallback,
// 3 bf16 AMX tiles), M, N, K}. Run: build/bench/sdpa_gemm_bf16_bench (see docs/kernel.md).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "core/problem.h"
#include "kernels/dispatch.h"
#include "kernels/gemm_bf16.h"
#include "kernels/kernels.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

namespace bf16 = sdpa::detail::bf16;

void BM_Gemm(benchmark::State& state) {
  const auto path = state.range(0);
  const auto M = static_cast<std::size_t>(state.range(1));
  const auto N = static_cast<std::size_t>(state.range(2));
  const auto K = static_cast<std::size_t>(state.range(3));
  const std::size_t K2 = (K + 1) / 2;
  if (path == 1 && !bf16::native()) {
    state.SkipWithError("this CPU has no AVX512_BF16");
    return;
  }
  if (path == 3 && !bf16::amx()) {
    state.SkipWithError("this CPU has no AMX-BF16");
    return;
  }
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> a(M * K), b(K * N), c(M * N);
  for (float& x : a) x = normal(rng);
  for (float& x : b) x = normal(rng);
  std::vector<std::uint16_t> bh(K * N);
  for (std::size_t i = 0; i < bh.size(); ++i) bh[i] = bf16::from_float(b[i]);
  std::vector<std::uint32_t> ap(M * K2), bp(K2 * N);
  bf16::pack_rows_rounded(a.data(), M, K, K, ap.data(), K2);
  bf16::pack_row_pairs(bh.data(), K, N, N, bp.data(), N);
  bf16::force_fallback_for_test(path == 2);
  bf16::force_amx_off_for_test(path != 3);
  for (auto _ : state) {
    if (path == 0) {
      bf16::gemm_f32(true, M, N, K, a.data(), K, b.data(), N, c.data(), N);
    } else {
      bf16::gemm(true, M, N, K2, 1.0f, ap.data(), K2, bp.data(), N, c.data(), N);
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  bf16::force_fallback_for_test(false);
  bf16::force_amx_off_for_test(false);
  state.SetLabel(path == 0   ? "float32"
                 : path == 1 ? "bf16 vdpbf16ps"
                 : path == 2 ? "bf16 fallback"
                             : "bf16 AMX");
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(M * N * K), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

BENCHMARK(BM_Gemm)
    ->ArgNames({"path", "M", "N", "K"})
    ->ArgsProduct({{0, 1, 2, 3}, {64}, {128}, {64, 128}})
    ->Args({0, 64, 64, 128})
    ->Args({1, 64, 64, 128})
    ->Args({2, 64, 64, 128})
    ->Args({3, 64, 64, 128});

// The whole fused forward, float32 against bfloat16 on the pairs (AMX tiles where the CPU has
// them, else vdpbf16ps), at (1, H, N, E), 2 threads.
// Arguments: {dtype (0 float32, 1 bfloat16), H, N, E}. GFLOP/s with the standard count
// 4 H N^2 E per real second.
void BM_Forward(benchmark::State& state) {
  const bool half = state.range(0) == 1;
  const std::int64_t H = state.range(1), N = state.range(2), E = state.range(3);
  if (half && !bf16::native()) {
    state.SkipWithError("this CPU has no AVX512_BF16");
    return;
  }
  const bf16::ScopedPairsInKernel pairs(1);  // the pairs path, whichever the CPU's choice
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal;
  const std::vector<std::int64_t> shape{1, H, N, E};
  sdpa::Array q(sdpa::DType::float32, shape), k(sdpa::DType::float32, shape),
      v(sdpa::DType::float32, shape), out(sdpa::DType::float32, shape);
  sdpa::Array lse(sdpa::DType::float32, {1, H, N});
  for (sdpa::Array* a : {&q, &k, &v}) {
    for (std::int64_t i = 0; i < a->numel(); ++i) a->data_as<float>()[i] = normal(rng);
  }
  std::vector<std::uint16_t> qh(q.numel()), kh(q.numel()), vh(q.numel()), oh(q.numel());
  for (std::int64_t i = 0; i < q.numel(); ++i) {
    qh[i] = bf16::from_float(q.data_as<float>()[i]);
    kh[i] = bf16::from_float(k.data_as<float>()[i]);
    vh[i] = bf16::from_float(v.data_as<float>()[i]);
  }
  sdpa::AttentionOptions o;
  o.impl = sdpa::Impl::fast;
  o.threads = 2;
  sdpa::detail::Problem p = sdpa::detail::resolve_problem(q.ref(), k.ref(), v.ref(), nullptr, o);
  const sdpa::MutableTensorRef lse_ref = lse.mut();
  sdpa::detail::bind_forward(p, out.mut(), &lse_ref);
  if (half) {  // the same shapes and strides over bfloat16 data
    p.q.data = qh.data();
    p.k.data = kh.data();
    p.v.data = vh.data();
    p.out.data = oh.data();
    p.q.dtype = p.k.dtype = p.v.dtype = p.out.dtype = sdpa::DType::bfloat16;
    p.dtype = sdpa::DType::bfloat16;
  }
  for (auto _ : state) {
    sdpa::detail::fast_forward(p);
    benchmark::ClobberMemory();
  }
  state.SetLabel(!half ? "float32" : bf16::amx() ? "bfloat16 (AMX)" : "bfloat16 (vdpbf16ps)");
  state.counters["GFLOP/s"] = benchmark::Counter(
      4.0 * double(H) * double(N) * double(N) * double(E),
      benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

BENCHMARK(BM_Forward)
    ->ArgNames({"dtype", "H", "N", "E"})
    ->ArgsProduct({{0, 1}, {8}, {4096}, {128}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The fused backward at (1, H, N, E), 2 threads: float32 inputs, or bfloat16 inputs of the same
// values (views of dtype bfloat16: S and dP on bfloat16 pairs, the rest widened to float32).
// Arguments: {dtype (0 float32, 1 bfloat16), H, N, E}. GFLOP/s: 2.5 x 4 H N^2 E.
void BM_Backward(benchmark::State& state) {
  const bool half = state.range(0) == 1;
  const std::int64_t H = state.range(1), N = state.range(2), E = state.range(3);
  if (half && !bf16::native()) {
    state.SkipWithError("this CPU has no AVX512_BF16");
    return;
  }
  const bf16::ScopedPairsInKernel pairs(1);  // the pairs path, whichever the CPU's choice
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal;
  const std::vector<std::int64_t> shape{1, H, N, E};
  const auto f32 = sdpa::DType::float32;
  sdpa::Array q(f32, shape), k(f32, shape), v(f32, shape), dout(f32, shape), out(f32, shape);
  sdpa::Array dq(f32, shape), dk(f32, shape), dv(f32, shape), lse(f32, {1, H, N});
  std::vector<std::vector<std::uint16_t>> bits;
  for (sdpa::Array* a : {&q, &k, &v, &dout}) {
    std::vector<std::uint16_t>& h = bits.emplace_back(static_cast<std::size_t>(a->numel()));
    for (std::int64_t i = 0; i < a->numel(); ++i) {
      h[i] = bf16::from_float(normal(rng));
      a->data_as<float>()[i] = bf16::to_float(h[i]);
    }
  }
  sdpa::AttentionOptions o;
  o.impl = sdpa::Impl::fast;
  o.threads = 2;
  const sdpa::MutableTensorRef l = lse.mut();
  sdpa::attention_forward(q, k, v, nullptr, o, out.mut(), &l);
  sdpa::detail::Problem p = sdpa::detail::resolve_problem(q.ref(), k.ref(), v.ref(), nullptr, o);
  sdpa::detail::bind_backward(p, out.ref(), lse.ref(), dout.ref(), dq.mut(), dk.mut(), dv.mut());
  if (half) {
    for (auto [view, h] : {std::pair{&p.q, &bits[0]}, std::pair{&p.k, &bits[1]},
                           std::pair{&p.v, &bits[2]}, std::pair{&p.dout, &bits[3]}}) {
      view->data = h->data();
      view->dtype = sdpa::DType::bfloat16;
    }
  }
  for (auto _ : state) {
    sdpa::detail::fast_backward(p);
    benchmark::ClobberMemory();
  }
  state.SetLabel(!half         ? "float32"
                 : bf16::amx() ? "bfloat16 (S, dP on AMX)"
                               : "bfloat16 (S, dP on vdpbf16ps)");
  state.counters["GFLOP/s"] = benchmark::Counter(
      10.0 * double(H) * double(N) * double(N) * double(E),
      benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

BENCHMARK(BM_Backward)
    ->ArgNames({"dtype", "H", "N", "E"})
    ->ArgsProduct({{0, 1}, {8}, {4096}, {128}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
