// The decode kernel: a few query rows per GQA group against a long run of keys (inference).
//
// Contract (asserted by tests/decode on every compiled SIMD target): tensors as described by
// DecodeProblem (decode.h); float32 computes in float32, float64 in float64; visibility exactly
// as the fused kernel's (flash.cpp): an invisible key is never read from V and its score is
// -inf; a row that sees no key gives out = 0, lse = -inf. Error against the float64 reference
// within 2 x that of the naive same-precision implementation plus a floor of a few epsilons.
// Results are bit-identical for any thread count (see the chunk rule below).
//
// Why a second kernel. Decoding attends L = 1..16 new queries to S = thousands of cached keys:
// 2 * (E + Ev) flops per key and query row, against (E + Ev) * sizeof(T) bytes per key read
// from memory, so for G * L rows (G = Hq / Hkv) the work is ~G * L / 2 flops per byte of
// float32: far below what the FMA units could use (~10 flops per byte at 400 GFLOP/s and
// 40 GB/s). The only thing that matters is to read every K/V byte once, at streaming speed. The
// fused kernel cannot: it packs a transposed copy of K on every call (a read and a write of K
// before any work), and its 64-row query tiles are mostly empty.
//
// Design. Work item = (sequence b, kv head, chunk of keys). An item takes the G * L query rows
// of its GQA group (scaled by `scale` once) and walks its chunk in tiles of kDecodeTile keys:
//   pass 1: scores. Dot products along E (vectorised along E, four keys at a time so that four
//           independent FMA chains are in flight), read from K where it lies: one K row is
//           E contiguous elements, whatever the layout or paging around it. The K tile
//           (32 keys: 16 KiB at E = 128 float32) stays in L1 while every row of the group
//           uses it, so K is read from memory once per group.
//   pass 2: mask and online softmax per row (Milakov & Gimelshein 2018; FlashAttention-2,
//           Dao 2023, Algorithm 1 lines 8-10): running max from -inf, P = exp(S - m), running
//           sum, the accumulator rescaled only when the max moved.
//   pass 3: acc += P V, vectorised along Ev, four vectors of acc in registers for the whole
//           tile; a key whose probability is exactly 0 (masked) is skipped, so a NaN stored in
//           a masked value row never reaches the output.
// No software prefetch: prefetching the next tile's K and V rows (into L1 or L2) measured 10%
// slower per CPU-second than none (7.2 against 8.2 GB/s of K/V on one Zen 5 thread, S = 32768,
// three alternating rounds), in both layouts; a tile of 16 keys measured level with 32.
//
// Chunk rule and determinism. The keys of a sequence of length S are cut into
// n = ceil(S / c) chunks of c = decode_chunk_keys(S) keys: at most kDecodeMaxChunks, at least
// kDecodeMinChunk keys each, a multiple of the tile. Each chunk leaves a partial (m, l, acc) per
// row; a second pass merges the partials of a row in chunk order:
//   M = max_c m_c,   l = sum_c exp(m_c - M) l_c,   out = sum_c exp(m_c - M) acc_c / l,
//   lse = M + log(l).
// A chunk that saw no visible key has m_c = -inf and is skipped, so the merge is exact (no
// exp(-inf - -inf)); a row with M = -inf gives zeros and lse = -inf. Neither the cut nor the
// order of any sum depends on the thread count or on which thread runs an item.
//
// Memory traffic: K and V once per GQA group, plus the partials (G * L * (Ev + 2) values per
// chunk, 0.1% of K/V at S = 32768, E = 128, L = 1). Extra memory: those partials and, per
// thread, the scaled queries and one tile of scores.
#include "kernels/decode.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>

