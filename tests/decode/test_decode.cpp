// The decode kernel (src/kernels/decode.cpp) and the KV-cache API (include/sdpa/kvcache.h)
// against the float64 reference.
//
// Accuracy rule (the fused kernel's, flash-attention's tests): the error of the result against
// the reference computed in float64 is at most 2 x the error of the naive three-pass
// implementation in the same precision, plus a floor of 8 epsilons of the largest magnitude.
// The KV-cache reference gathers every sequence's rows out of the (paged) cache into plain
// (1, Hkv, S_b, E) tensors, so it shares no indexing code with the kernel.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "core/half.h"
#include "hwy/targets.h"
#include "kernels/decode.h"
#include "kernels/gemm_bf16.h"
#include "sdpa/array.h"
#include "sdpa/kvcache.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::Array;
using sdpa::DType;
using sdpa::test::get;
using sdpa::test::random_array;
using std::int64_t;

// The floor's epsilon: float32's for float32 and the 16-bit dtypes (their arithmetic is float32).
double eps_of(DType d) {
  return d == DType::float64 ? std::numeric_limits<double>::epsilon()
                             : std::numeric_limits<float>::epsilon();
}

// Element (b, i, h, e) of a (batch, n, H, F) tensor.
int64_t at4(const Array& a, int64_t b, int64_t i, int64_t h, int64_t e) {
  const auto& s = a.shape();
  return ((b * s[1] + i) * s[2] + h) * s[3] + e;
}

// ---- one KV-cache call and its reference ---------------------------------------------------

struct CacheCase {
  DType dtype = DType::float32;
  int64_t batch = 2, L = 1, Hq = 4, Hkv = 2, E = 16, Ev = 16;
  int64_t page = 0;       // 0: contiguous cache (batch, S_max, ...); else paged with this page size
  int64_t capacity = 64;  // S_max, or max_blocks * page
  std::vector<int32_t> seqlens;  // cached rows per sequence before the call
  int64_t L_new = 0;             // rows appended
  bool causal = false;
  int threads = 2;
  std::uint64_t seed = 1;

  std::string name() const {
    std::string lens;
    for (auto n : seqlens) lens += fmt::format(" {}", n);
    return fmt::format("{} B{} L{} Hq{} Hkv{} E{} Ev{} page{} cap{} new{}{} lens{}",
                       sdpa::dtype_name(dtype), batch, L, Hq, Hkv, E, Ev, page, capacity, L_new,
                       causal ? " causal" : "", lens);
  }
};

struct CacheCall {
  Array q, k_cache, v_cache, k, v;
  sdpa::Int32TensorRef seqlens_ref, table_ref;
  std::vector<int32_t> seqlens, table;
  int64_t max_blocks = 0, num_blocks = 0;
  sdpa::TensorRef k_ref, v_ref;
  sdpa::KVCacheInputs inputs;

  // Physical cache row of row s of sequence b (row = every head of one position).
  int64_t slot(const CacheCase& c, int64_t b, int64_t s) const {
    if (c.page == 0) return b * c.capacity + s;
    return int64_t{table[static_cast<size_t>(b * max_blocks + s / c.page)]} * c.page + s % c.page;
  }
};

// Random caches; paged caches get a shuffled block table (pages of a sequence scattered, unused
// entries -1) with two spare blocks that no sequence uses.
CacheCall make_call(const CacheCase& c) {
  CacheCall x;
  x.seqlens = c.seqlens;
  x.q = random_array(c.dtype, {c.batch, c.L, c.Hq, c.E}, c.seed * 11 + 1);
  if (c.page == 0) {
    x.k_cache = random_array(c.dtype, {c.batch, c.capacity, c.Hkv, c.E}, c.seed * 11 + 2);
    x.v_cache = random_array(c.dtype, {c.batch, c.capacity, c.Hkv, c.Ev}, c.seed * 11 + 3);
  } else {
    x.max_blocks = c.capacity / c.page;
    x.num_blocks = c.batch * x.max_blocks + 2;
    x.k_cache = random_array(c.dtype, {x.num_blocks, c.page, c.Hkv, c.E}, c.seed * 11 + 2);
    x.v_cache = random_array(c.dtype, {x.num_blocks, c.page, c.Hkv, c.Ev}, c.seed * 11 + 3);
    std::vector<int32_t> ids(static_cast<size_t>(x.num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937_64 rng(c.seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    x.table.assign(static_cast<size_t>(c.batch * x.max_blocks), -1);
    size_t next = 0;
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t used = (c.seqlens[static_cast<size_t>(b)] + c.L_new + c.page - 1) / c.page;
      for (int64_t i = 0; i < used; ++i)
        x.table[static_cast<size_t>(b * x.max_blocks + i)] = ids[next++];
    }
    x.table_ref = {x.table.data(), {c.batch, x.max_blocks}};
    x.inputs.block_table = &x.table_ref;
  }
  x.seqlens_ref = {x.seqlens.data(), {c.batch}};
  x.inputs.cache_seqlens = &x.seqlens_ref;
  if (c.L_new > 0) {
    x.k = random_array(c.dtype, {c.batch, c.L_new, c.Hkv, c.E}, c.seed * 11 + 4);
    x.v = random_array(c.dtype, {c.batch, c.L_new, c.Hkv, c.Ev}, c.seed * 11 + 5);
    x.k_ref = x.k.ref();
    x.v_ref = x.v.ref();
    x.inputs.k = &x.k_ref;
    x.inputs.v = &x.v_ref;
  }
  return x;
}

struct Result {
  Array out, lse;
};

// lse is float32 for 16-bit queries, else the query's dtype.
DType lse_dtype(DType d) { return d == DType::float64 ? d : DType::float32; }

Result run_kvcache(const CacheCase& c, CacheCall& x) {
  Result r{Array(c.dtype, {c.batch, c.L, c.Hq, c.Ev}),
           Array(lse_dtype(c.dtype), {c.batch, c.Hq, c.L})};
  sdpa::KVCacheOptions o;
  o.causal = c.causal;
  o.threads = c.threads;
  const sdpa::MutableTensorRef lse = r.lse.mut();
  sdpa::attention_with_kvcache(x.q, x.k_cache.mut(), x.v_cache.mut(), x.inputs, o, r.out.mut(),
                               &lse);
  return r;
}

// The cache `x` (after the call) gathered into plain tensors for sequence b, in `dtype`.
void gather(const CacheCase& c, const CacheCall& x, int64_t b, DType dtype, Array* q, Array* k,
            Array* v) {
  const int64_t S = x.seqlens[static_cast<size_t>(b)] + c.L_new;
  *q = Array(dtype, {1, c.Hq, c.L, c.E});
  *k = Array(dtype, {1, c.Hkv, S, c.E});
  *v = Array(dtype, {1, c.Hkv, S, c.Ev});
  for (int64_t h = 0; h < c.Hq; ++h)
    for (int64_t i = 0; i < c.L; ++i)
      for (int64_t e = 0; e < c.E; ++e)
        sdpa::test::set(*q, (h * c.L + i) * c.E + e, get(x.q, at4(x.q, b, i, h, e)));
  for (int64_t s = 0; s < S; ++s) {
    const int64_t row = x.slot(c, b, s);
    for (int64_t h = 0; h < c.Hkv; ++h) {
      for (int64_t e = 0; e < c.E; ++e)
        sdpa::test::set(*k, (h * S + s) * c.E + e, get(x.k_cache, (row * c.Hkv + h) * c.E + e));
      for (int64_t e = 0; e < c.Ev; ++e)
        sdpa::test::set(*v, (h * S + s) * c.Ev + e, get(x.v_cache, (row * c.Hkv + h) * c.Ev + e));
    }
  }
}

// Checks out/lse of a call (made on `x`, after it) against the float64 reference.
void check_against_reference(const CacheCase& c, const CacheCall& x, const Result& r) {
  const double eps = eps_of(c.dtype);
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t S = x.seqlens[static_cast<size_t>(b)] + c.L_new;
    if (S == 0) {  // nothing to attend to: zeros and lse = -inf
      for (int64_t i = 0; i < c.L; ++i)
        for (int64_t h = 0; h < c.Hq; ++h) {
          for (int64_t e = 0; e < c.Ev; ++e) ASSERT_EQ(get(r.out, at4(r.out, b, i, h, e)), 0.0);
          ASSERT_EQ(get(r.lse, (b * c.Hq + h) * c.L + i), -INFINITY) << c.name();
        }
      continue;
    }
    Array q64, k64, v64, q, k, v;
    gather(c, x, b, DType::float64, &q64, &k64, &v64);
    gather(c, x, b, c.dtype, &q, &k, &v);
    sdpa::AttentionOptions o;
    o.causal = c.causal ? sdpa::Causal::lower_right : sdpa::Causal::none;
    o.enable_gqa = c.Hq != c.Hkv;
    o.impl = sdpa::Impl::reference;
    Array ref(DType::float64, {1, c.Hq, c.L, c.Ev}), ref_lse(DType::float64, {1, c.Hq, c.L});
    const sdpa::MutableTensorRef ref_lse_m = ref_lse.mut();
    sdpa::attention_forward(q64, k64, v64, nullptr, o, ref.mut(), &ref_lse_m);
    o.impl = sdpa::Impl::naive;
    Array naive(c.dtype, {1, c.Hq, c.L, c.Ev}), naive_lse(lse_dtype(c.dtype), {1, c.Hq, c.L});
    const sdpa::MutableTensorRef naive_lse_m = naive_lse.mut();
    sdpa::attention_forward(q, k, v, nullptr, o, naive.mut(), &naive_lse_m);
    double err = 0, err_naive = 0, big = 0, lerr = 0, lerr_naive = 0, lbig = 0;
    int64_t worst = -1;
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.L; ++i) {
        for (int64_t e = 0; e < c.Ev; ++e) {
          const int64_t ri = (h * c.L + i) * c.Ev + e;
          const double want = get(ref, ri), got = get(r.out, at4(r.out, b, i, h, e));
          const double d = std::isnan(got) ? INFINITY : std::fabs(got - want);
          if (d > err) {
            err = d;
            worst = ri;
          }
          err_naive = std::max(err_naive, std::fabs(get(naive, ri) - want));
          big = std::max(big, std::fabs(want));
        }
        const int64_t li = h * c.L + i;
        const double want = get(ref_lse, li), got = get(r.lse, (b * c.Hq + h) * c.L + i);
        if (std::isinf(want)) {
          ASSERT_EQ(got, want) << c.name();
          continue;
        }
        lerr = std::max(lerr, std::isnan(got) ? INFINITY : std::fabs(got - want));
        lerr_naive = std::max(lerr_naive, std::fabs(get(naive_lse, li) - want));
        lbig = std::max(lbig, std::fabs(want));
      }
    EXPECT_LE(err, 2 * err_naive + 8 * eps * std::max(big, 1.0))
        << c.name() << " sequence " << b << " worst element " << worst << " naive " << err_naive;
    EXPECT_LE(lerr, 2 * lerr_naive + 8 * eps * std::max(lbig, 1.0))
        << c.name() << " lse, sequence " << b;
  }
}

