// Running the lab and the benchmark for the report.
#include "report/collect.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "bench/bench.h"
#include "io/output.h"
#include "lab/lab.h"
#include "lab/random.h"
#include "lab/streams.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace sdpa::report {
namespace fs = std::filesystem;

std::vector<std::string> lab_experiment_names() {
  std::vector<std::string> names;
  for (const auto& e : lab::experiments()) names.push_back(e.name);
  return names;
}

namespace {

// A lab result nests 5 levels deep; 64 leaves room and keeps a hostile file (a million '[')
// from overflowing the stack of the serializer, which recurses once per level.
constexpr int kMaxJsonDepth = 64;

json read_json_file(const fs::path& path) {
  const int fd = io::open_regular_for_reading(path.string(), "--from");
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw Error(ErrorKind::io, "--from",
                  fmt::format("cannot read {}: {}", path.string(), std::strerror(e)));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  try {
    return json::parse(text, [&](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) {
        throw Error(ErrorKind::io, "--from",
                    fmt::format("{}: expected a lab result, got JSON nested more than {} levels "
                                "deep",
                                path.string(), kMaxJsonDepth));
      }
      return true;
    });
  } catch (const json::exception& e) {
    throw Error(ErrorKind::io, "--from",
                fmt::format("{} is not valid JSON: {}", path.string(), e.what()));
  }
}

// The shape the sections read, checked on files given with --from, so that a file of the wrong
// shape is refused naming it rather than failing deep in the page: a lab result is an object
// whose "tables" are arrays of objects (rows); bench.json is an object whose "rows" are objects
// and whose "accuracy" has "impls" of objects of objects.
void check_lab_shape(const fs::path& path, const json& result) {
  auto refuse = [&](const std::string& what) {
    throw Error(
        ErrorKind::io, "--from",
        fmt::format("{}: expected a lab result (`sdpa lab --json`), got {}", path.string(), what));
  };
  if (!result.is_object()) refuse(fmt::format("a JSON {}", result.type_name()));
  // The file's name says which experiment the page credits: the result must be that one's.
  const std::string stem = path.stem().string();
  if (result.contains("experiment") &&
      (!result["experiment"].is_string() || result["experiment"].get<std::string>() != stem)) {
    refuse(fmt::format("\"experiment\": {} (expected \"{}\", as the file is named)",
                       result["experiment"].dump(), stem));
  }
  if (result.contains("claims")) {
    if (!result["claims"].is_array()) {
      refuse(fmt::format("\"claims\" as a JSON {}", result["claims"].type_name()));
    }
    for (const auto& claim : result["claims"]) {
      if (!claim.is_object()) refuse(fmt::format("a claim as a JSON {}", claim.type_name()));
    }
  }
  if (!result.contains("tables")) return;
  const json& tables = result["tables"];
  if (!tables.is_object()) refuse(fmt::format("\"tables\" as a JSON {}", tables.type_name()));
  for (const auto& [name, rows] : tables.items()) {
    if (!rows.is_array()) refuse(fmt::format("table \"{}\" as a JSON {}", name, rows.type_name()));
    for (const auto& row : rows) {
      if (!row.is_object()) {
        refuse(fmt::format("a row of table \"{}\" as a JSON {}", name, row.type_name()));
      }
    }
  }
}

