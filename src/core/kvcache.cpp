// attention_with_kvcache (include/sdpa/kvcache.h): validate everything, append, then run the
// decode kernel on the caches where they lie.
//
// The order is the guarantee: every check (shapes, dtypes, heads, lengths, capacities, block
// indices, distinct append targets, outputs) runs before the first write, so a refused call
// leaves the caches and the outputs exactly as they were.
#include "sdpa/kvcache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "core/half.h"
#include "core/layout.h"
#include "core/problem.h"
#include "kernels/decode.h"
#include "sdpa/array.h"

namespace sdpa {
namespace {

using std::int64_t;

// The decode kernel and the in-place append address every tensor of this API in C order, so a
// strided view is refused rather than misread.
void check_c_order(const TensorRef& t, const char* what) {
  if (!t.strides.empty() && t.strides.size() != t.shape.size()) {
    throw Error(ErrorKind::bad_shape, what,
                fmt::format("expected {} strides (one per dimension), got {}", t.shape.size(),
                            t.strides.size()));
  }
  if (!detail::is_contiguous(t)) {
    std::vector<int64_t> c_order(t.shape.size());
    int64_t step = 1;
    for (std::size_t i = t.shape.size(); i-- > 0;) {
      c_order[i] = step;
      step *= t.shape[i];
    }
    throw Error(ErrorKind::bad_shape, what,
                fmt::format("expected C-contiguous strides {}, got {} (attention_with_kvcache "
                            "reads and writes its tensors in C order)",
                            shape_string(c_order), shape_string(t.strides)));
  }
}

void check_float_rank4(const TensorRef& t, const char* what, const char* layout,
                       bool half_ok = false) {
  const bool half = t.dtype == DType::float16 || t.dtype == DType::bfloat16;
  if (t.dtype != DType::float32 && t.dtype != DType::float64 && !(half_ok && half)) {
    throw Error(
        ErrorKind::bad_type, what,
        fmt::format("expected {}, got {}",
                    half_ok ? "float32, float64, float16 or bfloat16" : "float32 or float64",
                    dtype_name(t.dtype)));
  }
  if (t.shape.size() != 4) {
    throw Error(
        ErrorKind::bad_shape, what,
        fmt::format("expected 4 dimensions {}, got shape {}", layout, shape_string(t.shape)));
  }
  for (const int64_t d : t.shape) {
    if (d < 0) {
      throw Error(ErrorKind::bad_shape, what,
                  fmt::format("expected non-negative dimensions, got {}", shape_string(t.shape)));
    }
  }
  detail::check_data(t.data, dtype_size(t.dtype),
                     checked_numel(t.shape, dtype_size(t.dtype), what) > 0, what);
  check_c_order(t, what);
}

void check_dim(const TensorRef& t, std::size_t axis, int64_t expected, const char* what,
               const char* name) {
  if (t.shape[axis] != expected) {
    throw Error(ErrorKind::bad_shape, what,
                fmt::format("expected {} = {} at dimension {}, got shape {}", name, expected, axis,
                            shape_string(t.shape)));
  }
}

void check_dtype(const TensorRef& t, DType dtype, const char* what, const char* whose) {
  if (t.dtype != dtype) {
    throw Error(ErrorKind::bad_type, what,
                fmt::format("expected dtype {} (the dtype of {}), got {}", dtype_name(dtype), whose,
                            dtype_name(t.dtype)));
  }
}

// Everything resolve() learns; the caches' pointers are in `decode`.
struct Resolved {
  detail::DecodeProblem decode;
  DType q_dtype = DType::float32;  // of q and out (d.dtype is the arithmetic's)
  int64_t L_new = 0, num_blocks = 0, capacity = 0;
  std::vector<int64_t> cached;  // cache_seqlens, one per sequence
  bool paged = false;
};

Resolved resolve(const TensorRef& q, const TensorRef& k_cache, const TensorRef& v_cache,
                 const KVCacheInputs& in) {
  Resolved r;
  detail::DecodeProblem& d = r.decode;
  r.paged = in.block_table != nullptr;
  const char* cache_layout = r.paged ? "(num_blocks, page_size, Hkv, E)" : "(batch, S_max, Hkv, E)";
  check_float_rank4(q, "q", "(batch, L, Hq, E)", true);
  check_float_rank4(k_cache, "k_cache", cache_layout, true);
  check_float_rank4(v_cache, "v_cache", cache_layout, true);
  // float64 queries read float64 caches; float32, float16 and bfloat16 queries read float32,
  // float16 or bfloat16 caches (widened to float32 in registers; the arithmetic is float32's).
  if (q.dtype == DType::float64 || k_cache.dtype == DType::float64) {
    check_dtype(k_cache, q.dtype, "k_cache", "q");
  }
  check_dtype(v_cache, k_cache.dtype, "v_cache", "k_cache");
  r.q_dtype = q.dtype;
  d.dtype = q.dtype == DType::float64 ? DType::float64 : DType::float32;
  d.kv_dtype = k_cache.dtype;
  d.batch = q.shape[0];
  d.L = q.shape[1];
  d.Hq = q.shape[2];
  d.E = q.shape[3];
  d.Hkv = k_cache.shape[2];
  d.Ev = v_cache.shape[3];
  if (d.Hq < 1) {
    throw Error(ErrorKind::bad_shape, "q",
                fmt::format("expected Hq >= 1 at dimension 2, got {}", d.Hq));
  }
  if (d.E < 1)
    throw Error(ErrorKind::bad_shape, "q",
                fmt::format("expected E >= 1 at dimension 3, got {}", d.E));
  if (d.Hkv < 1) {
    throw Error(ErrorKind::bad_shape, "k_cache",
                fmt::format("expected Hkv >= 1 at dimension 2, got {}", d.Hkv));
  }
  if (d.Ev < 1) {
    throw Error(ErrorKind::bad_shape, "v_cache",
                fmt::format("expected Ev >= 1 at dimension 3, got {}", d.Ev));
  }
  if (d.Hq % d.Hkv != 0) {
    throw Error(ErrorKind::bad_shape, "k_cache",
                fmt::format("expected a number of heads Hkv dividing q's Hq = {}, got Hkv = {}",
                            d.Hq, d.Hkv));
  }
  check_dim(k_cache, 3, d.E, "k_cache", "q's E");
  check_dim(v_cache, 2, d.Hkv, "v_cache", "k_cache's Hkv");
  const char* dim0 = r.paged ? "k_cache's num_blocks" : "k_cache's batch";
  const char* dim1 = r.paged ? "k_cache's page_size" : "k_cache's S_max";
  check_dim(v_cache, 0, k_cache.shape[0], "v_cache", dim0);
  check_dim(v_cache, 1, k_cache.shape[1], "v_cache", dim1);

  if (r.paged) {
    const Int32TensorRef& bt = *in.block_table;
    if (bt.shape.size() != 2 || bt.shape[0] != d.batch || bt.shape[1] < 0) {
      throw Error(ErrorKind::bad_shape, "block_table",
                  fmt::format("expected shape (batch = {}, max_blocks), got {}", d.batch,
                              shape_string(bt.shape)));
    }
    if (k_cache.shape[1] < 1) {
      throw Error(ErrorKind::bad_shape, "k_cache",
                  fmt::format("expected page_size >= 1 at dimension 1, got shape {}",
                              shape_string(k_cache.shape)));
    }
    const std::int64_t entries = checked_numel(bt.shape, sizeof(std::int32_t), "block_table");
    detail::check_data(bt.data, sizeof(std::int32_t), entries > 0, "block_table");
    r.num_blocks = k_cache.shape[0];
    d.page_size = k_cache.shape[1];
    d.max_blocks = bt.shape[1];
    d.block_table = bt.data;
    // Rows a sequence can address: max_blocks pages of page_size rows each.
    if (__builtin_mul_overflow(d.max_blocks, d.page_size, &r.capacity)) {
      throw Error(ErrorKind::bad_shape, "block_table",
                  fmt::format("expected max_blocks * page_size within 64 bits, got {} blocks of "
                              "{} rows",
                              d.max_blocks, d.page_size));
    }
  } else {
    check_dim(k_cache, 0, d.batch, "k_cache", "q's batch");
    r.capacity = k_cache.shape[1];
    d.page_size = std::max<int64_t>(1, r.capacity);
  }

  r.cached.assign(static_cast<std::size_t>(d.batch), r.capacity);
  if (in.cache_seqlens != nullptr) {
    const Int32TensorRef& sl = *in.cache_seqlens;
    if (sl.shape.size() != 1 || sl.shape[0] != d.batch) {
      throw Error(
          ErrorKind::bad_shape, "cache_seqlens",
          fmt::format("expected shape (batch = {},), got {}", d.batch, shape_string(sl.shape)));
    }
    detail::check_data(sl.data, sizeof(std::int32_t), d.batch > 0, "cache_seqlens");
    for (int64_t b = 0; b < d.batch; ++b) {
      const int64_t n = sl.data[b];
      if (n < 0 || n > r.capacity) {
        throw Error(ErrorKind::bad_value, "cache_seqlens",
                    fmt::format("expected lengths in [0, {}] (the cache's capacity), got "
                                "cache_seqlens[{}] = {}",
                                r.capacity, b, n));
      }
      r.cached[static_cast<std::size_t>(b)] = n;
    }
  }

  if ((in.k == nullptr) != (in.v == nullptr)) {
    const char* missing = in.k == nullptr ? "k" : "v";
    const char* given = in.k == nullptr ? "v" : "k";
    throw Error(ErrorKind::bad_value, missing,
                fmt::format("expected k and v together, got {} without {}", given, missing));
  }
  if (in.k != nullptr) {
    check_float_rank4(*in.k, "k", "(batch, L_new, Hkv, E)", true);
    check_float_rank4(*in.v, "v", "(batch, L_new, Hkv, Ev)", true);
    check_dtype(*in.k, k_cache.dtype, "k", "k_cache");
    check_dtype(*in.v, k_cache.dtype, "v", "k_cache");
    check_dim(*in.k, 0, d.batch, "k", "q's batch");
    check_dim(*in.k, 2, d.Hkv, "k", "k_cache's Hkv");
    check_dim(*in.k, 3, d.E, "k", "q's E");
    check_dim(*in.v, 0, d.batch, "v", "q's batch");
    check_dim(*in.v, 1, in.k->shape[1], "v", "k's L_new");
    check_dim(*in.v, 2, d.Hkv, "v", "k_cache's Hkv");
    check_dim(*in.v, 3, d.Ev, "v", "v_cache's Ev");
    r.L_new = in.k->shape[1];
    for (int64_t b = 0; b < d.batch; ++b) {
      const int64_t n = r.cached[static_cast<std::size_t>(b)];
      if (n + r.L_new > r.capacity) {
        throw Error(ErrorKind::bad_value, "k",
                    fmt::format("appending {} rows at cache_seqlens[{}] = {} would pass the "
                                "cache's capacity {}",
                                r.L_new, b, n, r.capacity));
      }
    }
  }

  d.seq_lens.resize(static_cast<std::size_t>(d.batch));
  for (int64_t b = 0; b < d.batch; ++b) {
    d.seq_lens[static_cast<std::size_t>(b)] = r.cached[static_cast<std::size_t>(b)] + r.L_new;
  }
  if (r.paged) {
    // Every page a sequence reads (its first ceil(S_b / page_size) entries) must exist; the
    // entries past them are never read and may hold anything (-1 padding, say).
    struct Written {  // one appended row: where it goes, and whose position it is
      int64_t page, row, b, s;
      bool operator<(const Written& o) const {
        return std::tie(page, row, b, s) < std::tie(o.page, o.row, o.b, o.s);
      }
    };
    std::vector<Written> appended;
    for (int64_t b = 0; b < d.batch; ++b) {
      const int64_t S = d.seq_lens[static_cast<std::size_t>(b)];
      const int64_t pages = (S + d.page_size - 1) / d.page_size;
      for (int64_t i = 0; i < pages; ++i) {
        const int64_t page = d.block_table[b * d.max_blocks + i];
        if (page < 0 || page >= r.num_blocks) {
          throw Error(ErrorKind::bad_value, "block_table",
                      fmt::format("expected block indices in [0, {}) (k_cache's num_blocks), got "
                                  "block_table[{}][{}] = {} (sequence {} uses {} pages of {} "
                                  "rows)",
                                  r.num_blocks, b, i, page, b, pages, d.page_size));
        }
      }
      for (int64_t s = r.cached[static_cast<std::size_t>(b)]; s < S; ++s) {
        appended.push_back(
            {d.block_table[b * d.max_blocks + s / d.page_size], s % d.page_size, b, s});
      }
    }
    std::sort(appended.begin(), appended.end());
    const auto dup = std::adjacent_find(
        appended.begin(), appended.end(),
        [](const Written& x, const Written& y) { return x.page == y.page && x.row == y.row; });
    if (dup != appended.end()) {
      const Written& x = dup[0];
      const Written& y = dup[1];
      const std::string who =
          x.b == y.b ? fmt::format("sequence {} writing it for positions {} and {}", x.b, x.s, y.s)
                     : fmt::format("sequences {} (position {}) and {} (position {}) writing it",
                                   x.b, x.s, y.b, y.s);
      throw Error(ErrorKind::bad_value, "block_table",
                  fmt::format("expected distinct cache rows for the appended k/v, got row {} of "
                              "block {} twice: {}",
                              x.row, x.page, who));
    }
  }
  return r;
}

void check_outputs(const Resolved& r, const MutableTensorRef& out, const MutableTensorRef* lse) {
  const detail::DecodeProblem& d = r.decode;
  // out has q's dtype; lse is float32 for 16-bit queries (as attention_forward's lse).
  detail::check_tensor(out, r.q_dtype, {d.batch, d.L, d.Hq, d.Ev}, "out");
  if (lse != nullptr) detail::check_tensor(*lse, d.dtype, {d.batch, d.Hq, d.L}, "lse");
  check_c_order(out, "out");
  if (lse != nullptr) check_c_order(*lse, "lse");
}

// True when the byte ranges [a, a + na) and [b, b + nb) share a byte.
bool overlap(const void* a, std::size_t na, const void* b, std::size_t nb) {
  const auto ia = reinterpret_cast<std::uintptr_t>(a);
  const auto ib = reinterpret_cast<std::uintptr_t>(b);
  return na > 0 && nb > 0 && ia < ib + nb && ib < ia + na;
}

// The bytes a cache spans (the caches are C order).
std::size_t cache_bytes(const MutableTensorRef& cache, DType dtype) {
  return static_cast<std::size_t>(cache.numel()) * dtype_size(dtype);
}

// Copies the new rows into the caches (after every check passed).
void append(const Resolved& r, const KVCacheInputs& in, const MutableTensorRef& k_cache,
            const MutableTensorRef& v_cache) {
  const detail::DecodeProblem& d = r.decode;
  const std::size_t es = dtype_size(d.kv_dtype);
  const std::size_t krow = static_cast<std::size_t>(d.Hkv * d.E) * es;
  const std::size_t vrow = static_cast<std::size_t>(d.Hkv * d.Ev) * es;
  auto* kc = static_cast<unsigned char*>(k_cache.data);
  auto* vc = static_cast<unsigned char*>(v_cache.data);
  const auto* kn = static_cast<const unsigned char*>(in.k->data);
  const auto* vn = static_cast<const unsigned char*>(in.v->data);
  // New rows that are themselves a view of either cache (k = k_cache[:, 0:3]) are read whole
  // before any row is written: copied row by row in place, a later row would read one this
  // call had already overwritten.
  const std::size_t rows = static_cast<std::size_t>(d.batch * r.L_new);
  const std::size_t kc_bytes = cache_bytes(k_cache, d.kv_dtype);
  const std::size_t vc_bytes = cache_bytes(v_cache, d.kv_dtype);
  std::vector<unsigned char> k_copy, v_copy;
  const auto aliases = [&](const unsigned char* src, std::size_t bytes) {
    return overlap(src, bytes, kc, kc_bytes) || overlap(src, bytes, vc, vc_bytes);
  };
  if (aliases(kn, rows * krow)) {
    k_copy.assign(kn, kn + rows * krow);
    kn = k_copy.data();
  }
  if (aliases(vn, rows * vrow)) {
    v_copy.assign(vn, vn + rows * vrow);
    vn = v_copy.data();
  }
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t i = 0; i < r.L_new; ++i) {
      const int64_t s = r.cached[static_cast<std::size_t>(b)] + i;
      // One cache row holds every head of one position: Hkv * E contiguous elements.
      const int64_t slot =
          r.paged
              ? d.block_table[b * d.max_blocks + s / d.page_size] * d.page_size + s % d.page_size
              : b * r.capacity + s;
      const auto src = static_cast<std::size_t>(b * r.L_new + i);
      std::memcpy(kc + static_cast<std::size_t>(slot) * krow, kn + src * krow, krow);
      std::memcpy(vc + static_cast<std::size_t>(slot) * vrow, vn + src * vrow, vrow);
    }
  }
}

}  // namespace