// The case, its call, and the append check: the cache after the call is the cache before with
// exactly the new rows written at their slots.
void check_case(const CacheCase& c) {
  SCOPED_TRACE(c.name());
  CacheCall x = make_call(c);
  Array k_expected = x.k_cache.astype(c.dtype), v_expected = x.v_cache.astype(c.dtype);
  const size_t es = sdpa::dtype_size(c.dtype);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.L_new; ++i) {
      const int64_t row = x.slot(c, b, x.seqlens[static_cast<size_t>(b)] + i);
      std::memcpy(static_cast<char*>(k_expected.data()) + row * c.Hkv * c.E * es,
                  static_cast<const char*>(x.k.data()) + (b * c.L_new + i) * c.Hkv * c.E * es,
                  c.Hkv * c.E * es);
      std::memcpy(static_cast<char*>(v_expected.data()) + row * c.Hkv * c.Ev * es,
                  static_cast<const char*>(x.v.data()) + (b * c.L_new + i) * c.Hkv * c.Ev * es,
                  c.Hkv * c.Ev * es);
    }
  const Result r = run_kvcache(c, x);
  ASSERT_EQ(std::memcmp(x.k_cache.data(), k_expected.data(), k_expected.nbytes()), 0)
      << "k_cache after the append";
  ASSERT_EQ(std::memcmp(x.v_cache.data(), v_expected.data(), v_expected.nbytes()), 0)
      << "v_cache after the append";
  check_against_reference(c, x, r);
}

// A seeded sweep: L = 1..16, GQA groups 1, 3, 4, 8, odd E/Ev, contiguous and paged (16, 256)
// caches, lengths on and off page boundaries, empty sequences, appends, causal or not.
std::vector<CacheCase> sweep(DType dtype, int count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](std::initializer_list<int64_t> v) {
    return *(v.begin() + static_cast<long>(rng() % v.size()));
  };
  std::vector<CacheCase> cases;
  for (int n = 0; n < count; ++n) {
    CacheCase c;
    c.dtype = dtype;
    c.seed = seed * 1000 + static_cast<std::uint64_t>(n);
    c.L = 1 + n % 16;
    const int64_t groups[][2] = {{1, 1}, {4, 1}, {6, 2}, {8, 1}, {3, 3}, {8, 2}};
    const auto& g = groups[rng() % 6];
    c.Hq = g[0];
    c.Hkv = g[1];
    c.E = pick({1, 3, 16, 17, 33, 64, 128});
    c.Ev = n % 3 == 0 ? pick({1, 5, 31, 64}) : c.E;
    c.page = pick({0, 16, 256});
    c.batch = 1 + static_cast<int64_t>(rng() % 3);
    c.L_new = n % 2 == 0 ? c.L : static_cast<int64_t>(rng() % 3);
    c.causal = rng() % 2 == 0;
    c.threads = 1 + static_cast<int>(rng() % 3);
    const int64_t blocks = c.page == 0 ? 1 : 1 + static_cast<int64_t>(rng() % 4);
    c.capacity = c.page == 0 ? pick({1, 37, 300, 700}) + c.L_new : blocks * c.page;
    const int64_t room = c.capacity - c.L_new;
    for (int64_t b = 0; b < c.batch; ++b) {
      int64_t len = static_cast<int64_t>(rng() % static_cast<std::uint64_t>(room + 1));
      if (rng() % 4 == 0) len = 0;                                       // empty
      if (c.page != 0 && rng() % 3 == 0) len = (len / c.page) * c.page;  // on a page boundary
      len = std::min(len, room);
      c.seqlens.push_back(static_cast<int32_t>(len));
    }
    cases.push_back(c);
  }
  return cases;
}

TEST(KVCache, SweepFloat32) {
  for (const CacheCase& c : sweep(DType::float32, 48, 1)) check_case(c);
}

TEST(KVCache, SweepFloat64) {
  for (const CacheCase& c : sweep(DType::float64, 16, 2)) check_case(c);
}

TEST(KVCache, PageBoundaries) {
  // Lengths ending exactly on, one before and one after a page boundary, for pages of 16 and 256.
  for (int64_t page : {16, 256}) {
    for (int64_t end : {page - 1, page, page + 1, 2 * page}) {
      for (int64_t L_new : {0, 1, 3}) {
        CacheCase c;
        c.page = page;
        c.capacity = 3 * page;
        c.L = L_new == 0 ? 2 : L_new;
        c.L_new = L_new;
        c.causal = L_new > 0;
        c.seqlens = {static_cast<int32_t>(end - L_new), static_cast<int32_t>(end - L_new - 1)};
        c.seed = static_cast<std::uint64_t>(page + end + L_new);
        check_case(c);
      }
    }
  }
}

TEST(KVCache, EmptySequencesGiveZerosAndMinusInfinity) {
  CacheCase c;
  c.batch = 3;
  c.L = 2;
  c.seqlens = {0, 5, 0};
  check_case(c);  // asserts zeros and lse = -inf for sequences 0 and 2
  c.page = 16;
  c.seqlens = {0, 16, 0};
  check_case(c);
}

TEST(KVCache, DecodeShapeLongSequence) {
  // Many chunks (S = 5000: 10 chunks of 512) with GQA, paged and not.
  for (int64_t page : {0, 256}) {
    CacheCase c;
    c.batch = 2;
    c.Hq = 8;
    c.Hkv = 2;
    c.E = c.Ev = 32;
    c.page = page;
    c.capacity = 5120;
    c.seqlens = {4999, 2500};
    c.L_new = 1;
    c.L = 1;
    c.causal = true;
    check_case(c);
  }
}

// ---- thread-count identity --------------------------------------------------------------------

TEST(KVCache, BitIdenticalForAnyThreadCount) {
  CacheCase c;
  c.batch = 3;
  c.Hq = 8;
  c.Hkv = 2;
  c.L = 3;
  c.E = c.Ev = 24;
  c.page = 16;
  c.capacity = 4096;
  c.seqlens = {4000, 1, 2047};
  c.causal = true;
  Result first;
  for (int threads : {1, 2, 3, 5, 8}) {
    c.threads = threads;
    CacheCall x = make_call(c);
    const Result r = run_kvcache(c, x);
    if (threads == 1) {
      first = Result{r.out.astype(c.dtype), r.lse.astype(c.dtype)};
      continue;
    }
    EXPECT_EQ(std::memcmp(r.out.data(), first.out.data(), first.out.nbytes()), 0)
        << threads << " threads";
    EXPECT_EQ(std::memcmp(r.lse.data(), first.lse.data(), first.lse.nbytes()), 0)
        << threads << " threads";
  }
}

// ---- refused calls leave everything untouched -------------------------------------------------