void check_bench_shape(const fs::path& path, const json& bench) {
  auto refuse = [&](const std::string& what) {
    throw Error(ErrorKind::io, "--from",
                fmt::format("{}: expected the benchmark's results (an earlier report's "
                            "data/bench.json), got {}",
                            path.string(), what));
  };
  if (!bench.is_object()) refuse(fmt::format("a JSON {}", bench.type_name()));
  if (bench.contains("rows")) {
    const json& rows = bench["rows"];
    if (!rows.is_array()) refuse(fmt::format("\"rows\" as a JSON {}", rows.type_name()));
    for (const auto& row : rows) {
      if (!row.is_object()) refuse(fmt::format("a row as a JSON {}", row.type_name()));
    }
  }
  if (bench.contains("accuracy")) {
    const json& a = bench["accuracy"];
    if (!a.is_object()) refuse(fmt::format("\"accuracy\" as a JSON {}", a.type_name()));
    if (!a.contains("impls")) return;
    if (!a["impls"].is_object()) {
      refuse(fmt::format("\"accuracy.impls\" as a JSON {}", a["impls"].type_name()));
    }
    for (const auto& [impl, outputs] : a["impls"].items()) {
      if (!outputs.is_object()) {
        refuse(fmt::format("\"accuracy.impls.{}\" as a JSON {}", impl, outputs.type_name()));
      }
      for (const auto& [name, e] : outputs.items()) {
        if (!e.is_object()) {
          refuse(fmt::format("\"accuracy.impls.{}.{}\" as a JSON {}", impl, name, e.type_name()));
        }
      }
    }
  }
}

// Benchmark shapes. Quick: L = S = 1024 (2.1 GFLOP per forward at E = 64, tens of ms even for
// the naive baseline), so the whole benchmark stays within a few seconds. Full:
// the kernel's target shapes, L = S = 4096.
struct Shape {
  std::string label;
  std::int64_t heads, seq, dim;
  Causal causal;
  bool backward;
};

std::vector<Shape> bench_shapes(Mode mode) {
  const std::int64_t n = mode == Mode::quick ? 1024 : 4096;
  return {{"fwd E=64", 8, n, 64, Causal::none, false},
          {"fwd E=128", 8, n, 128, Causal::none, false},
          {"fwd E=64 causal", 8, n, 64, Causal::lower_right, false},
          {"bwd E=64", 8, n, 64, Causal::none, true}};
}

json run_benchmarks(const ReportOptions& options, const Progress& progress) {
  json rows = json::array();
  for (const Shape& s : bench_shapes(options.mode)) {
    for (Impl impl : {Impl::fast, Impl::naive}) {
      progress(fmt::format("benchmark {} ({})", s.label, impl_name(impl)));
      bench::BenchConfig c;
      c.heads = s.heads;
      c.seq = s.seq;
      c.dim = s.dim;
      c.causal = s.causal;
      c.backward = s.backward;
      c.impl = impl;
      c.threads = options.threads;
      c.repeat = options.mode == Mode::quick ? 3 : 5;
      json row = bench::run_bench(c);
      row["label"] = s.label;
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

double max_abs(const Array& a) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double v = a.dtype() == DType::float32 ? a.data_as<float>()[i] : a.data_as<double>()[i];
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  }
  return m;
}

// max |x - ref| / max |ref|, with the index of the worst element.
json relative_error(const Array& x, const Array& ref) {
  double worst = 0;
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    const double a = x.dtype() == DType::float32 ? x.data_as<float>()[i] : x.data_as<double>()[i];
    const double b = ref.data_as<double>()[i];
    const double e = std::abs(a - b);
    if (!(e <= worst)) {  // NaN counts as the worst
      worst = e;
      at = i;
    }
  }
  const double scale = max_abs(ref);
  return {{"max_abs_error", worst},
          {"max_abs_reference", scale},
          {"relative_error", scale > 0 ? worst / scale : worst},
          {"worst_index", at}};
}

}  // namespace

