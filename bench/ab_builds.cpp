// sdpa_ab_builds: two builds of libsdpa in one process, timed call by call.
//
// A kernel change is judged by its speedup over the code before it, and on a shared virtual
// machine a speedup of a few percent is smaller than the drift between two runs of one binary.
// Timing the two builds in separate processes, or switching between two versions of the code at
// run time inside one build, has both misled this project: the first by the drift, the second by
// the switch itself, which changes the code it tests. This program loads the two shared libraries
// side by side (dlopen with RTLD_DEEPBIND, so that each one's calls stay inside it), feeds them
// the same inputs and alternates their calls (A B, then B A, ...), so both see the same machine.
// It prints the median over the pairs of time(A) / time(B), with its interquartile range, each
// side's median time, and whether the two builds' outputs are bit-identical.
//
//   sdpa_ab_builds OLD/libsdpa.so NEW/libsdpa.so --pass decode --dtype bfloat16
//
// The symbols are found by the names of this program's own sdpa functions (dladdr), so the
// builds must share the public API of the headers it was compiled with.
#include <dlfcn.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "sdpa/array.h"
#include "sdpa/kvcache.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::Array;
using sdpa::DType;

using DecodeFn = decltype(&sdpa::attention_with_kvcache);
using ForwardFn = decltype(&sdpa::attention_forward);
using BackwardFn = decltype(&sdpa::attention_backward);

struct Build {
  DecodeFn decode = nullptr;
  ForwardFn forward = nullptr;
  BackwardFn backward = nullptr;
};

// The exported name of one of this program's own sdpa functions.
std::string SymbolName(void* fn, const char* what) {
  Dl_info info{};
  if (dladdr(fn, &info) == 0 || info.dli_sname == nullptr) {
    throw std::runtime_error(std::string("cannot name ") + what +
                             ": sdpa_ab_builds needs libsdpa built as a shared library");
  }
  return info.dli_sname;
}

template <class Fn>
Fn Resolve(void* handle, const std::string& path, const std::string& name) {
  void* sym = dlsym(handle, name.c_str());
  if (sym == nullptr) throw std::runtime_error(path + ": has no symbol " + name);
  return reinterpret_cast<Fn>(sym);
}

Build Load(const std::string& path, const char* which) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (handle == nullptr) {
    throw std::runtime_error(std::string(which) + ": expected a loadable libsdpa shared library, " +
                             "got '" + path + "' (" + dlerror() + ")");
  }
  Build b;
  b.decode = Resolve<DecodeFn>(
      handle, path,
      SymbolName(reinterpret_cast<void*>(&sdpa::attention_with_kvcache), "attention_with_kvcache"));
  b.forward = Resolve<ForwardFn>(
      handle, path,
      SymbolName(reinterpret_cast<void*>(&sdpa::attention_forward), "attention_forward"));
  b.backward = Resolve<BackwardFn>(
      handle, path,
      SymbolName(reinterpret_cast<void*>(&sdpa::attention_backward), "attention_backward"));
  return b;
}