struct Refusal {
  const char* what;  // the argument the message must name
  std::function<void(CacheCase&, CacheCall&, sdpa::KVCacheOptions&, Array& out)> breaks;
};

TEST(KVCache, RefusedCallsLeaveTheCacheByteIdentical) {
  std::vector<int32_t> bad_table, short_lens;
  Array other;
  sdpa::TensorRef other_ref;
  sdpa::Int32TensorRef table2, lens2;
  std::vector<int32_t> lens_storage;
  const std::vector<Refusal> refusals = {
      {"block_table", [&](CacheCase&, CacheCall& x, sdpa::KVCacheOptions&,
                          Array&) { x.table[0] = static_cast<int32_t>(x.num_blocks); }},
      {"block_table",
       [&](CacheCase&, CacheCall& x, sdpa::KVCacheOptions&, Array&) { x.table[1] = -1; }},
      {"cache_seqlens", [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&,
                            Array&) { x.seqlens[1] = static_cast<int32_t>(c.capacity + 1); }},
      {"cache_seqlens",
       [&](CacheCase&, CacheCall& x, sdpa::KVCacheOptions&, Array&) { x.seqlens[0] = -3; }},
      {"k",  // the append would pass the capacity
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         x.seqlens[1] = static_cast<int32_t>(c.capacity - 1);
       }},
      {"k",
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         other = random_array(DType::float64, {c.batch, c.L_new, c.Hkv, c.E}, 9);
         other_ref = other.ref();
         x.inputs.k = &other_ref;
       }},
      {"v",
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         other = random_array(c.dtype, {c.batch, c.L_new, c.Hkv + 1, c.Ev}, 9);
         other_ref = other.ref();
         x.inputs.v = &other_ref;
       }},
      {"v", [&](CacheCase&, CacheCall& x, sdpa::KVCacheOptions&, Array&) { x.inputs.v = nullptr; }},
      {"k",  // a (batch, Hkv, L_new, E) array viewed as (batch, L_new, Hkv, E): not C order
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         other = random_array(c.dtype, {c.batch, c.Hkv, c.L_new, c.E}, 9);
         other_ref = other.ref();
         other_ref.shape = {c.batch, c.L_new, c.Hkv, c.E};
         other_ref.strides = {c.Hkv * c.L_new * c.E, c.E, c.L_new * c.E, 1};
         x.inputs.k = &other_ref;
       }},
      {"v",  // strides of the wrong count
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         other = random_array(c.dtype, {c.batch, c.L_new, c.Hkv, c.Ev}, 9);
         other_ref = other.ref();
         other_ref.strides = {c.Ev, 1};
         x.inputs.v = &other_ref;
       }},
      {"v_cache",  // pages of another size: the two caches do not tile alike
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         x.v_cache = random_array(c.dtype, {x.num_blocks, c.page / 2, c.Hkv, c.Ev}, 9);
       }},
      {"v_cache",
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         x.v_cache = random_array(c.dtype, {x.num_blocks, c.page, c.Hkv - 1, c.Ev}, 9);
       }},
      {"k_cache",  // Hq = 4 is not a multiple of Hkv = 3
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         x.k_cache = random_array(c.dtype, {x.num_blocks, c.page, 3, c.E}, 9);
         x.v_cache = random_array(c.dtype, {x.num_blocks, c.page, 3, c.Ev}, 9);
       }},
      {"k_cache",
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         x.k_cache = random_array(DType::float64, {x.num_blocks, c.page, c.Hkv, c.E}, 9);
       }},
      {"k_cache",
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         x.k_cache = random_array(c.dtype, {x.num_blocks, c.page, c.Hkv, c.E + 1}, 9);
       }},
      {"block_table",
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         table2 = {x.table.data(), {c.batch + 1, x.max_blocks / 2}};
         x.inputs.block_table = &table2;
       }},
      {"block_table",  // max_blocks * page_size past 64 bits
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         table2 = {x.table.data(), {c.batch, int64_t{1} << 59}};
         x.inputs.block_table = &table2;
       }},
      {"block_table",  // both sequences would append into the same cache row
       [&](CacheCase&, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         x.seqlens[0] = 5;
         x.seqlens[1] = 5;
         x.table[static_cast<size_t>(x.max_blocks)] = x.table[0];
       }},
      {"out",
       [&](CacheCase& c, CacheCall&, sdpa::KVCacheOptions&, Array& out) {
         out = Array(c.dtype, {c.batch, c.L, c.Hq, c.Ev + 1});
       }},
      {"k",  // a data pointer one byte past an element's boundary
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         other = random_array(c.dtype, {c.batch * c.L_new * c.Hkv * c.E + 1}, 9);
         other_ref = other.ref();
         other_ref.data = static_cast<const char*>(other.data()) + 1;
         other_ref.shape = {c.batch, c.L_new, c.Hkv, c.E};
         x.inputs.k = &other_ref;
       }},
      {"cache_seqlens",  // two bytes past an int32's boundary
       [&](CacheCase& c, CacheCall& x, sdpa::KVCacheOptions&, Array&) {
         lens_storage.assign(static_cast<size_t>(c.batch + 1), 0);
         lens2 = {reinterpret_cast<const int32_t*>(
                      reinterpret_cast<const char*>(lens_storage.data()) + 2),
                  {c.batch}};
         x.inputs.cache_seqlens = &lens2;
       }},
      {"threads", [&](CacheCase&, CacheCall&, sdpa::KVCacheOptions& o, Array&) { o.threads = -1; }},
      {"scale",
       [&](CacheCase&, CacheCall&, sdpa::KVCacheOptions& o, Array&) { o.scale = std::nan(""); }},
  };
  for (size_t n = 0; n < refusals.size(); ++n) {
    const Refusal& f = refusals[n];
    CacheCase c;
    c.page = 16;
    c.capacity = 64;
    c.L = 2;
    c.L_new = 2;
    c.seqlens = {20, 33};
    CacheCall x = make_call(c);
    sdpa::KVCacheOptions o;
    Array out(c.dtype, {c.batch, c.L, c.Hq, c.Ev}), lse(c.dtype, {c.batch, c.Hq, c.L});
    f.breaks(c, x, o, out);
    const Array k_before = x.k_cache.astype(x.k_cache.dtype());
    const Array v_before = x.v_cache.astype(x.v_cache.dtype());
    const Array out_before = out.astype(out.dtype()), lse_before = lse.astype(lse.dtype());
    const sdpa::MutableTensorRef lse_m = lse.mut();
    try {
      sdpa::attention_with_kvcache(x.q, x.k_cache.mut(), x.v_cache.mut(), x.inputs, o, out.mut(),
                                   &lse_m);
      ADD_FAILURE() << "refusal " << n << " (" << f.what << ") was accepted";
    } catch (const sdpa::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(std::string(f.what) + ":", 0), 0u)
          << "refusal " << n << ": '" << e.what() << "' should start with '" << f.what << ":'";
      // The argument and the kind as data, not only in the text: a dtype refusal is bad_type.
      EXPECT_EQ(e.argument(), f.what) << "refusal " << n << ": " << e.what();
      EXPECT_EQ(e.kind() == sdpa::ErrorKind::bad_type,
                std::string(e.what()).find("dtype") != std::string::npos)
          << "refusal " << n << ": " << e.what();
    }
    EXPECT_EQ(std::memcmp(x.k_cache.data(), k_before.data(), k_before.nbytes()), 0)
        << "refusal " << n << " changed k_cache";
    EXPECT_EQ(std::memcmp(x.v_cache.data(), v_before.data(), v_before.nbytes()), 0)
        << "refusal " << n << " changed v_cache";
    EXPECT_EQ(std::memcmp(out.data(), out_before.data(), out.nbytes()), 0)
        << "refusal " << n << " wrote out";
    EXPECT_EQ(std::memcmp(lse.data(), lse_before.data(), lse.nbytes()), 0)
        << "refusal " << n << " wrote lse";
  }
}

// ---- attention_forward's short-query path --------------------------------------------------