json measure_accuracy(std::uint64_t seed, int threads) {
  // B=1, H=4, L=S=512, E=64: large enough that the kernel tiles and threads as in real use,
  // small enough that the float64 reference backward takes well under a second.
  const std::vector<std::int64_t> qs = {1, 4, 512, 64};
  auto fill = [&](std::uint64_t stream) {
    Array a(DType::float32, qs);
    lab::Stream rng(seed, lab::streams::kAccuracy + stream);
    for (std::int64_t i = 0; i < a.numel(); ++i) a.data_as<float>()[i] = float(rng.normal());
    return a;
  };
  const Array q = fill(1), k = fill(2), v = fill(3), dout = fill(4);
  const Array q64 = q.astype(DType::float64), k64 = k.astype(DType::float64),
              v64 = v.astype(DType::float64), dout64 = dout.astype(DType::float64);
  const std::vector<std::int64_t> lse_shape = {1, 4, 512};
  Array ref_out(DType::float64, qs), ref_lse(DType::float64, lse_shape);
  Array ref_dq(DType::float64, qs), ref_dk(DType::float64, qs), ref_dv(DType::float64, qs);
  AttentionOptions o;
  o.threads = threads;
  o.impl = Impl::reference;
  auto lse64 = ref_lse.mut();
  attention_forward(q64, k64, v64, nullptr, o, ref_out.mut(), &lse64);
  attention_backward(q64, k64, v64, nullptr, ref_out, ref_lse, dout64, o, ref_dq.mut(),
                     ref_dk.mut(), ref_dv.mut());
  json result = {{"shape", "B=1, H=4, L=S=512, E=64, float32, scale 1/sqrt(E)"},
                 {"seed", seed},
                 {"impls", json::object()}};
  for (Impl impl : {Impl::fast, Impl::naive}) {
    o.impl = impl;
    Array out(DType::float32, qs), lse(DType::float32, lse_shape);
    Array dq(DType::float32, qs), dk(DType::float32, qs), dv(DType::float32, qs);
    auto lse_ref = lse.mut();
    attention_forward(q, k, v, nullptr, o, out.mut(), &lse_ref);
    attention_backward(q, k, v, nullptr, out, lse, dout, o, dq.mut(), dk.mut(), dv.mut());
    result["impls"][impl_name(impl)] = {{"out", relative_error(out, ref_out)},
                                        {"lse", relative_error(lse, ref_lse)},
                                        {"dq", relative_error(dq, ref_dq)},
                                        {"dk", relative_error(dk, ref_dk)},
                                        {"dv", relative_error(dv, ref_dv)}};
  }
  return result;
}

Inputs collect(const ReportOptions& options, const Progress& progress) {
  Inputs in;
  in.experiment_order = lab_experiment_names();
  if (options.from) {
    const fs::path dir = *options.from;
    // Also pick up experiments this build does not know, in name order.
    std::vector<std::string> extra;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const auto p = entry.path();
      if (p.extension() != ".json" || p.stem() == "bench") continue;
      if (std::find(in.experiment_order.begin(), in.experiment_order.end(), p.stem().string()) ==
          in.experiment_order.end()) {
        extra.push_back(p.stem().string());
      }
    }
    std::sort(extra.begin(), extra.end());
    in.experiment_order.insert(in.experiment_order.end(), extra.begin(), extra.end());
    for (const auto& name : in.experiment_order) {
      const fs::path p = dir / (name + ".json");
      if (fs::exists(p)) {
        in.lab[name] = read_json_file(p);
        check_lab_shape(p, in.lab[name]);
      } else {
        in.missing[name] = fmt::format("{} was not found", p.string());
      }
    }
    const fs::path b = dir / "bench.json";
    if (fs::exists(b)) {
      in.bench = read_json_file(b);
      check_bench_shape(b, in.bench);
    } else {
      in.bench_missing = fmt::format("{} was not found", b.string());
    }
    return in;
  }
  lab::LabOptions lo;
  lo.seed = options.seed;
  lo.mode = options.mode;
  lo.lang = options.lang;
  lo.threads = options.threads;
  lo.progress = options.progress;
  for (const auto& e : lab::experiments()) {
    progress("lab " + e.name);
    try {
      in.lab[e.name] = e.run(lo);
    } catch (const std::exception& ex) {
      in.missing[e.name] = fmt::format("the experiment stopped with: {}", ex.what());
    }
  }
  json bench = json::object();
  try {
    bench["rows"] = run_benchmarks(options, progress);
  } catch (const std::exception& ex) {
    in.bench_missing = fmt::format("the benchmark stopped with: {}", ex.what());
  }
  progress("accuracy against the float64 reference");
  bench["accuracy"] = measure_accuracy(options.seed, options.threads);
  in.bench = std::move(bench);
  return in;
}

}  // namespace sdpa::report