std::vector<std::int64_t> kvcache_output_shape(const TensorRef& q, const TensorRef& k_cache,
                                               const TensorRef& v_cache,
                                               const KVCacheInputs& inputs) {
  const Resolved r = resolve(q, k_cache, v_cache, inputs);
  return {r.decode.batch, r.decode.L, r.decode.Hq, r.decode.Ev};
}

void attention_with_kvcache(const TensorRef& q, const MutableTensorRef& k_cache,
                            const MutableTensorRef& v_cache, const KVCacheInputs& inputs,
                            const KVCacheOptions& options, const MutableTensorRef& out,
                            const MutableTensorRef* lse) {
  Resolved r = resolve(q, k_cache, v_cache, inputs);
  check_outputs(r, out, lse);
  detail::DecodeProblem& d = r.decode;
  if (options.scale.has_value() && !std::isfinite(*options.scale)) {
    throw Error(ErrorKind::bad_value, "scale",
                fmt::format("expected a finite number, got {}", *options.scale));
  }
  d.scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(d.E)));
  d.causal = options.causal ? Causal::lower_right : Causal::none;
  d.threads = resolve_threads(options.threads);
  // New rows are written to both caches: where the two share memory, the value rows would
  // overwrite key rows (or the reverse) that the call then reads.
  if (r.L_new > 0 && overlap(k_cache.data, cache_bytes(k_cache, d.kv_dtype), v_cache.data,
                             cache_bytes(v_cache, d.kv_dtype))) {
    throw Error(ErrorKind::bad_value, "v_cache",
                "expected memory of its own when k and v are appended, got memory that "
                "overlaps k_cache");
  }
  // Every check has passed: from here on the call succeeds.
  if (r.L_new > 0) append(r, inputs, k_cache, v_cache);
  if (d.batch * d.L * d.Hq == 0) return;

  // A 16-bit q is widened (exactly) into a float32 copy, and out is computed in float32 and
  // rounded once to q's dtype: batch * L * Hq values, nothing next to the cache's size.
  const bool half_q = r.q_dtype == DType::float16 || r.q_dtype == DType::bfloat16;
  std::vector<float> q32, out32;
  if (half_q) {
    const auto nq = static_cast<std::size_t>(d.batch * d.L * d.Hq * d.E);
    const auto no = static_cast<std::size_t>(d.batch * d.L * d.Hq * d.Ev);
    const auto* bits = static_cast<const std::uint16_t*>(q.data);
    q32.resize(nq);
    out32.resize(no);
    for (std::size_t i = 0; i < nq; ++i) {
      q32[i] = r.q_dtype == DType::float16 ? detail::float16_to_float(bits[i])
                                           : detail::bfloat16_to_float(bits[i]);
    }
  }
  // q (batch, L, Hq, E), out (batch, L, Hq, Ev), lse (batch, Hq, L)
  d.q = half_q ? static_cast<const void*>(q32.data()) : q.data;
  if (r.q_dtype == DType::bfloat16) d.q_bf16 = q.data;  // for the bfloat16 pairs (decode.h)
  d.q_sh = d.E;
  d.q_sl = d.Hq * d.E;
  d.q_sb = d.L * d.Hq * d.E;
  d.out = half_q ? static_cast<void*>(out32.data()) : out.data;
  d.o_sh = d.Ev;
  d.o_sl = d.Hq * d.Ev;
  d.o_sb = d.L * d.Hq * d.Ev;
  d.lse = lse != nullptr ? lse->data : nullptr;
  d.lse_sl = 1;
  d.lse_sh = d.L;
  d.lse_sb = d.Hq * d.L;
  // Cache row s of a page holds every head: (page, s, hkv, e) at ((page * P + s) * Hkv + hkv) * E
  // + e, with P = page_size (the capacity S_max for a contiguous cache, one page per sequence).
  d.k = k_cache.data;
  d.v = v_cache.data;
  d.k_head = d.E;
  d.k_row = d.Hkv * d.E;
  d.k_page = d.page_size * d.Hkv * d.E;
  d.v_head = d.Ev;
  d.v_row = d.Hkv * d.Ev;
  d.v_page = d.page_size * d.Hkv * d.Ev;
  detail::decode_forward(d);
  if (half_q) {
    auto* bits = static_cast<std::uint16_t*>(out.data);
    for (std::size_t i = 0; i < out32.size(); ++i) {
      bits[i] = r.q_dtype == DType::float16 ? detail::float_to_float16(out32[i])
                                            : detail::float_to_bfloat16(out32[i]);
    }
  }
}

}  // namespace sdpa