// attention_forward (fast) with L <= 16 runs the decode kernel; the same accuracy rule as the
// fused kernel, with masks, both causal alignments and GQA.
void check_forward(int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t E, int64_t Ev,
                   sdpa::Causal causal, int mask_kind, DType dtype, std::uint64_t seed,
                   int threads = 2) {
  sdpa::test::Case c;
  c.lead = {2};
  c.Hq = Hq;
  c.Hkv = Hkv;
  c.L = L;
  c.S = S;
  c.E = E;
  c.Ev = Ev;
  c.options.causal = causal;
  c.options.enable_gqa = Hq != Hkv;
  c.options.threads = threads;
  c.mask_kind = mask_kind;
  SCOPED_TRACE(c.name() + " " + sdpa::dtype_name(dtype));
  const sdpa::test::Inputs in = sdpa::test::make_inputs(c, dtype, seed);
  const auto out_shape = c.shape(Hq, L, Ev), lse_shape = std::vector<int64_t>{2, Hq, L};
  Array out(dtype, out_shape), lse(dtype, lse_shape);
  const sdpa::MutableTensorRef lse_m = lse.mut();
  sdpa::attention_forward(in.q, in.k, in.v, in.mask_ref(), c.options, out.mut(), &lse_m);
  Array ref(DType::float64, out_shape), ref_lse(DType::float64, lse_shape);
  const sdpa::MutableTensorRef ref_lse_m = ref_lse.mut();
  sdpa::AttentionOptions o = c.options;
  o.impl = sdpa::Impl::reference;
  const Array q64 = in.q.astype(DType::float64), k64 = in.k.astype(DType::float64),
              v64 = in.v.astype(DType::float64);
  sdpa::attention_forward(q64, k64, v64, in.mask_ref(), o, ref.mut(), &ref_lse_m);
  o.impl = sdpa::Impl::naive;
  Array naive(dtype, out_shape);
  sdpa::attention_forward(in.q, in.k, in.v, in.mask_ref(), o, naive.mut(), nullptr);
  std::int64_t worst = 0;
  const double err = sdpa::test::max_abs_diff(out.astype(DType::float64), ref, &worst);
  const double err_naive = sdpa::test::max_abs_diff(naive.astype(DType::float64), ref);
  EXPECT_LE(err, 2 * err_naive + 8 * eps_of(dtype) * std::max(1.0, sdpa::test::max_abs(ref)))
      << "worst element " << worst << ": " << get(out, worst) << " vs " << get(ref, worst);
  for (int64_t i = 0; i < lse.numel(); ++i) {
    const double want = get(ref_lse, i), got = get(lse, i);
    if (std::isinf(want)) {
      ASSERT_EQ(got, want) << "lse " << i;
      // A row that sees no key: zeros.
      for (int64_t e = 0; e < Ev; ++e) ASSERT_EQ(get(out, i * Ev + e), 0.0);
    } else {
      ASSERT_NEAR(got, want, 16 * eps_of(dtype) * std::max(1.0, std::fabs(want))) << "lse " << i;
    }
  }
}

TEST(DecodeForward, ShortQueriesMatchTheReference) {
  std::uint64_t seed = 50;
  const sdpa::Causal causals[] = {sdpa::Causal::none, sdpa::Causal::upper_left,
                                  sdpa::Causal::lower_right};
  for (int64_t L : {1, 2, 5, 16}) {
    for (int mask_kind : {0, 1, 2}) {
      check_forward(4, 2, L, 203, 17, L == 5 ? 9 : 17, causals[seed % 3], mask_kind, DType::float32,
                    seed);
      ++seed;
    }
  }
  check_forward(3, 3, 7, 1100, 64, 64, sdpa::Causal::upper_left, 0, DType::float64, seed++);
  check_forward(8, 1, 1, 1300, 33, 33, sdpa::Causal::none, 2, DType::float64, seed++);
  // Upper-left causal over many chunks: early rows see only the first chunk, every later chunk
  // is empty for them (m = -inf) and must drop out of the merge exactly.
  check_forward(2, 1, 16, 3000, 16, 16, sdpa::Causal::upper_left, 0, DType::float32, seed++);
  // L > S with upper-left... and lower-right, where the first rows see nothing at all.
  check_forward(2, 2, 16, 9, 8, 8, sdpa::Causal::lower_right, 0, DType::float32, seed++);
}

TEST(DecodeForward, NonFiniteValuesOfMaskedKeysNeverReachTheOutput) {
  const int64_t S = 700, E = 16;
  Array q = random_array(DType::float32, {1, 2, 1, E}, 1);
  Array k = random_array(DType::float32, {1, 2, S, E}, 2);
  Array v = random_array(DType::float32, {1, 2, S, E}, 3);
  Array mask(DType::boolean, {1, 1, 1, S});
  for (int64_t s = 0; s < S; ++s) {
    const bool hidden = s % 7 == 3;
    mask.data_as<std::uint8_t>()[s] = hidden ? 0 : 1;
    if (hidden) {
      for (int64_t h = 0; h < 2; ++h) {
        v.data_as<float>()[(h * S + s) * E + s % E] = NAN;
        k.data_as<float>()[(h * S + s) * E] = INFINITY;
      }
    }
  }
  sdpa::AttentionOptions o;
  Array out(DType::float32, {1, 2, 1, E});
  const sdpa::TensorRef mask_ref = mask.ref();
  sdpa::attention_forward(q, k, v, &mask_ref, o, out.mut());
  EXPECT_TRUE(sdpa::test::all_finite(out));
}

// The decode kernel computes float32 calls in float32 and recomputes in double the rows whose
// output shows an overflow. Heads of one call: 0 ordinary; 1 scores near 1e40 of both signs;
// 2 every score below -3.4e38 (each overflows to -inf in float32); 3 values of 3e38 (the sum of
// P V overflows); with a float mask that hides some keys by -inf, masks one row entirely and
// adds finfo.min to others (an ordinary row then: every score rounds to -3.4e38).
TEST(DecodeForward, RowsPastFloat32RangeAreExact) {
  const int64_t H = 4, L = 3, S = 1300, E = 24;
  Array q = random_array(DType::float32, {1, H, L, E}, 21);
  Array k = random_array(DType::float32, {1, H, S, E}, 22);
  Array v = random_array(DType::float32, {1, H, S, E}, 23);
  float* qd = q.data_as<float>();
  float* kd = k.data_as<float>();
  float* vd = v.data_as<float>();
  for (int64_t i = 0; i < L * E; ++i) {
    qd[1 * L * E + i] *= 1e20f;
    qd[2 * L * E + i] = std::fabs(qd[2 * L * E + i]) * 1e20f;
  }
  for (int64_t i = 0; i < S * E; ++i) {
    kd[1 * S * E + i] *= 1e20f;
    kd[2 * S * E + i] = -std::fabs(kd[2 * S * E + i]) * 1e20f;
    vd[3 * S * E + i] = vd[3 * S * E + i] < 0 ? -3e38f : 3e38f;
  }
  Array mask(DType::float32, {1, H, L, S});
  float* md = mask.data_as<float>();
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t s = 0; s < S; ++s) {
        float m = s % 5 == 1 ? -INFINITY : 0.0f;
        if (l == 1 && h == 0) m = -INFINITY;                           // fully masked
        if (l == 2 && h == 0) m = -std::numeric_limits<float>::max();  // finfo.min everywhere
        md[((h * L) + l) * S + s] = m;
      }
    }
  }
  const sdpa::TensorRef mask_ref = mask.ref();
  Array ref(DType::float64, {1, H, L, E}), ref_lse(DType::float64, {1, H, L});
  {
    sdpa::AttentionOptions o;
    o.impl = sdpa::Impl::reference;
    const sdpa::MutableTensorRef l = ref_lse.mut();
    sdpa::attention_forward(q.astype(DType::float64), k.astype(DType::float64),
                            v.astype(DType::float64), &mask_ref, o, ref.mut(), &l);
  }
  Array first(DType::float32, {1, H, L, E});
  for (int threads : {1, 2, 3}) {
    sdpa::AttentionOptions o;
    o.threads = threads;
    Array out(DType::float32, {1, H, L, E}), lse(DType::float32, {1, H, L});
    const sdpa::MutableTensorRef lse_m = lse.mut();
    sdpa::attention_forward(q, k, v, &mask_ref, o, out.mut(), &lse_m);
    for (int64_t h = 0; h < H; ++h) {
      const double scale = h == 3 ? 3e38 : 1.0;
      const double tol = h == 0 ? 2e-5 : 1e-6;  // heads 1-3 are recomputed in double
      for (int64_t l = 0; l < L; ++l) {
        for (int64_t e = 0; e < E; ++e) {
          const int64_t i = (h * L + l) * E + e;
          ASSERT_TRUE(std::isfinite(get(out, i))) << "head " << h << " row " << l;
          ASSERT_NEAR(get(out, i) / scale, get(ref, i) / scale, tol)
              << "head " << h << " row " << l;
        }
        const double want = static_cast<float>(get(ref_lse, h * L + l));
        const double got = get(lse, h * L + l);
        if (std::isinf(want)) {
          EXPECT_EQ(got, want) << "lse, head " << h << " row " << l;
        } else {
          EXPECT_NEAR(got, want, tol * std::max(1.0, std::fabs(want)))
              << "lse, head " << h << " row " << l;
        }
      }
    }
    if (threads == 1) {
      first = out.astype(DType::float32);
    } else {
      EXPECT_EQ(std::memcmp(out.data(), first.data(), out.nbytes()), 0) << threads << " threads";
    }
  }
}

