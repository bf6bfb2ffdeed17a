// The bfloat16 micro-kernel (kernels/gemm_bf16.h) against the float32 one on the products of one
// tile of the fused kernel: S = Q K^T (M = 64 query rows, N = 128 keys, K = E) and P V (M = 64,
// N = Ev, K = 128 keys). Operands are packed once, outside the timed loop; the counter is
// GFLOP/s = 2 M N K per call. Arguments: {path (0 float32, 1 bf16 native, 2 bf16 fallback), M,
// N, K}. Run: build/bench/sdpa_gemm_bf16_bench (see docs/kernel.md).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/gemm_bf16.h"

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
  state.SetLabel(path == 0 ? "float32" : path == 1 ? "bf16 native" : "bf16 fallback");
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(M * N * K), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

BENCHMARK(BM_Gemm)
    ->ArgNames({"path", "M", "N", "K"})
    ->ArgsProduct({{0, 1, 2}, {64}, {128}, {64, 128}})
    ->Args({0, 64, 64, 128})
    ->Args({1, 64, 64, 128})
    ->Args({2, 64, 64, 128});

}  // namespace

BENCHMARK_MAIN();
