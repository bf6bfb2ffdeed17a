// A downstream program: includes the installed sdpa.h with its project's default C++ standard
// and checks one attention call against a hand computation. With S = 2 keys, E = 1 and scale 1:
// out = (exp(q k0) v0 + exp(q k1) v1) / (exp(q k0) + exp(q k1)).
#include <sdpa/sdpa.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  std::vector<float> q{0.5f}, k{1.0f, -2.0f}, v{3.0f, 7.0f}, out(1, 0.0f);
  sdpa::AttentionOptions options;
  options.scale = 1.0;
  sdpa::attention_forward(sdpa::TensorRef{q.data(), sdpa::DType::float32, {1, 1}},
                          sdpa::TensorRef{k.data(), sdpa::DType::float32, {2, 1}},
                          sdpa::TensorRef{v.data(), sdpa::DType::float32, {2, 1}}, nullptr, options,
                          sdpa::MutableTensorRef{out.data(), sdpa::DType::float32, {1, 1}});
  const double w0 = std::exp(0.5), w1 = std::exp(-1.0);
  const double expected = (w0 * 3.0 + w1 * 7.0) / (w0 + w1);
  const double error = std::fabs(out[0] - expected) / expected;
  std::printf("sdpa %s: out %.7g, expected %.7g, relative error %.2g\n", sdpa::version(), out[0],
              expected, error);
  try {  // a bad call throws sdpa::Error across the library boundary
    sdpa::attention_forward(sdpa::TensorRef{q.data(), sdpa::DType::float32, {1, 1}},
                            sdpa::TensorRef{k.data(), sdpa::DType::float32, {1, 2}},
                            sdpa::TensorRef{v.data(), sdpa::DType::float32, {2, 1}}, nullptr,
                            options,
                            sdpa::MutableTensorRef{out.data(), sdpa::DType::float32, {1, 1}});
    std::printf("error: a key of the wrong shape was accepted\n");
    return 1;
  } catch (const sdpa::Error& e) {
    std::printf("rejected as expected: %s\n", e.what());
  }
  return error < 2e-5 ? 0 : 1;
}