TEST(DecodeForward, EmptyKeyRowsAreNeverRead) {
  // E = 0: every score is 0, so each row's output is the mean of the value rows it sees. The key
  // tensor points into a buffer of NaNs: a kernel that reads a padded vector of each empty key
  // row (instead of nothing) turns the scores into NaN.
  for (int64_t Ev : {0, 64}) {
    const int64_t S = 40;
    std::vector<float> nans(4096, NAN);
    const sdpa::TensorRef q{nans.data(), DType::float32, {1, 2, 2, 0}};
    const sdpa::TensorRef k{nans.data(), DType::float32, {1, 2, S, 0}};
    const Array v = random_array(DType::float32, {1, 2, S, Ev}, 9);
    sdpa::AttentionOptions o;
    o.causal = sdpa::Causal::lower_right;
    Array out(DType::float32, {1, 2, 2, Ev}), lse(DType::float32, {1, 2, 2});
    sdpa::MutableTensorRef lse_ref = lse.mut();
    sdpa::attention_forward(q, k, v, nullptr, o, out.mut(), &lse_ref);
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 2; ++i) {
        const int64_t seen = S - 1 + i;  // lower-right: row i sees keys 0 .. S - 2 + i
        EXPECT_NEAR(lse.data_as<float>()[h * 2 + i], std::log(double(seen)), 1e-5);
        for (int64_t e = 0; e < Ev; ++e) {
          double mean = 0;
          for (int64_t j = 0; j < seen; ++j) mean += v.data_as<float>()[(h * S + j) * Ev + e];
          mean /= double(seen);
          ASSERT_NEAR(out.data_as<float>()[(h * 2 + i) * Ev + e], mean, 1e-5)
              << "Ev " << Ev << " head " << h << " row " << i << " e " << e;
        }
      }
    }
  }
}

TEST(DecodeForward, BitIdenticalForAnyThreadCount) {
  const Array q = random_array(DType::float32, {2, 8, 4, 32}, 1);
  const Array k = random_array(DType::float32, {2, 2, 4100, 32}, 2);
  const Array v = random_array(DType::float32, {2, 2, 4100, 32}, 3);
  sdpa::AttentionOptions o;
  o.enable_gqa = true;
  o.causal = sdpa::Causal::lower_right;
  Array first(DType::float32, {2, 8, 4, 32});
  o.threads = 1;
  sdpa::attention_forward(q, k, v, nullptr, o, first.mut());
  for (int threads : {2, 3, 7}) {
    o.threads = threads;
    Array out(DType::float32, {2, 8, 4, 32});
    sdpa::attention_forward(q, k, v, nullptr, o, out.mut());
    EXPECT_EQ(std::memcmp(out.data(), first.data(), out.nbytes()), 0) << threads << " threads";
  }
}

// A caller that runs one call per thread of its own OpenMP team, one thread each (a server that
// parallelises over requests), gets each call's whole result: the call's loops share out its
// own work items, never the caller's team.
TEST(DecodeForward, OneThreadCallsInsideTheCallersParallelRegion) {
  constexpr int kCallers = 3;
  std::vector<Array> q, k, v, alone;
  sdpa::AttentionOptions o;
  o.enable_gqa = true;
  o.threads = 1;
  for (int c = 0; c < kCallers; ++c) {
    q.push_back(random_array(DType::float32, {1, 8, 2, 32}, 10 + 3 * c));
    k.push_back(random_array(DType::float32, {1, 2, 1500, 32}, 11 + 3 * c));
    v.push_back(random_array(DType::float32, {1, 2, 1500, 32}, 12 + 3 * c));
    alone.emplace_back(DType::float32, std::vector<std::int64_t>{1, 8, 2, 32});
    sdpa::attention_forward(q[c], k[c], v[c], nullptr, o, alone[c].mut());
  }
  std::vector<Array> inside;
  for (int c = 0; c < kCallers; ++c) {
    inside.emplace_back(DType::float32, std::vector<std::int64_t>{1, 8, 2, 32});
  }
  int team = 0;
#pragma omp parallel num_threads(kCallers)
  {
#pragma omp single
    team = omp_get_num_threads();
    const int c = omp_get_thread_num();
    sdpa::attention_forward(q[c], k[c], v[c], nullptr, o, inside[c].mut());
  }
  ASSERT_EQ(team, kCallers);
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_EQ(std::memcmp(inside[c].data(), alone[c].data(), alone[c].nbytes()), 0)
        << "caller " << c;
  }
}

// The same from an inactive region: a worksharing loop of a team of one thread (what
// `parallel for num_threads(n)` gives when n is 1), several one-thread calls per iteration of
// the caller's loop. Each call's own loops must run every one of its items.
TEST(DecodeForward, OneThreadCallsInsideTheCallersLoopOfOneThread) {
  constexpr int kCallers = 4;
  std::vector<Array> q, k, v, alone, inside;
  sdpa::AttentionOptions o;
  o.threads = 1;
  for (int c = 0; c < kCallers; ++c) {
    q.push_back(random_array(DType::float64, {1, 2, 7, 8}, 40 + 3 * c));
    k.push_back(random_array(DType::float64, {1, 2, 600 + 100 * c, 8}, 41 + 3 * c));
    v.push_back(random_array(DType::float64, {1, 2, 600 + 100 * c, 8}, 42 + 3 * c));
    alone.emplace_back(DType::float64, std::vector<std::int64_t>{1, 2, 7, 8});
    sdpa::attention_forward(q[c], k[c], v[c], nullptr, o, alone[c].mut());
    inside.emplace_back(DType::float64, std::vector<std::int64_t>{1, 2, 7, 8});
    std::fill_n(inside[c].data_as<double>(), inside[c].numel(), -1.0);
  }
  int level = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(1)
  for (int c = 0; c < kCallers; ++c) {
    if (c == 0) level = omp_get_level();
    sdpa::attention_forward(q[c], k[c], v[c], nullptr, o, inside[c].mut());
  }
  ASSERT_EQ(level, 1);
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_EQ(std::memcmp(inside[c].data(), alone[c].data(), alone[c].nbytes()), 0) << "call " << c;
  }
}

// The fused backward after a decode-sized forward (whose scores the decode kernel rounded in its
// own order): one key per row makes P = 1 exactly, so dV is the sum of dO's rows and dQ = dK = 0
// exactly, however large the rounding error of each score. Scores of large terms that cancel
// (q orthogonal to k, |q_e k_e| ~ 1e4) give the two kernels' scores different roundings.
TEST(DecodeForward, BackwardAfterADecodeForwardKeepsRowsNormalised) {
  for (DType dt : {DType::float32, DType::float64}) {
    for (int64_t L : {1, 5, 16}) {
      constexpr int64_t E = 256;
      std::mt19937_64 rng(3 + static_cast<std::uint64_t>(L));
      std::normal_distribution<double> normal(0.0, 1.0);
      Array q(dt, {1, L, E}), k(dt, {1, 1, E}), v(dt, {1, 1, E}), g(dt, {1, L, E});
      std::vector<double> kd(E);
      double kk = 0;
      for (int64_t e = 0; e < E; ++e) {
        kd[e] = 100 * normal(rng);
        kk += kd[e] * kd[e];
        sdpa::test::set(k, e, kd[e]);
        sdpa::test::set(v, e, normal(rng));
      }
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> qd(E);
        double qk = 0;
        for (int64_t e = 0; e < E; ++e) {
          qd[e] = 100 * normal(rng);
          qk += qd[e] * kd[e];
        }
        for (int64_t e = 0; e < E; ++e) {
          sdpa::test::set(q, i * E + e, qd[e] - qk / kk * kd[e]);
          sdpa::test::set(g, i * E + e, static_cast<double>((i + e) % 3 + 1));  // sums exact
        }
      }
      sdpa::AttentionOptions o;
      Array out(dt, {1, L, E}), lse(dt, {1, L}), dq(dt, {1, L, E}), dk(dt, {1, 1, E}),
          dv(dt, {1, 1, E});
      const sdpa::MutableTensorRef lse_ref = lse.mut();
      sdpa::attention_forward(q, k, v, nullptr, o, out.mut(), &lse_ref);
      sdpa::attention_backward(q, k, v, nullptr, out, lse, g, o, dq.mut(), dk.mut(), dv.mut());
      const std::string what = fmt::format("{} L {}", sdpa::dtype_name(dt), L);
      for (int64_t e = 0; e < E; ++e) {
        double sum = 0;
        for (int64_t i = 0; i < L; ++i) sum += get(g, i * E + e);
        ASSERT_EQ(get(dv, e), sum) << what << " dv " << e;
        ASSERT_EQ(get(dk, e), 0.0) << what << " dk " << e;
      }
      for (int64_t i = 0; i < L * E; ++i) ASSERT_EQ(get(dq, i), 0.0) << what << " dq " << i;
    }
  }
}