#include "kernels/flash_common.h"
#include "kernels/workspace.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/decode.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"
#include "kernels/gemm-inl.h"  // RowMax, ExpShiftSum, ScaleRow (n % Lanes == 0)

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {

using std::int64_t;
using std::size_t;

template <typename T>
constexpr T kDecodeNegInf = -std::numeric_limits<T>::infinity();

// out[i] = q . k_i over E elements, for four keys at once (four independent FMA chains).
template <typename T>
HWY_INLINE void Dot4(const T* HWY_RESTRICT q, const T* k0, const T* k1, const T* k2, const T* k3,
                     int64_t E, T* out) {
  const hn::ScalableTag<T> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  int64_t e = 0;
  for (; e + N <= E; e += N) {
    const auto qv = hn::LoadU(d, q + e);
    a0 = hn::MulAdd(qv, hn::LoadU(d, k0 + e), a0);
    a1 = hn::MulAdd(qv, hn::LoadU(d, k1 + e), a1);
    a2 = hn::MulAdd(qv, hn::LoadU(d, k2 + e), a2);
    a3 = hn::MulAdd(qv, hn::LoadU(d, k3 + e), a3);
  }
  T t0 = 0, t1 = 0, t2 = 0, t3 = 0;
  for (; e < E; ++e) {
    t0 += q[e] * k0[e];
    t1 += q[e] * k1[e];
    t2 += q[e] * k2[e];
    t3 += q[e] * k3[e];
  }
  out[0] = hn::GetLane(hn::SumOfLanes(d, a0)) + t0;
  out[1] = hn::GetLane(hn::SumOfLanes(d, a1)) + t1;
  out[2] = hn::GetLane(hn::SumOfLanes(d, a2)) + t2;
  out[3] = hn::GetLane(hn::SumOfLanes(d, a3)) + t3;
}

template <typename T>
HWY_INLINE T Dot1(const T* HWY_RESTRICT q, const T* k, int64_t E) {
  const hn::ScalableTag<T> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto a = hn::Zero(d);
  int64_t e = 0;
  for (; e + N <= E; e += N) a = hn::MulAdd(hn::LoadU(d, q + e), hn::LoadU(d, k + e), a);
  T t = 0;
  for (; e < E; ++e) t += q[e] * k[e];
  return hn::GetLane(hn::SumOfLanes(d, a)) + t;
}

// acc[0..Ev) += sum_j p[j] * v_j[0..Ev) over j < n, skipping p[j] == 0; four vectors of acc
// stay in registers for the whole run of keys.
template <typename T>
HWY_INLINE void AccumulatePV(const T* HWY_RESTRICT p, const T* const* v, int64_t n, int64_t Ev,
                             T* HWY_RESTRICT acc) {
  const hn::ScalableTag<T> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t e = 0;
  for (; e + 4 * N <= Ev; e += 4 * N) {
    auto a0 = hn::LoadU(d, acc + e), a1 = hn::LoadU(d, acc + e + N);
    auto a2 = hn::LoadU(d, acc + e + 2 * N), a3 = hn::LoadU(d, acc + e + 3 * N);
    for (int64_t j = 0; j < n; ++j) {
      if (p[j] == T(0)) continue;
      const auto pj = hn::Set(d, p[j]);
      const T* vr = v[j] + e;
      a0 = hn::MulAdd(pj, hn::LoadU(d, vr), a0);
      a1 = hn::MulAdd(pj, hn::LoadU(d, vr + N), a1);
      a2 = hn::MulAdd(pj, hn::LoadU(d, vr + 2 * N), a2);
      a3 = hn::MulAdd(pj, hn::LoadU(d, vr + 3 * N), a3);
    }
    hn::StoreU(a0, d, acc + e);
    hn::StoreU(a1, d, acc + e + N);
    hn::StoreU(a2, d, acc + e + 2 * N);
    hn::StoreU(a3, d, acc + e + 3 * N);
  }
  for (; e + N <= Ev; e += N) {
    auto a = hn::LoadU(d, acc + e);
    for (int64_t j = 0; j < n; ++j) {
      if (p[j] != T(0)) a = hn::MulAdd(hn::Set(d, p[j]), hn::LoadU(d, v[j] + e), a);
    }
    hn::StoreU(a, d, acc + e);
  }
  for (; e < Ev; ++e) {
    T a = acc[e];
    for (int64_t j = 0; j < n; ++j) {
      if (p[j] != T(0)) a += p[j] * v[j][e];
    }
    acc[e] = a;
  }
}

template <typename T>
struct Scratch {
  T* qs;             // [R][E]: the group's query rows times scale
  T* s;              // [R][kDecodeTile]: scores, then probabilities
  int64_t* last;     // [R]: last visible key of each row (may be < 0)
  int64_t* visible;  // [R]: keys of the current tile the row sees before the mask
  const T** kp;      // [kDecodeTile]: K row pointers of this tile
  const T** vp;      // [kDecodeTile]

  static size_t Carve(Carver& c, int64_t R, int64_t E, Scratch* out) {
    Scratch w;
    w.qs = c.take<T>(static_cast<size_t>(R * E));
    w.s = c.take<T>(static_cast<size_t>(R * kDecodeTile));
    w.last = c.take<int64_t>(static_cast<size_t>(R));
    w.visible = c.take<int64_t>(static_cast<size_t>(R));
    w.kp = c.take<const T*>(kDecodeTile);
    w.vp = c.take<const T*>(kDecodeTile);
    if (out != nullptr) *out = w;
    return c.used();
  }
};

struct Item {
  int64_t b, hkv, s0, s1, index;  // keys [s0, s1) of sequence b, kv head hkv; partial `index`
};

int64_t LastKey(const DecodeProblem& p, int64_t S, int64_t l) {
  switch (p.causal) {
    case Causal::upper_left:
      return std::min(l, S - 1);
    case Causal::lower_right:
      return std::min(l + (S - p.L), S - 1);
    case Causal::none:
      break;
  }
  return S - 1;
}

// Row pointers of keys s0 .. s0 + n of sequence b, head hkv.
template <typename T>
void KeyRows(const DecodeProblem& p, int64_t b, int64_t hkv, int64_t s0, int64_t n, const T** kp,
             const T** vp) {
  const T* k = static_cast<const T*>(p.k) + hkv * p.k_head;
  const T* v = static_cast<const T*>(p.v) + hkv * p.v_head;
  int64_t block = s0 / p.page_size, off = s0 % p.page_size;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t page = p.block_table != nullptr ? p.block_table[b * p.max_blocks + block] : b;
    kp[j] = k + page * p.k_page + off * p.k_row;
    vp[j] = v + page * p.v_page + off * p.v_row;
    if (++off == p.page_size) {
      off = 0;
      ++block;
    }
  }
}

