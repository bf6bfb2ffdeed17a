// Google Benchmark suite: the fused kernel beside the naive three-pass baseline, forward and
// backward, on the shapes of the targets (and smaller ones that run quickly).
// Counters: GFLOP/s with the standard count (forward 4*B*H*L*S*E, halved when causal;
// backward 2.5x forward). Inputs, outputs and one warm-up call are outside the timed loop.
// Arguments: {impl (0 fast, 1 naive), H, L = S, E, causal (0 none, 1 lower-right)}.
#include <benchmark/benchmark.h>

#include <random>

#include "kernels/dispatch.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::Array;
using sdpa::DType;

Array random_array(std::vector<std::int64_t> shape, std::uint64_t seed) {
  Array a(DType::float32, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (std::int64_t i = 0; i < a.numel(); ++i) a.data_as<float>()[i] = normal(rng);
  return a;
}

struct Setup {
  Array q, k, v, out, lse, dout, dq, dk, dv;
  sdpa::AttentionOptions options;
  double flops = 0;

  explicit Setup(const benchmark::State& state) {
    const std::int64_t H = state.range(1), N = state.range(2), E = state.range(3);
    options.impl = state.range(0) == 0 ? sdpa::Impl::fast : sdpa::Impl::naive;
    options.causal = state.range(4) == 0 ? sdpa::Causal::none : sdpa::Causal::lower_right;
    q = random_array({1, H, N, E}, 1);
    k = random_array({1, H, N, E}, 2);
    v = random_array({1, H, N, E}, 3);
    dout = random_array({1, H, N, E}, 4);
    out = Array(DType::float32, q.shape());
    lse = Array(DType::float32, {1, H, N});
    dq = Array(DType::float32, q.shape());
    dk = Array(DType::float32, k.shape());
    dv = Array(DType::float32, v.shape());
    flops = 4.0 * double(H) * double(N) * double(N) * double(E);
    if (options.causal != sdpa::Causal::none) flops /= 2;
  }
  void forward() {
    const sdpa::MutableTensorRef l = lse.mut();
    sdpa::attention_forward(q, k, v, nullptr, options, out.mut(), &l);
  }
  void backward() {
    sdpa::attention_backward(q, k, v, nullptr, out, lse, dout, options, dq.mut(), dk.mut(),
                             dv.mut());
  }
};

void label(benchmark::State& state, const Setup& s) {
  state.SetLabel(s.options.impl == sdpa::Impl::fast ? sdpa::detail::fast_kernel_target()
                                                    : "naive (OpenBLAS)");
}

void BM_Forward(benchmark::State& state) {
  Setup s(state);
  s.forward();  // warm-up: workspaces faulted in
  for (auto _ : state) s.forward();
  state.counters["GFLOP/s"] =
      benchmark::Counter(s.flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  label(state, s);
}

void BM_Backward(benchmark::State& state) {
  Setup s(state);
  s.forward();
  s.backward();
  for (auto _ : state) s.backward();
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.5 * s.flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  label(state, s);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"naive", "H", "N", "E", "causal"});
  for (int impl : {0, 1}) {
    b->Args({impl, 8, 1024, 64, 0});
    b->Args({impl, 8, 1024, 128, 0});
    b->Args({impl, 8, 4096, 64, 0});
    b->Args({impl, 8, 4096, 128, 0});
  }
  b->Args({0, 8, 4096, 64, 1});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Forward)->Apply(Shapes);
BENCHMARK(BM_Backward)->Apply(Shapes);

}  // namespace

BENCHMARK_MAIN();