TEST(DecodeForward, ChunkRuleIsFixed) {
  // At most 16 chunks of at least 512 keys, a multiple of the tile; independent of threads.
  EXPECT_EQ(sdpa::detail::decode_chunk_keys(0), 512);
  EXPECT_EQ(sdpa::detail::decode_chunk_keys(512), 512);
  EXPECT_EQ(sdpa::detail::decode_chunk_keys(8193), 528);  // ceil(8193 / 16) rounded up to 16
  EXPECT_EQ(sdpa::detail::decode_chunk_keys(32768), 2048);
  for (int64_t S : {1, 600, 5000, 32768, 100001}) {
    const int64_t c = sdpa::detail::decode_chunk_keys(S);
    EXPECT_EQ(c % sdpa::detail::kDecodeTile, 0);
    EXPECT_LE((S + c - 1) / c, sdpa::detail::kDecodeMaxChunks) << S;
  }
}

// ---- every compiled SIMD target ------------------------------------------------------------

TEST(Decode, EveryCompiledTarget) {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  bool saw_portable = false;  // SCALAR with GCC, EMU128 with clang (Highway's choice)
  for (std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    std::printf("target %s\n", hwy::TargetName(target));
    ASSERT_STREQ(sdpa::detail::decode_kernel_target(), hwy::TargetName(target));
    saw_portable = saw_portable || target == HWY_SCALAR || target == HWY_EMU128;
    for (const CacheCase& c :
         sweep(DType::float32, 6, 100 + static_cast<std::uint64_t>(target % 97)))
      check_case(c);
    for (const CacheCase& c : sweep(DType::float64, 2, 200)) check_case(c);
    check_forward(4, 2, 3, 611, 80, 80, sdpa::Causal::lower_right, 2, DType::float32, 7);
    // E = Ev = 64 and 128 take the kernel's paths with the vector count fixed at compile time;
    // 1100 keys make three chunks, the last one partial.
    check_forward(8, 2, 1, 1100, 128, 128, sdpa::Causal::none, 0, DType::float32, 8);
    check_forward(4, 4, 2, 1100, 64, 64, sdpa::Causal::lower_right, 1, DType::float32, 9);
    check_forward(4, 1, 1, 1100, 128, 128, sdpa::Causal::none, 0, DType::float64, 10);
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_TRUE(saw_portable)
      << "the portable target (SCALAR or EMU128) should be compiled and tested";
}

// Shapes of the direct path at E = 64 and 128 (its compile-time chunk counts): contiguous caches
// with one row appended and L = 1, paged ones with L = 3 causal rows and `paged_new` appended;
// GQA, three sequences (the last empty) of the given lengths.
std::vector<CacheCase> direct_path_cases(DType dtype, std::uint64_t seed, int64_t capacity,
                                         std::vector<int32_t> seqlens, int64_t paged_new) {
  std::vector<CacheCase> cases;
  for (int64_t E : {64, 128}) {
    for (int64_t page : {0, 16}) {
      CacheCase c;
      c.dtype = dtype;
      c.E = c.Ev = E;
      c.page = page;
      c.Hq = E == 64 ? 8 : 16;
      c.Hkv = E == 64 ? 2 : 4;
      c.batch = 3;
      c.L = page == 0 ? 1 : 3;
      c.L_new = page == 0 ? 1 : paged_new;
      c.causal = page != 0;
      c.capacity = capacity;
      c.seqlens = seqlens;
      c.threads = 2;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  return cases;
}

// The call's caches and appended rows (made in c.dtype) converted to kv.
void to_cache_dtype(const CacheCase& c, CacheCall& x, DType kv) {
  if (kv == c.dtype) return;
  x.k_cache = x.k_cache.astype(kv);
  x.v_cache = x.v_cache.astype(kv);
  if (c.L_new > 0) {
    x.k = x.k.astype(kv);
    x.v = x.v.astype(kv);
    x.k_ref = x.k.ref();
    x.v_ref = x.v.ref();
  }
}

// The direct path reads a position-major cache either from a copy of each tile or in place
// (DecodeTileRead): the two must agree bit for bit (every sum in the same order), on every
// compiled target, over float32 and 16-bit caches, contiguous and paged, with appends, GQA,
// several chunks and causal rows; the copied reads also match the float64 reference.
TEST(Decode, CopiedAndInPlaceTilesAgreeBitForBit) {
  struct Restore {
    ~Restore() { sdpa::detail::set_decode_tile_read(sdpa::detail::DecodeTileRead::automatic); }
  } restore;
  const std::vector<CacheCase> cases =
      direct_path_cases(DType::float32, 900, 1280, {1100, 37, 0}, 0);
  const DType caches[] = {DType::float32, DType::float16, DType::bfloat16};
  for (const CacheCase& c : cases) {
    for (DType kv : caches) {
      CacheCall x = make_call(c);
      to_cache_dtype(c, x, kv);
      // Each call appends into the caches: every run starts from these copies.
      const Array k0 = x.k_cache.astype(kv), v0 = x.v_cache.astype(kv);
      for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
        hwy::SetSupportedTargetsForTest(target);
        const std::string what =
            fmt::format("{} cache {} target {}", c.name(), sdpa::dtype_name(kv),
                        sdpa::detail::decode_kernel_target());
        Result results[2];
        Array k_after[2];
        for (int copy = 0; copy < 2; ++copy) {
          sdpa::detail::set_decode_tile_read(copy ? sdpa::detail::DecodeTileRead::copy
                                                  : sdpa::detail::DecodeTileRead::in_place);
          std::memcpy(x.k_cache.data(), k0.data(), k0.nbytes());
          std::memcpy(x.v_cache.data(), v0.data(), v0.nbytes());
          results[copy] = run_kvcache(c, x);
          k_after[copy] = x.k_cache.astype(kv);
          if (copy == 1 && kv == DType::float32 && c.page == 0) {
            check_against_reference(c, x, results[copy]);
          }
        }
        ASSERT_EQ(
            std::memcmp(results[0].out.data(), results[1].out.data(), results[0].out.nbytes()), 0)
            << what;
        ASSERT_EQ(
            std::memcmp(results[0].lse.data(), results[1].lse.data(), results[0].lse.nbytes()), 0)
            << what;
        ASSERT_EQ(std::memcmp(k_after[0].data(), k_after[1].data(), k_after[0].nbytes()), 0)
            << what;
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace

// ---- float16 and bfloat16 caches -------------------------------------------------------------

namespace {

// A float32 q over 16-bit caches must give exactly what it gives over float32 caches holding
// the same (widened) values: the kernel widens exactly while packing and then runs the float32
// arithmetic, whose accuracy against the reference the sweeps above assert. Paged, with an
// append, GQA, E = 128 (the compile-time path) and an odd E, on every compiled target.
// With a 16-bit q (qdt float16 or bfloat16), q holds values of that dtype and out is the
// float32 result rounded once to it; lse stays float32 and equal.
void check_half_cache(DType half, int64_t E, std::uint64_t seed, DType qdt = DType::float32) {
  const int64_t batch = 2, L = 3, Hq = 8, Hkv = 2, page = 16, blocks = 12, L_new = 2;
  const auto to_half = [&](float x) {
    return half == DType::float16 ? sdpa::detail::float_to_float16(x)
                                  : sdpa::detail::float_to_bfloat16(x);
  };
  const auto widen = [&](std::uint16_t h) {
    return half == DType::float16 ? sdpa::detail::float16_to_float(h)
                                  : sdpa::detail::bfloat16_to_float(h);
  };
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto make = [&](std::vector<int64_t> shape, Array& wide) {
    int64_t n = 1;
    for (auto x : shape) n *= x;
    std::vector<std::uint16_t> h(static_cast<std::size_t>(n));
    wide = Array(DType::float32, shape);
    for (int64_t i = 0; i < n; ++i) {
      h[static_cast<std::size_t>(i)] = to_half(normal(rng));
      wide.data_as<float>()[i] = widen(h[static_cast<std::size_t>(i)]);
    }
    return h;
  };
  Array kc32, vc32, k32, v32;
  std::vector<std::uint16_t> kc = make({blocks, page, Hkv, E}, kc32);
  std::vector<std::uint16_t> vc = make({blocks, page, Hkv, E}, vc32);
  std::vector<std::uint16_t> kn = make({batch, L_new, Hkv, E}, k32);
  std::vector<std::uint16_t> vn = make({batch, L_new, Hkv, E}, v32);
  Array q(DType::float32, {batch, L, Hq, E});
  for (int64_t i = 0; i < q.numel(); ++i) q.data_as<float>()[i] = normal(rng);
  const bool half_q = qdt != DType::float32;
  const auto q_round = [&](float x) {
    return qdt == DType::float16 ? sdpa::detail::float_to_float16(x)
                                 : sdpa::detail::float_to_bfloat16(x);
  };
  const auto q_widen = [&](std::uint16_t h) {
    return qdt == DType::float16 ? sdpa::detail::float16_to_float(h)
                                 : sdpa::detail::bfloat16_to_float(h);
  };
  std::vector<std::uint16_t> qh(static_cast<std::size_t>(q.numel()));
  if (half_q) {
    for (int64_t i = 0; i < q.numel(); ++i) {
      qh[static_cast<std::size_t>(i)] = q_round(q.data_as<float>()[i]);
      q.data_as<float>()[i] = q_widen(qh[static_cast<std::size_t>(i)]);
    }
  }
  const sdpa::TensorRef q_ref =
      half_q ? sdpa::TensorRef{qh.data(), qdt, {batch, L, Hq, E}} : q.ref();
  std::vector<std::uint16_t> outh(static_cast<std::size_t>(batch * L * Hq * E));
  std::vector<int32_t> seqlens = {77, 0}, table(static_cast<std::size_t>(batch * 6));
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 5) % 12);
  const sdpa::Int32TensorRef sl{seqlens.data(), {batch}}, bt{table.data(), {batch, 6}};
  sdpa::KVCacheOptions o;
  o.causal = true;
  o.threads = 2;

  const sdpa::MutableTensorRef kc_ref{kc.data(), half, {blocks, page, Hkv, E}};
  const sdpa::MutableTensorRef vc_ref{vc.data(), half, {blocks, page, Hkv, E}};
  const sdpa::TensorRef kn_ref{kn.data(), half, {batch, L_new, Hkv, E}};
  const sdpa::TensorRef vn_ref{vn.data(), half, {batch, L_new, Hkv, E}};
  sdpa::KVCacheInputs in;
  in.k = &kn_ref;
  in.v = &vn_ref;
  in.cache_seqlens = &sl;
  in.block_table = &bt;
  Array out16(DType::float32, {batch, L, Hq, E}), lse16(DType::float32, {batch, Hq, L});
  const sdpa::MutableTensorRef lse16_ref = lse16.mut();
  if (half_q) {
    const sdpa::MutableTensorRef outh_ref{outh.data(), qdt, {batch, L, Hq, E}};
    sdpa::attention_with_kvcache(q_ref, kc_ref, vc_ref, in, o, outh_ref, &lse16_ref);
  } else {
    sdpa::attention_with_kvcache(q_ref, kc_ref, vc_ref, in, o, out16.mut(), &lse16_ref);
  }

  const sdpa::TensorRef k32_ref = k32, v32_ref = v32;
  sdpa::KVCacheInputs in32 = in;
  in32.k = &k32_ref;
  in32.v = &v32_ref;
  Array out32(DType::float32, {batch, L, Hq, E}), lse32(DType::float32, {batch, Hq, L});
  const sdpa::MutableTensorRef lse32_ref = lse32.mut();
  sdpa::attention_with_kvcache(q, kc32.mut(), vc32.mut(), in32, o, out32.mut(), &lse32_ref);

  const std::string what =
      fmt::format("{} cache, {} q, E{} target {}", sdpa::dtype_name(half), sdpa::dtype_name(qdt), E,
                  sdpa::detail::decode_kernel_target());
  if (half_q) {
    for (std::size_t i = 0; i < outh.size(); ++i) {
      ASSERT_EQ(outh[i], q_round(out32.data_as<float>()[i])) << what << " out " << i;
    }
  } else {
    EXPECT_EQ(std::memcmp(out16.data(), out32.data(), out16.nbytes()), 0) << what;
  }
  EXPECT_EQ(std::memcmp(lse16.data(), lse32.data(), lse16.nbytes()), 0) << what;
  // The append wrote the new 16-bit rows where the float32 call wrote their widened values.
  for (int64_t i = 0; i < kc32.numel(); ++i) {
    ASSERT_EQ(widen(kc[static_cast<std::size_t>(i)]), kc32.data_as<float>()[i]) << what << i;
    ASSERT_EQ(widen(vc[static_cast<std::size_t>(i)]), vc32.data_as<float>()[i]) << what << i;
  }
}

}  // namespace

TEST(KVCache, HalfCachesEqualTheirWidenedFloat32OnEveryTarget) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (DType half : {DType::float16, DType::bfloat16}) {
      check_half_cache(half, 128, 11);
      check_half_cache(half, 33, 12);
    }
    // 16-bit queries over 16-bit caches (both mixes of the two formats). All-bfloat16 with the
    // pairs off: the pairs round P to bfloat16 (BfloatPairsMatchTheReference checks them).
    {
      const sdpa::detail::bf16::ScopedPairsInKernel off(0);
      check_half_cache(DType::bfloat16, 128, 13, DType::bfloat16);
    }
    check_half_cache(DType::float16, 64, 14, DType::bfloat16);
    check_half_cache(DType::bfloat16, 33, 15, DType::float16);
  }
  hwy::SetSupportedTargetsForTest(0);
}

// All-bfloat16 decode (query and cache) on CPUs with vdpbf16ps takes bfloat16 pairs: scores
// from bfloat16 products, P rounded to bfloat16 before P V. Forced on and off, on every compiled
// target (only AVX3_DL has the pairs; the others must give the float32 path's results): the
// accuracy rule against the float64 reference with appends, GQA, paged and contiguous caches,
// several chunks and causal rows; bit-identical for 1, 2 and 3 threads and for copied and
// in-place tiles.
TEST(KVCache, BfloatPairsMatchTheReference) {
  struct Restore {
    ~Restore() {
      sdpa::detail::set_decode_tile_read(sdpa::detail::DecodeTileRead::automatic);
      hwy::SetSupportedTargetsForTest(0);
    }
  } restore;
  // Two chunks of keys in the first sequence.
  std::vector<CacheCase> cases = direct_path_cases(DType::bfloat16, 700, 640, {600, 37, 0}, 2);
  {
    CacheCase c;  // E a multiple of 32 but Ev not of 64: the float32 products
    c.dtype = DType::bfloat16;
    c.E = 96;
    c.Ev = 80;
    c.Hq = c.Hkv = 2;
    c.capacity = 200;
    c.seqlens = {150, 9};
    c.L_new = 1;
    c.seed = 799;
    cases.push_back(c);
  }
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    // The pairs are compiled for AVX3_DL alone; elsewhere forcing them changes nothing.
    const bool has_pairs = target == HWY_AVX3_DL && sdpa::detail::bf16::native();
    for (CacheCase c : cases) {
      Result unpaired;
      for (int pairs : {0, 1}) {
        if (pairs == 0 && !has_pairs) continue;
        const sdpa::detail::bf16::ScopedPairsInKernel mode(pairs);
        SCOPED_TRACE(fmt::format("{} target {} pairs {}", c.name(),
                                 sdpa::detail::decode_kernel_target(), pairs));
        c.threads = 2;
        check_case(c);
        Result first;
        int n = 0;
        for (int threads : {1, 2, 3}) {
          for (auto read :
               {sdpa::detail::DecodeTileRead::copy, sdpa::detail::DecodeTileRead::in_place}) {
            sdpa::detail::set_decode_tile_read(read);
            c.threads = threads;
            CacheCall x = make_call(c);
            const Result r = run_kvcache(c, x);
            if (n++ == 0) {
              first = Result{r.out.astype(c.dtype), r.lse.astype(lse_dtype(c.dtype))};
              continue;
            }
            ASSERT_EQ(std::memcmp(r.out.data(), first.out.data(), first.out.nbytes()), 0)
                << threads << " threads, read " << static_cast<int>(read);
            ASSERT_EQ(std::memcmp(r.lse.data(), first.lse.data(), first.lse.nbytes()), 0)
                << threads << " threads, read " << static_cast<int>(read);
          }
        }
        sdpa::detail::set_decode_tile_read(sdpa::detail::DecodeTileRead::automatic);
        if (pairs == 0) {
          unpaired = std::move(first);
        } else if (has_pairs && c.E % 32 == 0 && c.Ev % 64 == 0) {
          // P rounded to bfloat16 shows in the bits: the pairs were taken.
          EXPECT_NE(std::memcmp(first.out.data(), unpaired.out.data(), first.out.nbytes()), 0);
        }
      }
    }
  }
}

namespace {

// Shapes whose items read whole cache rows of less than a page in 16-bit elements, so that page
// order groups 16, 8 and 2 tiles: Hkv 1 at E 64 (one sequence over three chunks of keys); Hkv 4
// at E 64 and Hkv 8 at E 128 with 16 sequences (no item splits the heads), paged with appends
// and causal rows, lengths on and off the groups' edges.
std::vector<CacheCase> page_order_cases() {
  std::vector<CacheCase> cases;
  CacheCase a;
  a.Hq = 4;
  a.Hkv = 1;
  a.E = a.Ev = 64;
  a.batch = 2;
  a.capacity = 1200;
  a.seqlens = {1100, 300};
  a.seed = 1501;
  cases.push_back(a);
  CacheCase b;
  b.Hq = 8;
  b.Hkv = 4;
  b.E = b.Ev = 64;
  b.batch = 16;
  b.page = 16;
  b.capacity = 320;
  b.seqlens = {300, 129, 128, 127, 0, 1, 64, 200, 255, 256, 257, 17, 130, 33, 140, 160};
  b.L = 3;
  b.L_new = 2;
  b.causal = true;
  b.seed = 1502;
  cases.push_back(b);
  CacheCase c;
  c.Hq = 32;
  c.Hkv = 8;
  c.E = c.Ev = 128;
  c.batch = 16;
  c.capacity = 128;
  c.seqlens = {100, 64, 33, 31, 96, 0, 128, 65, 5, 127, 32, 63, 70, 99, 1, 80};
  c.seed = 1503;
  cases.push_back(c);
  return cases;
}

}  // namespace

// Page order (DecodeKeyOrder), each order forced, on every compiled target, over float32 and
// 16-bit caches: the accuracy rule against the float64 reference; copied and in-place tiles, 1
// and 3 threads bit-identical; a 16-bit cache equal to its widened float32 copy (the order does
// not depend on the dtype); each sequence of a contiguous cache alone giving its rows of the
// batch's call (nor on the other sequences); all-bfloat16 calls (the pairs where the target has
// them) within the rule; and the two orders differing somewhere where the target has the direct
// path, so that page order was taken.
TEST(Decode, PageOrderKeepsEveryGuarantee) {
  namespace d = sdpa::detail;
  struct Restore {
    ~Restore() {
      d::set_decode_tile_read(d::DecodeTileRead::automatic);
      d::set_decode_key_order(d::DecodeKeyOrder::automatic);
      hwy::SetSupportedTargetsForTest(0);
    }
  } restore;
  const std::vector<CacheCase> cases = page_order_cases();
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    bool orders_differ = false;
    for (const CacheCase& c0 : cases) {
      Result by_order[2];
      for (int page : {0, 1}) {
        d::set_decode_key_order(page ? d::DecodeKeyOrder::page : d::DecodeKeyOrder::memory);
        for (DType kv : {DType::float32, DType::float16, DType::bfloat16}) {
          CacheCase c = c0;
          const std::string what =
              fmt::format("{} cache {} order {} target {}", c.name(), sdpa::dtype_name(kv),
                          page ? "page" : "memory", d::decode_kernel_target());
          SCOPED_TRACE(what);
          CacheCall x = make_call(c);
          to_cache_dtype(c, x, kv);
          // Each call appends into the caches: every run starts from these copies.
          const Array k0 = x.k_cache.astype(kv), v0 = x.v_cache.astype(kv);
          const auto run = [&](d::DecodeTileRead read, int threads) {
            d::set_decode_tile_read(read);
            c.threads = threads;
            std::memcpy(x.k_cache.data(), k0.data(), k0.nbytes());
            std::memcpy(x.v_cache.data(), v0.data(), v0.nbytes());
            return run_kvcache(c, x);
          };
          const auto same = [](const Result& r, const Result& s) {
            return std::memcmp(r.out.data(), s.out.data(), r.out.nbytes()) == 0 &&
                   std::memcmp(r.lse.data(), s.lse.data(), r.lse.nbytes()) == 0;
          };
          const Result copied = run(d::DecodeTileRead::copy, 1);
          const Result three = run(d::DecodeTileRead::in_place, 3);
          const Result first = run(d::DecodeTileRead::in_place, 1);
          ASSERT_TRUE(same(first, copied)) << "copied and in-place tiles";
          ASSERT_TRUE(same(first, three)) << "1 and 3 threads";
          if (kv == DType::float32) {
            check_against_reference(c, x, first);
            by_order[page] =
                Result{first.out.astype(DType::float32), first.lse.astype(DType::float32)};
            if (c.page == 0 && c.L_new == 0) {
              // Each sequence of a contiguous cache alone gives its rows of the batch's call:
              // the order never depends on the other sequences.
              for (int64_t b : {int64_t{0}, c.batch - 1}) {
                CacheCase one = c;
                one.batch = 1;
                one.seqlens = {c.seqlens[static_cast<size_t>(b)]};
                CacheCall y = make_call(one);
                const auto slice = [b](const Array& from, Array& to) {
                  const size_t n = to.nbytes();
                  std::memcpy(to.data(), static_cast<const char*>(from.data()) + b * n, n);
                };
                slice(x.q, y.q);
                slice(x.k_cache, y.k_cache);
                slice(x.v_cache, y.v_cache);
                const Result alone = run_kvcache(one, y);
                const size_t on = alone.out.nbytes(), ln = alone.lse.nbytes();
                EXPECT_EQ(std::memcmp(alone.out.data(),
                                      static_cast<const char*>(first.out.data()) + b * on, on),
                          0)
                    << "sequence " << b << " alone";
                EXPECT_EQ(std::memcmp(alone.lse.data(),
                                      static_cast<const char*>(first.lse.data()) + b * ln, ln),
                          0)
                    << "sequence " << b << " alone, lse";
              }
            }
            continue;
          }
          // The same call over float32 caches holding the 16-bit values, widened.
          CacheCall w = make_call(c);
          w.k_cache = k0.astype(DType::float32);
          w.v_cache = v0.astype(DType::float32);
          if (c.L_new > 0) {
            w.k = x.k.astype(DType::float32);
            w.v = x.v.astype(DType::float32);
            w.k_ref = w.k.ref();
            w.v_ref = w.v.ref();
          }
          c.threads = 1;
          const Result widened = run_kvcache(c, w);
          ASSERT_TRUE(same(first, widened)) << "16-bit cache against its widened float32 copy";
          check_against_reference(c, w, widened);
        }
        // All-bfloat16 (query and caches), with the pairs forced on and off.
        for (int pairs : {0, 1}) {
          const d::bf16::ScopedPairsInKernel mode(pairs);
          CacheCase c = c0;
          c.dtype = DType::bfloat16;
          SCOPED_TRACE(fmt::format("{} order {} pairs {} target {}", c.name(),
                                   page ? "page" : "memory", pairs, d::decode_kernel_target()));
          check_case(c);
        }
      }
      orders_differ = orders_differ || std::memcmp(by_order[0].out.data(), by_order[1].out.data(),
                                                   by_order[0].out.nbytes()) != 0;
    }
    // The scalar targets have no direct path: both orders are memory order there.
    const bool direct = target != HWY_SCALAR && target != HWY_EMU128;
    EXPECT_EQ(orders_differ, direct) << "the orders differ on target " << d::decode_kernel_target();
  }
}

