// The catalogue of extreme values and sizes, for both implementations and both dtypes:
// logits near +-1e30, inf and NaN at masked and at visible positions, subnormals, the smallest
// and degenerate sizes (E, L, S, Ev = 1 or 0, empty batch), a large E, and an output that would
// not fit in memory (a clear error, not the OOM killer).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "../property/oracle.h"
#include "cli_runner.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

namespace fs = std::filesystem;
using sdpa::Array;
using sdpa::DType;
using sdpa::Impl;
using sdpa::oracle::at;
using sdpa::oracle::out_bound;
using sdpa::oracle::put;
using sdpa::oracle::unit_roundoff;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using sdpa::test::Outputs;

Outputs forward(const Array& q, const Array& k, const Array& v, const Array* mask,
                const sdpa::AttentionOptions& o, Impl impl) {
  const sdpa::TensorRef mr = mask != nullptr ? mask->ref() : sdpa::TensorRef{};
  return sdpa::test::run_forward(q, k, v, mask != nullptr ? &mr : nullptr, o, impl);
}

double max_abs_of(const Array& a) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    if (std::isfinite(at(a, i))) m = std::max(m, std::fabs(at(a, i)));
  }
  return m;
}

// Compares out and lse with the float64 oracle; reports the worst element and its index.
void expect_near_oracle(const Outputs& r, const sdpa::oracle::Result& want, double out_tol,
                        double lse_rel_tol, const std::string& what) {
  ASSERT_EQ(static_cast<std::size_t>(r.out.numel()), want.out.size()) << what;
  double worst = 0;
  std::int64_t worst_i = -1;
  for (std::int64_t i = 0; i < r.out.numel(); ++i) {
    const double d = std::fabs(at(r.out, i) - want.out[i]);
    if (!(d <= worst) || std::isnan(d)) {
      worst = std::isnan(d) ? kInf : d;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, out_tol) << what << ": worst out error at flat index " << worst_i << ": got "
                            << (worst_i >= 0 ? at(r.out, worst_i) : 0) << ", want "
                            << (worst_i >= 0 ? want.out[worst_i] : 0);
  for (std::int64_t i = 0; i < r.lse.numel(); ++i) {
    const double got = at(r.lse, i), exp = want.lse[i];
    if (exp == -kInf) {
      EXPECT_EQ(got, -kInf) << what << ": lse of a row with no visible key, index " << i;
      continue;
    }
    EXPECT_LE(std::fabs(got - exp), lse_rel_tol * std::max(1.0, std::fabs(exp)))
        << what << ": lse at index " << i << ": got " << got << ", want " << exp;
  }
}

struct Shape {
  std::vector<std::int64_t> lead;
  std::int64_t Hq, Hkv, L, S, E, Ev;
  std::vector<std::int64_t> q() const { return cat(Hq, L, E); }
  std::vector<std::int64_t> k() const { return cat(Hkv, S, E); }
  std::vector<std::int64_t> v() const { return cat(Hkv, S, Ev); }
  std::vector<std::int64_t> cat(std::int64_t h, std::int64_t n, std::int64_t e) const {
    std::vector<std::int64_t> s = lead;
    s.insert(s.end(), {h, n, e});
    return s;
  }
};

const Impl kImpls[] = {Impl::reference, Impl::fast};
const DType kDtypes[] = {DType::float32, DType::float64};

// ---- logits near +-1e30 ---------------------------------------------------------------------

// With |scores| ~ 1e30 softmax is a hard max: out is the value row of the best key and lse the
// best score. Scores come from the scale (q, k ordinary) or from q and k near 1e15.
TEST(Extremes, LogitsNearPlusMinus1e30AreAHardMax) {
  const Shape s{{2}, 2, 2, 5, 9, 4, 3};
  for (DType dt : kDtypes) {
    for (Impl impl : kImpls) {
      for (int variant = 0; variant < 3; ++variant) {
        Array q = sdpa::test::random_array(dt, s.q(), 11),
              k = sdpa::test::random_array(dt, s.k(), 12);
        const Array v = sdpa::test::random_array(dt, s.v(), 13);
        sdpa::AttentionOptions o;
        if (variant == 0) o.scale = 1e30;
        if (variant == 1) o.scale = -1e30;
        if (variant == 2) {  // q.k ~ 1e30 with the default scale 1/2
          for (std::int64_t i = 0; i < q.numel(); ++i) put(q, i, at(q, i) * 1e15);
          for (std::int64_t i = 0; i < k.numel(); ++i) put(k, i, at(k, i) * 1e15);
        }
        const std::string what = std::string(sdpa::dtype_name(dt)) + " " + sdpa::impl_name(impl) +
                                 " variant " + std::to_string(variant);
        const Outputs r = forward(q, k, v, nullptr, o, impl);
        const auto want = sdpa::oracle::attention(q, k, v, nullptr, o);
        // The top two scores of a row differ by ~1e28 with this seeded data, far beyond
        // float32's score error of ~E u 1e30 = 2e24: the probabilities are exactly one-hot and
        // out is a value row rounded once.
        for (double x : want.out) ASSERT_TRUE(std::isfinite(x));
        expect_near_oracle(r, want, 4 * unit_roundoff(dt, impl) * max_abs_of(v),
                           4 * (s.E + 4) * unit_roundoff(dt, impl), what);
      }
    }
  }
}

// An additive -1e30 is finite, yet exp(-1e30 - max) is exactly 0: such keys drop out as if
// masked by false, as long as the row has some key without it.
TEST(Extremes, MinusHugeAdditiveMaskDropsKeys) {
  const Shape s{{}, 3, 3, 6, 8, 5, 4};
  for (DType dt : kDtypes) {
    for (Impl impl : kImpls) {
      const Array q = sdpa::test::random_array(dt, s.q(), 21),
                  k = sdpa::test::random_array(dt, s.k(), 22),
                  v = sdpa::test::random_array(dt, s.v(), 23);
      Array additive(dt, {s.Hq, s.L, s.S}), boolean(DType::boolean, {s.Hq, s.L, s.S});
      for (std::int64_t i = 0; i < additive.numel(); ++i) {
        const bool keep = (i % 8 == 0) || (i * 7 % 5 != 0);
        put(additive, i, keep ? 0.0 : -1e30);
        put(boolean, i, keep ? 1.0 : 0.0);
      }
      const Outputs a = forward(q, k, v, &additive, {}, impl),
                    b = forward(q, k, v, &boolean, {}, impl);
      const double tol =
          out_bound(dt, impl, s.S, s.E, sdpa::oracle::attention(q, k, v, &boolean, {}).score_terms,
                    max_abs_of(v), 0);
      std::int64_t worst = 0;
      EXPECT_LE(sdpa::test::max_abs_diff(a.out, b.out, &worst), tol)
          << sdpa::impl_name(impl) << " worst at " << worst;
    }
  }
}

// ---- inf and NaN ------------------------------------------------------------------------------

// NaN and inf stored where no query looks (keys masked for every row, keys beyond the causal
// diagonal, query rows that see no key) must not change anything: out equals the clean run's,
// fully masked rows give out = 0 and lse = -inf.
TEST(Extremes, NonFiniteAtMaskedPositionsNeverLeaks) {
  const Shape s{{2}, 2, 2, 5, 8, 4, 3};
  for (DType dt : kDtypes) {
    for (Impl impl : kImpls) {
      const Array q = sdpa::test::random_array(dt, s.q(), 31),
                  k = sdpa::test::random_array(dt, s.k(), 32),
                  v = sdpa::test::random_array(dt, s.v(), 33);
      // mask (L, S): key 1 hidden from every row, query row 3 sees nothing; upper-left causal
      // hides keys 5..7 from every row (L = 5).
      Array mask(DType::boolean, {s.L, s.S});
      for (std::int64_t l = 0; l < s.L; ++l) {
        for (std::int64_t j = 0; j < s.S; ++j) put(mask, l * s.S + j, (j != 1 && l != 3) ? 1 : 0);
      }
      sdpa::AttentionOptions o;
      o.causal = sdpa::Causal::upper_left;
      Array qd = q.astype(dt), kd = k.astype(dt), vd = v.astype(dt);
      const double poison[] = {kNaN, kInf, -kInf};
      for (std::int64_t bh = 0; bh < 2 * s.Hq; ++bh) {
        for (std::int64_t e = 0; e < s.E; ++e) put(qd, (bh * s.L + 3) * s.E + e, poison[e % 3]);
        for (std::int64_t key : {1, 5, 6, 7}) {
          for (std::int64_t e = 0; e < s.E; ++e) put(kd, (bh * s.S + key) * s.E + e, poison[e % 3]);
          for (std::int64_t e = 0; e < s.Ev; ++e) {
            put(vd, (bh * s.S + key) * s.Ev + e, poison[(e + 1) % 3]);
          }
        }
      }
      const Outputs clean = forward(q, k, v, &mask, o, impl),
                    dirty = forward(qd, kd, vd, &mask, o, impl);
      EXPECT_TRUE(sdpa::test::all_finite(dirty.out)) << sdpa::impl_name(impl);
      std::int64_t worst = 0;
      EXPECT_EQ(sdpa::test::max_abs_diff(clean.out, dirty.out, &worst), 0.0)
          << sdpa::impl_name(impl) << " " << sdpa::dtype_name(dt) << ": worst at " << worst;
      EXPECT_EQ(sdpa::test::max_abs_diff(clean.lse, dirty.lse, &worst), 0.0)
          << sdpa::impl_name(impl) << " lse, worst at " << worst;
      for (std::int64_t bh = 0; bh < 2 * s.Hq; ++bh) {
        EXPECT_EQ(at(dirty.lse, bh * s.L + 3), -kInf);
        for (std::int64_t e = 0; e < s.Ev; ++e) {
          EXPECT_EQ(at(dirty.out, (bh * s.L + 3) * s.Ev + e), 0.0) << "fully masked row";
        }
      }
    }
  }
}

// A NaN where a query does look is not hidden: every output of the rows that see it is NaN
// (NaN in, NaN out); an infinite value spoils its column of those rows. Every other row is
// exactly as in the clean run. (An infinite q or k makes a score +-inf: -inf acts as a mask,
// +inf as inf - inf = NaN, depending on signs, so those are not asserted here.)
struct Poison {
  const char* what;
  char tensor;  // 'q', 'k' or 'v'
  double value;
};

void check_visible_poison(Impl impl, const std::vector<Poison>& poisons, bool check_spoiled) {
  const Shape s{{2}, 2, 2, 4, 6, 3, 2};
  for (DType dt : kDtypes) {
    for (const Poison& p : poisons) {
      const Array q = sdpa::test::random_array(dt, s.q(), 41),
                  k = sdpa::test::random_array(dt, s.k(), 42),
                  v = sdpa::test::random_array(dt, s.v(), 43);
      Array qd = q.astype(dt), kd = k.astype(dt), vd = v.astype(dt);
      // Batch 1, head 0: key 2 (seen by rows l >= 2 under upper-left causal) or query row 1.
      const std::int64_t bh = 1 * s.Hq + 0;
      if (p.tensor == 'k') put(kd, (bh * s.S + 2) * s.E + 1, p.value);
      if (p.tensor == 'v') put(vd, (bh * s.S + 2) * s.Ev + 1, p.value);
      if (p.tensor == 'q') put(qd, (bh * s.L + 1) * s.E + 0, p.value);
      sdpa::AttentionOptions o;
      o.causal = sdpa::Causal::upper_left;
      const Outputs clean = forward(q, k, v, nullptr, o, impl),
                    dirty = forward(qd, kd, vd, nullptr, o, impl);
      const std::string what =
          std::string(p.what) + " " + sdpa::dtype_name(dt) + " " + sdpa::impl_name(impl);
      for (std::int64_t row = 0; row < 2 * s.Hq * s.L; ++row) {
        const std::int64_t l = row % s.L;
        const bool sees = row / s.L == bh && (p.tensor == 'q' ? l == 1 : l >= 2);
        for (std::int64_t e = 0; e < s.Ev; ++e) {
          const double got = at(dirty.out, row * s.Ev + e);
          if (!sees) {
            EXPECT_EQ(got, at(clean.out, row * s.Ev + e)) << what << ": row " << row;
          } else if (!check_spoiled) {
            continue;
          } else if (p.tensor != 'v') {
            EXPECT_TRUE(std::isnan(got)) << what << ": row " << row << " col " << e;
          } else if (e == 1) {
            EXPECT_FALSE(std::isfinite(got)) << what << ": row " << row << " col " << e;
          }
        }
        if (sees && check_spoiled && p.tensor != 'v') {
          EXPECT_TRUE(std::isnan(at(dirty.lse, row))) << what << ": lse of row " << row;
        }
      }
    }
  }
}

const std::vector<Poison> kScorePoisons = {{"NaN in key", 'k', kNaN}, {"NaN in query", 'q', kNaN}};
const std::vector<Poison> kValuePoisons = {
    {"NaN in value", 'v', kNaN}, {"+inf in value", 'v', kInf}, {"-inf in value", 'v', -kInf}};

TEST(Extremes, NonFiniteAtVisiblePositionsStaysInItsRows) {
  for (Impl impl : kImpls) {
    check_visible_poison(impl, kValuePoisons, true);
    // The fast kernel's confinement is checked here; its NaN scores below.
    check_visible_poison(impl, kScorePoisons, impl == Impl::reference);
  }
}

// Found by this catalogue: the fused kernel used to drop a NaN score (x86's max and Highway's
// exp ignore NaN), giving a finite, wrong row. Its row max now tracks NaN.
TEST(Extremes, FastKernelPropagatesNanScores) {
  check_visible_poison(Impl::fast, kScorePoisons, true);
}

// ---- subnormals -----------------------------------------------------------------------------

// Subnormal values, queries and scale: results are within rounding of the float64 oracle, or
// flushed to zero (allowed: floor of (S + 8) times the smallest normal number), never NaN.
TEST(Extremes, Subnormals) {
  const Shape s{{}, 2, 2, 3, 5, 4, 3};
  for (DType dt : kDtypes) {
    const double tiny = dt == DType::float32 ? std::numeric_limits<float>::denorm_min() * 8
                                             : std::numeric_limits<double>::denorm_min() * 8;
    const double smallest_normal = dt == DType::float32 ? std::numeric_limits<float>::min()
                                                        : std::numeric_limits<double>::min();
    for (Impl impl : kImpls) {
      for (int variant = 0; variant < 3; ++variant) {
        Array q = sdpa::test::random_array(dt, s.q(), 51),
              k = sdpa::test::random_array(dt, s.k(), 52),
              v = sdpa::test::random_array(dt, s.v(), 53);
        sdpa::AttentionOptions o;
        Array* target = variant == 0 ? &v : variant == 1 ? &q : nullptr;
        if (target != nullptr) {
          for (std::int64_t i = 0; i < target->numel(); ++i) put(*target, i, tiny * (i % 7 - 3));
        } else {
          o.scale = tiny;
        }
        const Outputs r = forward(q, k, v, nullptr, o, impl);
        const auto want = sdpa::oracle::attention(q, k, v, nullptr, o);
        EXPECT_TRUE(sdpa::test::all_finite(r.out));
        expect_near_oracle(r, want,
                           out_bound(dt, impl, s.S, s.E, want.score_terms, max_abs_of(v),
                                     (s.S + 8) * smallest_normal),
                           4 * (s.S + s.E + 20) * unit_roundoff(dt, impl),
                           std::string(sdpa::dtype_name(dt)) + " " + sdpa::impl_name(impl) +
                               " subnormal variant " + std::to_string(variant));
      }
    }
  }
}

// ---- sizes ------------------------------------------------------------------------------------

TEST(Extremes, SmallestLargestAndEmptySizes) {
  const Shape shapes[] = {
      {{}, 1, 1, 1, 1, 1, 1},    {{1}, 1, 1, 1, 1, 1, 1},   {{}, 1, 1, 1, 7, 1, 1},
      {{}, 1, 1, 7, 1, 1, 1},    {{}, 1, 1, 3, 5, 1, 9},    {{}, 2, 1, 3, 4, 9, 1},
      {{}, 1, 1, 2, 3, 4096, 3}, {{}, 1, 1, 2, 2, 3, 4096}, {{2}, 2, 2, 0, 3, 2, 2},
      {{2}, 2, 2, 3, 0, 2, 2},   {{2}, 2, 2, 3, 4, 0, 2},   {{2}, 2, 2, 3, 4, 2, 0},
      {{0}, 2, 2, 3, 4, 2, 2},   {{2}, 0, 0, 3, 4, 2, 2},   {{3, 1}, 4, 2, 2, 3, 2, 2},
  };
  const sdpa::Causal causals[] = {sdpa::Causal::none, sdpa::Causal::upper_left,
                                  sdpa::Causal::lower_right};
  for (const Shape& s : shapes) {
    for (DType dt : kDtypes) {
      for (Impl impl : kImpls) {
        for (sdpa::Causal c : causals) {
          const Array q = sdpa::test::random_array(dt, s.q(), 61),
                      k = sdpa::test::random_array(dt, s.k(), 62),
                      v = sdpa::test::random_array(dt, s.v(), 63);
          sdpa::AttentionOptions o;
          o.causal = c;
          o.enable_gqa = s.Hq != s.Hkv;
          const Outputs r = forward(q, k, v, nullptr, o, impl);
          const auto want = sdpa::oracle::attention(q, k, v, nullptr, o);
          std::string what = std::string(sdpa::dtype_name(dt)) + " " + sdpa::impl_name(impl) + " " +
                             sdpa::causal_name(c) + " shape q" + sdpa::shape_string(s.q()) + " k" +
                             sdpa::shape_string(s.k()) + " v" + sdpa::shape_string(s.v());
          expect_near_oracle(r, want,
                             out_bound(dt, impl, s.S, s.E, want.score_terms, max_abs_of(v), 0),
                             4 * (s.S + s.E + 20) * unit_roundoff(dt, impl), what);
        }
      }
    }
  }
}

// ---- memory -----------------------------------------------------------------------------------

std::int64_t physical_memory_bytes() {
  return static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}

// An output four times the machine's memory: a clear error, before any allocation is tried
// (under AddressSanitizer an attempt alone aborts the program; without, the zero fill would
// summon the OOM killer whenever the kernel's overcommit lets the allocation through).
TEST(Extremes, OutputLargerThanMemoryIsRefused) {
  const auto side = static_cast<std::int64_t>(std::sqrt(double(physical_memory_bytes()))) + 1;
  // API: the caller allocates the output with Array.
  const Array q = sdpa::test::random_array(DType::float32, {1, side, 1}, 1);
  const Array k = sdpa::test::random_array(DType::float32, {1, 1, 1}, 2);
  const Array v = sdpa::test::random_array(DType::float32, {1, 1, side}, 3);
  const auto shape = sdpa::attention_output_shape(q, k, v, {});
  ASSERT_EQ(shape, (std::vector<std::int64_t>{1, side, side}));
  std::string message;
  try {
    Array out(DType::float32, shape);
  } catch (const sdpa::Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("memory"), std::string::npos) << "got: '" << message << "'";

  // CLI: the same through files of a few hundred kilobytes.
  const fs::path dir =
      fs::temp_directory_path() / ("sdpa_extremes_mem_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  sdpa::write_npy((dir / "q.npy").string(), q);
  sdpa::write_npy((dir / "k.npy").string(), k);
  sdpa::write_npy((dir / "v.npy").string(), v);
  const auto r = sdpa::test::run_cli(
      {"attention", "--query", (dir / "q.npy").string(), "--key", (dir / "k.npy").string(),
       "--value", (dir / "v.npy").string(), "--out", (dir / "o.npy").string()},
      dir.string());
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("memory"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "o.npy"));
  fs::remove_all(dir);
}

// ---- the same extremes through the CLI -----------------------------------------------------

// The CLI gives the API's result bit for bit on masked NaN and on the smallest sizes.
TEST(Extremes, CliAgreesWithTheApi) {
  const fs::path dir =
      fs::temp_directory_path() / ("sdpa_extremes_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto p = [&](const char* n) { return (dir / n).string(); };
  for (Impl impl : kImpls) {
    for (int variant = 0; variant < 2; ++variant) {
      const Shape s = variant == 0 ? Shape{{}, 1, 1, 1, 1, 1, 1} : Shape{{}, 2, 2, 3, 4, 2, 2};
      Array q = sdpa::test::random_array(DType::float32, s.q(), 71),
            k = sdpa::test::random_array(DType::float32, s.k(), 72),
            v = sdpa::test::random_array(DType::float32, s.v(), 73);
      Array mask(DType::boolean, {s.L, s.S});
      for (std::int64_t i = 0; i < mask.numel(); ++i) put(mask, i, 1);
      if (variant == 1) {  // key 0 hidden from all rows, holding NaN
        for (std::int64_t l = 0; l < s.L; ++l) put(mask, l * s.S, 0);
        for (std::int64_t h = 0; h < s.Hkv; ++h) put(k, h * s.S * s.E, kNaN);
      }
      sdpa::write_npy(p("q.npy"), q);
      sdpa::write_npy(p("k.npy"), k);
      sdpa::write_npy(p("v.npy"), v);
      sdpa::write_npy(p("m.npy"), mask);
      const auto r = sdpa::test::run_cli(
          {"attention", "--query", p("q.npy"), "--key", p("k.npy"), "--value", p("v.npy"), "--mask",
           p("m.npy"), "--out", p("o.npy"), "--lse", p("l.npy"), "--impl", sdpa::impl_name(impl)},
          dir.string());
      ASSERT_EQ(r.status, 0) << r.err;
      const Outputs api = forward(q, k, v, &mask, {}, impl);
      const Array out = sdpa::read_npy(p("o.npy")), lse = sdpa::read_npy(p("l.npy"));
      ASSERT_EQ(out.shape(), api.out.shape());
      EXPECT_EQ(std::memcmp(out.data(), api.out.data(), out.nbytes()), 0);
      EXPECT_EQ(std::memcmp(lse.data(), api.lse.data(), lse.nbytes()), 0);
      EXPECT_TRUE(sdpa::test::all_finite(out));
    }
  }
  fs::remove_all(dir);
}

}  // namespace