// One work item: rows of the GQA group of (b, hkv) against keys [s0, s1); leaves the partial
// running max m, sum l and unnormalised accumulator acc (leading dimension ldv) of every row.
template <typename T>
void DecodeItem(const DecodeProblem& p, const Item& it, const Scratch<T>& w, int64_t ldv, T* acc,
                T* m, T* l) {
  const int64_t G = p.Hq / p.Hkv, L = p.L, R = G * L, E = p.E, Ev = p.Ev;
  const int64_t S = p.seq_lens[static_cast<size_t>(it.b)];
  const T scale = static_cast<T>(p.scale);
  const T* q = static_cast<const T*>(p.q);
  int64_t last_any = -1;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = it.hkv * G + g;
    for (int64_t i = 0; i < L; ++i) {
      const int64_t r = g * L + i;
      const T* src = q + it.b * p.q_sb + h * p.q_sh + i * p.q_sl;
      for (int64_t e = 0; e < E; ++e) w.qs[r * E + e] = scale * src[e];
      w.last[r] = LastKey(p, S, i);
      last_any = std::max(last_any, w.last[r]);
      m[r] = kDecodeNegInf<T>;
      l[r] = T(0);
      std::fill_n(acc + r * ldv, ldv, T(0));
    }
  }
  // Keys past every row's last visible key are never read.
  const int64_t end = std::min(it.s1, last_any + 1);
  if (end <= it.s0) return;
  for (int64_t s0 = it.s0; s0 < end; s0 += kDecodeTile) {
    const int64_t kc = std::min(kDecodeTile, end - s0);
    const T** kp = w.kp;
    const T** vp = w.vp;
    KeyRows(p, it.b, it.hkv, s0, kc, kp, vp);
    // pass 1: scores of every row of the group against this tile (K read from memory once)
    for (int64_t r = 0; r < R; ++r) {
      T* srow = w.s + r * kDecodeTile;
      const T* qr = w.qs + r * E;
      const int64_t vis = std::clamp<int64_t>(w.last[r] - s0 + 1, 0, kc);
      w.visible[r] = vis;
      int64_t j = 0;
      for (; j + 4 <= vis; j += 4) Dot4(qr, kp[j], kp[j + 1], kp[j + 2], kp[j + 3], E, srow + j);
      for (; j < vis; ++j) srow[j] = Dot1(qr, kp[j], E);
      for (; j < kDecodeTile; ++j) srow[j] = kDecodeNegInf<T>;
      if (p.mask_problem != nullptr && vis > 0) {
        const int64_t g = r / L, i = r % L;
        flash::mask_row(*p.mask_problem, it.b, it.hkv * G + g, i, s0, kc, kDecodeTile, srow);
      }
    }
    // pass 2: online softmax; pass 3: acc += P V (V read from memory once)
    for (int64_t r = 0; r < R; ++r) {
      if (w.visible[r] == 0) continue;
      T* srow = w.s + r * kDecodeTile;
      T* ar = acc + r * ldv;
      const T m_old = m[r];
      const T tile_max = RowMax(srow, kDecodeTile);
      // A NaN score makes the row NaN (std::max would drop it), as in the fused kernel.
      const T m_new = std::isnan(tile_max) ? tile_max : std::max(m_old, tile_max);
      if (m_new == kDecodeNegInf<T>) continue;  // nothing visible so far: P row = 0
      const T row_sum = ExpShiftSum(srow, kDecodeTile, m_new);
      if (m_new != m_old) {
        const T alpha = std::exp(m_old - m_new);  // 0 when m_old = -inf
        if (m_old != kDecodeNegInf<T>) ScaleRow(ar, static_cast<size_t>(ldv), alpha);
        l[r] = l[r] * alpha + row_sum;
        m[r] = m_new;
      } else {
        l[r] += row_sum;
      }
      AccumulatePV(srow, vp, w.visible[r], Ev, ar);
    }
  }
}