TEST(KVCache, MismatchedHalfDtypesAreRefusedWithTheCacheUntouched) {
  const int64_t Hkv = 2, E = 8;
  std::vector<std::uint16_t> kc(4 * 16 * Hkv * E, 0x3c00), vc(kc.size(), 0x3c00);
  const std::vector<std::uint16_t> kc0 = kc, vc0 = vc;
  std::vector<std::uint16_t> kn(1 * 1 * Hkv * E, 0x4000);
  Array k32(DType::float32, {1, 1, Hkv, E}), q32(DType::float32, {1, 1, 4, E});
  Array q64(DType::float64, {1, 1, 4, E}), out32(DType::float32, {1, 1, 4, E});
  Array out64(DType::float64, {1, 1, 4, E});
  std::vector<int32_t> seqlens = {10};
  const sdpa::Int32TensorRef sl{seqlens.data(), {1}};
  const sdpa::MutableTensorRef k16{kc.data(), DType::float16, {1, 64, Hkv, E}};
  const sdpa::MutableTensorRef v16{vc.data(), DType::float16, {1, 64, Hkv, E}};
  const sdpa::MutableTensorRef vbf{vc.data(), DType::bfloat16, {1, 64, Hkv, E}};
  const sdpa::TensorRef kn_bf{kn.data(), DType::bfloat16, {1, 1, Hkv, E}};
  const sdpa::TensorRef kn_16{kn.data(), DType::float16, {1, 1, Hkv, E}};
  const sdpa::TensorRef k32_ref = k32;
  const auto refused = [&](const sdpa::TensorRef& q, const sdpa::MutableTensorRef& v_cache,
                           const sdpa::TensorRef* k, const sdpa::TensorRef* v, Array& out,
                           const char* needle) {
    sdpa::KVCacheInputs in;
    in.cache_seqlens = &sl;
    in.k = k;
    in.v = v;
    try {
      sdpa::attention_with_kvcache(q, k16, v_cache, in, {}, out.mut());
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const sdpa::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(kc, kc0);
    EXPECT_EQ(vc, vc0);
  };
  refused(q32, vbf, nullptr, nullptr, out32, "v_cache: expected dtype float16");
  refused(q32, v16, &kn_bf, &kn_16, out32, "k: expected dtype float16");
  refused(q32, v16, &k32_ref, &kn_16, out32, "k: expected dtype float16");
  refused(q64, v16, nullptr, nullptr, out64, "k_cache: expected dtype float64");
  // And the same call with matching dtypes goes through (and appends).
  sdpa::KVCacheInputs in;
  in.cache_seqlens = &sl;
  in.k = &kn_16;
  in.v = &kn_16;
  sdpa::attention_with_kvcache(q32, k16, v16, in, {}, out32.mut());
  EXPECT_EQ(kc[10 * Hkv * E], 0x4000);
}