Array RandomNormal(const std::vector<std::int64_t>& shape, DType dtype, std::uint64_t seed) {
  Array a(DType::float32, shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  float* x = a.data_as<float>();
  for (std::int64_t i = 0; i < a.numel(); ++i) x[i] = normal(rng);
  return dtype == DType::float32 ? std::move(a) : a.astype(dtype);
}

// The dtype that sdpa::dtype_name spells `name` (one of the --dtype choices).
DType ParseDType(const std::string& name) {
  for (const DType dtype : {DType::float16, DType::bfloat16}) {
    if (name == sdpa::dtype_name(dtype)) return dtype;
  }
  return DType::float32;
}

bool SameBytes(const Array& a, const Array& b) {
  const auto* x = static_cast<const unsigned char*>(a.data());
  return std::equal(x, x + a.nbytes(), static_cast<const unsigned char*>(b.data()));
}

double Seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Time two builds of libsdpa in one process, call by call (A B, B A, ...): the median of "
      "time(A) / time(B) over the pairs, its interquartile range, and whether the outputs are "
      "bit-identical"};
  std::string lib_a, lib_b, pass = "decode", dtype_name = "float32";
  std::int64_t B = 1, H = 32, Hkv = 8, L = -1, S = 32768, E = 128;
  int threads = 0, rounds = 30, caches = 4;
  std::uint64_t seed = 0;
  bool json = false;
  app.add_option("lib_a", lib_a, "the first build's libsdpa.so (the code before)")->required();
  app.add_option("lib_b", lib_b, "the second build's libsdpa.so (the change)")->required();
  app.add_option("--pass", pass, "decode (attention_with_kvcache), forward or backward")
      ->check(CLI::IsMember({"decode", "forward", "backward"}))
      ->capture_default_str();
  app.add_option("--dtype", dtype_name,
                 "the caches' dtype (decode; the query stays float32), or every input's")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}))
      ->capture_default_str();
  app.add_option("--batch", B, "B")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--heads", H, "query heads")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--kv-heads", Hkv, "key/value heads (a divisor of --heads)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seq", L, "query length L (default: 1 for decode, --kv-seq otherwise)");
  app.add_option("--kv-seq", S, "key/value length S")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--dim", E, "E = Ev")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--threads", threads, "threads (0: one per core)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "timed pairs")
      ->check(CLI::Range(2, 100000))
      ->capture_default_str();
  app.add_option("--caches", caches,
                 "decode: copies of K/V, used in turn, so that calls read memory")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--seed", seed, "the inputs' seed")->capture_default_str();
  app.add_flag("--json", json, "print one JSON object");
  CLI11_PARSE(app, argc, argv);

  try {
    if (H % Hkv != 0) {
      throw std::runtime_error("--kv-heads: expected a divisor of --heads (" + std::to_string(H) +
                               "), got " + std::to_string(Hkv));
    }
    if (L < 0) L = pass == "decode" ? 1 : S;
    if (L == 0) throw std::runtime_error("--seq: expected a positive length, got 0");
    if (pass == "decode" && S > std::numeric_limits<std::int32_t>::max()) {
      throw std::runtime_error("--kv-seq: a decode's cache length is int32, got " +
                               std::to_string(S));
    }
    const DType dtype = ParseDType(dtype_name);
    const Build build[2] = {Load(lib_a, "lib_a"), Load(lib_b, "lib_b")};

    // The inputs, shared by both builds; one output per build.
    std::vector<Array> k, v;
    const int copies = pass == "decode" ? caches : 1;
    for (int c = 0; c < copies; ++c) {
      const std::vector<std::int64_t> kv_shape = pass == "decode"
                                                     ? std::vector<std::int64_t>{B, S, Hkv, E}
                                                     : std::vector<std::int64_t>{B, Hkv, S, E};
      k.push_back(RandomNormal(kv_shape, dtype, seed * 1000 + 2 * c + 2));
      v.push_back(RandomNormal(kv_shape, dtype, seed * 1000 + 2 * c + 3));
    }
    const DType qtype = pass == "decode" ? DType::float32 : dtype;
    const std::vector<std::int64_t> q_shape = pass == "decode"
                                                  ? std::vector<std::int64_t>{B, L, H, E}
                                                  : std::vector<std::int64_t>{B, H, L, E};
    const Array q = RandomNormal(q_shape, qtype, seed * 1000 + 1);
    const Array dout = RandomNormal(q_shape, qtype, seed * 1000 + 999);
    std::vector<std::int32_t> lens(static_cast<std::size_t>(B), static_cast<std::int32_t>(S));
    const sdpa::Int32TensorRef seqlens{lens.data(), {B}};
    sdpa::KVCacheInputs kv_in;
    kv_in.cache_seqlens = &seqlens;
    sdpa::KVCacheOptions kv_opt;
    kv_opt.threads = threads;
    sdpa::AttentionOptions opt;
    opt.threads = threads;
    opt.enable_gqa = Hkv != H;
    Array out[2] = {Array(qtype, q_shape), Array(qtype, q_shape)};
    Array lse(DType::float32, {B, H, L});
    const sdpa::MutableTensorRef lse_ref = lse.mut();
    Array grads[2][3];
    if (pass == "backward") {
      build[0].forward(q, k[0], v[0], nullptr, opt, out[0].mut(), &lse_ref);
      for (auto& g : grads) {
        g[0] = Array(dtype, q_shape);
        g[1] = Array(dtype, k[0].shape());
        g[2] = Array(dtype, v[0].shape());
      }
    }

    int call = 0;
    const auto run = [&](int side) {
      const int c = (call++ / 2) % copies;
      const auto t0 = std::chrono::steady_clock::now();
      if (pass == "decode") {
        build[side].decode(q, k[c].mut(), v[c].mut(), kv_in, kv_opt, out[side].mut(), nullptr);
      } else if (pass == "forward") {
        build[side].forward(q, k[c], v[c], nullptr, opt, out[side].mut(), nullptr);
      } else {
        build[side].backward(q, k[c], v[c], nullptr, out[0], lse, dout, opt, grads[side][0].mut(),
                             grads[side][1].mut(), grads[side][2].mut(), nullptr);
      }
      return Seconds(t0);
    };
    const auto same = [&] {
      if (pass != "backward") return SameBytes(out[0], out[1]);
      return SameBytes(grads[0][0], grads[1][0]) && SameBytes(grads[0][1], grads[1][1]) &&
             SameBytes(grads[0][2], grads[1][2]);
    };

    for (int w = 0; w < 2 * copies; ++w) run(w % 2);  // warm-up: every copy once per build
    bool identical = true;
    std::vector<double> ta, tb, ratio;
    for (int r = 0; r < rounds; ++r) {
      double a = 0, b = 0;
      if (r % 2 == 0) {
        a = run(0);
        b = run(1);
      } else {
        b = run(1);
        a = run(0);
      }
      identical = identical && same();
      ta.push_back(a);
      tb.push_back(b);
      ratio.push_back(a / b);
      if ((r + 1) % 10 == 0) std::fprintf(stderr, "round %d/%d\n", r + 1, rounds);
    }
    const double med = Quantile(ratio, 0.5), q1 = Quantile(ratio, 0.25), q3 = Quantile(ratio, 0.75);
    if (json) {
      nlohmann::json j;
      j["pass"] = pass;
      j["dtype"] = dtype_name;
      j["shape"] = {{"batch", B}, {"heads", H},  {"kv_heads", Hkv},
                    {"seq", L},   {"kv_seq", S}, {"dim", E}};
      j["threads"] = sdpa::resolve_threads(threads);
      j["rounds"] = rounds;
      j["speedup_median"] = med;
      j["speedup_q1"] = q1;
      j["speedup_q3"] = q3;
      j["seconds_a_median"] = Quantile(ta, 0.5);
      j["seconds_b_median"] = Quantile(tb, 0.5);
      j["bit_identical"] = identical;
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf(
          "%s, %s, B %lld H %lld Hkv %lld L %lld S %lld E %lld, %d threads, %d pairs: "
          "time(A) / time(B) median %.3f (IQR %.3f-%.3f); A %.3f ms, B %.3f ms; outputs %s\n",
          pass.c_str(), dtype_name.c_str(), static_cast<long long>(B), static_cast<long long>(H),
          static_cast<long long>(Hkv), static_cast<long long>(L), static_cast<long long>(S),
          static_cast<long long>(E), sdpa::resolve_threads(threads), rounds, med, q1, q3,
          Quantile(ta, 0.5) * 1e3, Quantile(tb, 0.5) * 1e3, identical ? "bit-identical" : "DIFFER");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdpa_ab_builds: %s\n", e.what());
    return 2;
  }
  return 0;
}