// Merges the partials of the chunks of one output row in chunk order (exact for empty chunks).
template <typename T>
void MergeRow(int64_t chunks, int64_t stride_acc, int64_t stride_ml, const T* acc, const T* m,
              const T* l, int64_t Ev, T* out, T* lse) {
  T M = kDecodeNegInf<T>;
  for (int64_t c = 0; c < chunks; ++c) {
    const T mc = m[c * stride_ml];
    M = std::isnan(mc) || std::isnan(M) ? std::numeric_limits<T>::quiet_NaN() : std::max(M, mc);
  }
  if (M == kDecodeNegInf<T>) {  // no visible key: out = 0, lse = -inf
    std::fill_n(out, Ev, T(0));
    if (lse != nullptr) *lse = kDecodeNegInf<T>;
    return;
  }
  std::fill_n(out, Ev, T(0));
  T sum = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const T mc = m[c * stride_ml];
    if (mc == kDecodeNegInf<T>) continue;  // an empty chunk adds nothing
    const T wc = std::exp(mc - M);
    sum += wc * l[c * stride_ml];
    const T* a = acc + c * stride_acc;
    for (int64_t e = 0; e < Ev; ++e) out[e] += wc * a[e];
  }
  const T inv = T(1) / sum;
  for (int64_t e = 0; e < Ev; ++e) out[e] *= inv;
  if (lse != nullptr) *lse = M + std::log(sum);
}

template <typename T>
void DecodeT(const DecodeProblem& p) {
  const int64_t G = p.Hq / p.Hkv, R = G * p.L, Ev = p.Ev;
  const int64_t ldv = flash::round_up(std::max<int64_t>(Ev, 1), flash::kPad<T>);
  // Items in a fixed order: sequence, kv head, chunk. first[b] is sequence b's first partial.
  std::vector<Item> items;
  std::vector<int64_t> first(static_cast<size_t>(p.batch) + 1, 0),
      chunks(static_cast<size_t>(p.batch));
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t S = p.seq_lens[static_cast<size_t>(b)];
    const int64_t c = decode_chunk_keys(S);
    const int64_t n = std::max<int64_t>(1, flash::ceil_div(S, c));
    chunks[static_cast<size_t>(b)] = n;
    first[static_cast<size_t>(b) + 1] = first[static_cast<size_t>(b)] + p.Hkv * n;
    for (int64_t hkv = 0; hkv < p.Hkv; ++hkv) {
      for (int64_t i = 0; i < n; ++i) {
        items.push_back(
            {b, hkv, i * c, std::min(S, (i + 1) * c), first[static_cast<size_t>(b)] + hkv * n + i});
      }
    }
  }
  const int64_t nitems = static_cast<int64_t>(items.size());
  Carver measure;
  measure.take<T>(static_cast<size_t>(nitems * R * ldv));
  measure.take<T>(static_cast<size_t>(nitems * R));
  measure.take<T>(static_cast<size_t>(nitems * R));
  Carver carve(call_shared().reserve(measure.used()));
  T* part_acc = carve.take<T>(static_cast<size_t>(nitems * R * ldv));
  T* part_m = carve.take<T>(static_cast<size_t>(nitems * R));
  T* part_l = carve.take<T>(static_cast<size_t>(nitems * R));

  Carver scratch_measure;
  const size_t scratch_bytes = Scratch<T>::Carve(scratch_measure, R, p.E, nullptr);
  bool failed = false;
  T* out = static_cast<T*>(p.out);
  T* lse = static_cast<T*>(p.lse);
#pragma omp parallel num_threads(p.threads)
  {
    // An exception cannot leave a thread of the region: a failed allocation is recorded and
    // rethrown by the calling thread.
    void* mem = nullptr;
    try {
      mem = thread_scratch().reserve(scratch_bytes);
    } catch (const std::bad_alloc&) {
#pragma omp atomic write
      failed = true;
    }
    Scratch<T> w{};
    if (mem != nullptr) {
      Carver c(mem);
      Scratch<T>::Carve(c, R, p.E, &w);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < nitems; ++i) {
      if (mem == nullptr) continue;
      const Item& it = items[static_cast<size_t>(i)];
      DecodeItem(p, it, w, ldv, part_acc + it.index * R * ldv, part_m + it.index * R,
                 part_l + it.index * R);
    }
    // Merge: each output row is written by one iteration, chunks in order.
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < p.batch * p.Hkv; ++bh) {
      if (failed) continue;
      const int64_t b = bh / p.Hkv, hkv = bh % p.Hkv;
      const int64_t n = chunks[static_cast<size_t>(b)];
      const int64_t base = first[static_cast<size_t>(b)] + hkv * n;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = hkv * G + g;
        for (int64_t i = 0; i < p.L; ++i) {
          const int64_t r = g * p.L + i;
          T* o = out + b * p.o_sb + h * p.o_sh + i * p.o_sl;
          T* ls = lse != nullptr ? lse + b * p.lse_sb + h * p.lse_sh + i * p.lse_sl : nullptr;
          MergeRow(n, R * ldv, R, part_acc + (base * R + r) * ldv, part_m + base * R + r,
                   part_l + base * R + r, Ev, o, ls);
        }
      }
    }
  }
  if (failed) throw std::bad_alloc();
}

}  // namespace

void DecodeFloat(const DecodeProblem& p) { DecodeT<float>(p); }
void DecodeDouble(const DecodeProblem& p) { DecodeT<double>(p); }
const char* DecodeTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace sdpa::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::detail {

HWY_EXPORT(DecodeFloat);
HWY_EXPORT(DecodeDouble);
HWY_EXPORT(DecodeTargetName);

std::int64_t decode_chunk_keys(std::int64_t S) {
  const std::int64_t even = flash::ceil_div(std::max<std::int64_t>(S, 1), kDecodeMaxChunks);
  return flash::round_up(std::max(even, kDecodeMinChunk), kDecodeTile);
}

void decode_forward(const DecodeProblem& p) {
  if (p.dtype == DType::float64) {
    HWY_DYNAMIC_DISPATCH(DecodeDouble)(p);
  } else {
    HWY_DYNAMIC_DISPATCH(DecodeFloat)(p);
  }
}

bool decode_applies(const Problem& p) { return p.L <= kDecodeMaxQueries; }

void decode_forward(const Problem& p, void* out, void* lse) {
  DecodeProblem d;
  d.dtype = p.dtype;
  d.batch = p.B;
  d.Hq = p.Hq;
  d.Hkv = p.Hkv;
  d.L = p.L;
  d.E = p.E;
  d.Ev = p.Ev;
  d.scale = p.scale;
  d.causal = p.causal;
  d.threads = p.threads;
  // query [B][Hq][L][E], out [B][Hq][L][Ev], lse [B][Hq][L]
  d.q = p.query;
  d.q_sl = p.E;
  d.q_sh = p.L * p.E;
  d.q_sb = p.Hq * p.L * p.E;
  d.out = out;
  d.o_sl = p.Ev;
  d.o_sh = p.L * p.Ev;
  d.o_sb = p.Hq * p.L * p.Ev;
  d.lse = lse;
  d.lse_sl = 1;
  d.lse_sh = p.L;
  d.lse_sb = p.Hq * p.L;
  // key [B][Hkv][S][E]: one page per sequence, holding all S keys of every head
  d.k = p.key;
  d.v = p.value;
  d.k_row = p.E;
  d.k_head = p.S * p.E;
  d.k_page = p.Hkv * p.S * p.E;
  d.v_row = p.Ev;
  d.v_head = p.S * p.Ev;
  d.v_page = p.Hkv * p.S * p.Ev;
  d.page_size = std::max<std::int64_t>(p.S, 1);
  d.seq_lens.assign(static_cast<std::size_t>(p.B), p.S);
  d.mask_problem = p.mask.present ? &p : nullptr;
  decode_forward(d);
}

const char* decode_kernel_target() { return HWY_DYNAMIC_DISPATCH(DecodeTargetName)(); }

}  // namespace sdpa::detail
#endif  // HWY_ONCE
