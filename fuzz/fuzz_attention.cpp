// libFuzzer target: shape and option validation of sdpa::attention_forward, and the numbers it
// produces for small, awkward problems.
//
// The input bytes choose a problem: rank, shapes (usually consistent, sometimes corrupted by
// one dimension set to 0, a neighbour, -1 or a huge value), dtype, implementation, causal
// alignment, GQA, a mask (bool or float, broadcast or not), a scale (default, ordinary, zero,
// NaN, inf, huge), a thread count (valid or not) and finally the tensor entries, one byte each
// (ordinary values in [-7.5, 7.4] plus NaN, +-inf, +-1e30, subnormals and -0).
//
// Contract checked:
//   1. attention_forward returns or throws sdpa::Error; anything else is a bug. Tensors too big
//      to allocate here are passed with a null data pointer, which must be refused, never read.
//   2. NaN only where called for: when q, k, v, the mask (-inf aside) and the scale are finite
//      and no score can overflow float64 (|scale| * E * max|q| * max|k| < 1e300), every output
//      is finite and lse is never NaN (it is -inf for a row that sees no key).
//   3. out is a convex combination of value rows: |out| <= max|v| up to the rounding of the
//      probabilities' sum (S + 8 units in the last place of float32).
//   4. For moderate inputs (no special values) every implementation agrees with the float64
//      reference within a bound derived from float32 rounding (see differential_bound()).
//   5. With lse requested and a finite output gradient (more entries from the bytes), the
//      backward accepts what the forward accepted and, when every exact gradient is far inside
//      float32's range, returns finite dq, dk and dv.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::DType;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_attention: contract violated: %s\n", what.c_str());
  std::abort();
}

// Tensors above this many elements are not allocated (null data must then be refused).
constexpr std::int64_t kMaxElements = 1 << 16;

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t next() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool empty() const { return pos_ >= size_; }
  double raw_double() {
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits |= std::uint64_t(next()) << (8 * i);
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// One byte -> one entry. Special values sit at the top of the byte range.
double entry(std::uint8_t b, bool* special) {
  *special = b >= 240;
  switch (b) {
    case 240:
      return std::numeric_limits<double>::quiet_NaN();
    case 241:
      return std::numeric_limits<double>::infinity();
    case 242:
      return -std::numeric_limits<double>::infinity();
    case 243:
      return 1e30;
    case 244:
      return -1e30;
    case 245:
      return std::numeric_limits<float>::denorm_min();
    case 246:
      return -0.0;
    case 247:
      return 1e-30;
    case 248:
      return 3e38;
    default:
      if (b > 248) return (b - 252) * 0.25;
      return (b - 120) / 16.0;
  }
}

struct Filled {
  sdpa::Array array;
  bool allocated = false;
  bool finite = true;    // no NaN or inf
  bool moderate = true;  // no special value at all
  double max_abs = 0.0;
};

std::int64_t numel_or_max(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d < 0) return -1;
  }
  for (auto d : shape) {
    if (d == 0) return 0;
  }
  for (auto d : shape) {
    if (n > kMaxElements / d) return kMaxElements + 1;
    n *= d;
  }
  return n;
}

Filled fill(Bytes& in, DType dtype, const std::vector<std::int64_t>& shape, bool is_mask) {
  Filled f;
  const std::int64_t n = numel_or_max(shape);
  if (n < 0 || n > kMaxElements) return f;
  try {
    f.array = sdpa::Array(dtype, shape);
  } catch (const sdpa::Error&) {
    return f;  // empty, but its other dimensions overflow: attention must refuse it too
  }
  f.allocated = true;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint8_t b = in.empty() ? static_cast<std::uint8_t>((i * 37 + 11) % 240) : in.next();
    bool special = false;
    double x;
    if (dtype == DType::boolean) {
      f.array.data_as<std::uint8_t>()[i] = b & 1;
      continue;
    }
    if (is_mask && b >= 160 && b < 240) {
      x = -std::numeric_limits<double>::infinity();  // masked out: common on purpose
    } else {
      x = entry(b, &special);
    }
    if (dtype == DType::float32) {
      f.array.data_as<float>()[i] = static_cast<float>(x);
      x = f.array.data_as<float>()[i];
    } else {
      f.array.data_as<double>()[i] = x;
    }
    const bool masked_out = is_mask && x == -std::numeric_limits<double>::infinity();
    if (!masked_out) {
      if (!std::isfinite(x)) f.finite = false;
      if (special) f.moderate = false;
      if (std::isfinite(x)) f.max_abs = std::max(f.max_abs, std::fabs(x));
    }
  }
  return f;
}

double value_at(const sdpa::Array& a, std::int64_t i) {
  return a.dtype() == DType::float32 ? a.data_as<float>()[i] : a.data_as<double>()[i];
}

// A dimension chosen by one byte: small sizes (0..7) almost always.
std::int64_t small_dim(Bytes& in) {
  const std::uint8_t b = in.next();
  return b < 240 ? b % 8 : 1 + (b - 240) * 3;  // up to 46 on rare bytes
}

std::int64_t corrupt(std::int64_t d, std::uint8_t how) {
  switch (how % 8) {
    case 0:
      return 0;
    case 1:
      return d + 1;
    case 2:
      return d > 0 ? d - 1 : 1;
    case 3:
      return -1;
    case 4:
      return std::int64_t{1} << 31;
    case 5:
      return std::int64_t{1} << 40;
    case 6:
      return std::numeric_limits<std::int64_t>::max();
    default:
      return 1;
  }
}

// Bound on |out_impl - out_ref| for one problem, from float32 rounding (u = 2^-24):
//   scores: a dot product of length E has |error| <= E u sum|q_e k_e| (times |scale|);
//   each probability then has relative error <= 2 * score error + 16 u (exp within a few ulp,
//   the max subtraction and the final division) + S u (the sum over S keys);
//   out = sum p v adds (S + 2) u of relative rounding, and |sum p v| <= max|v|.
// Twice that, as FlashAttention's tests allow twice the error of a plain float32 computation.
double differential_bound(double scale, std::int64_t E, std::int64_t S, double max_q, double max_k,
                          double max_v) {
  const double u = std::ldexp(1.0, -24);
  const double score_error = E * u * std::fabs(scale) * E * max_q * max_k;
  const double relative = 2 * score_error + (2.0 * S + 18) * u;
  return 2 * relative * max_v + std::numeric_limits<float>::min();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const std::uint8_t flags = in.next();
  const std::uint8_t flags2 = in.next();
  const DType dtype = (flags & 1) ? DType::float64 : DType::float32;
  sdpa::AttentionOptions options;
  options.impl = static_cast<sdpa::Impl>(((flags >> 1) & 3) % 3);
  options.causal = static_cast<sdpa::Causal>(((flags >> 3) & 3) % 3);
  options.enable_gqa = (flags >> 5) & 1;
  const bool has_mask = (flags >> 6) & 1;
  const bool want_lse = (flags >> 7) & 1;
  const std::size_t rank = 2 + flags2 % 4;
  const DType mask_dtype =
      std::array{DType::boolean, DType::float32, DType::float64, DType::boolean}[(flags2 >> 2) & 3];
  switch ((flags2 >> 4) & 7) {
    case 0:
    case 1:
      break;  // default 1/sqrt(E)
    case 2: {
      bool special = false;
      options.scale = entry(in.next(), &special);
      break;
    }
    case 3:
      options.scale = in.raw_double();
      break;
    case 4:
      options.scale = 0.0;
      break;
    case 5:
      options.scale = 1e200;
      break;
    default:
      options.scale = (in.next() - 128) / 32.0;
      break;
  }
  {
    static constexpr int kThreads[] = {1, 2, 0, 3, -1, 1025, std::numeric_limits<int>::min(), 1};
    options.threads = (flags2 >> 7) ? kThreads[in.next() % 8] : 1;
  }

  // A consistent problem first.
  std::vector<std::int64_t> lead;
  for (std::size_t i = 3; i < rank; ++i) lead.push_back(1 + small_dim(in) % 3);
  std::int64_t Hkv = small_dim(in) % 4;
  std::int64_t Hq = options.enable_gqa ? Hkv * (1 + in.next() % 3) : Hkv;
  if (rank == 2) Hq = Hkv = 1;
  const std::int64_t L = small_dim(in), S = small_dim(in), E = small_dim(in), Ev = small_dim(in);
  auto shape = [&](std::int64_t h, std::int64_t n, std::int64_t e) {
    std::vector<std::int64_t> s = lead;
    if (rank >= 3) s.push_back(h);
    s.push_back(n);
    s.push_back(e);
    return s;
  };
  std::vector<std::int64_t> qs = shape(Hq, L, E), ks = shape(Hkv, S, E), vs = shape(Hkv, S, Ev);
  // Then, sometimes, one corrupted dimension.
  const std::uint8_t c = in.next();
  if (c >= 192) {
    std::vector<std::int64_t>* victim = (c % 3 == 0) ? &qs : (c % 3 == 1) ? &ks : &vs;
    const std::size_t at = (c / 3) % rank;
    (*victim)[at] = corrupt((*victim)[at], in.next());
  }
  // The mask: each dimension of (..., Hq, L, S) kept, broadcast (1), or wrong; maybe fewer dims.
  std::vector<std::int64_t> ms;
  if (has_mask) {
    std::vector<std::int64_t> target(qs.begin(), qs.end() - 1);
    target.push_back(ks.size() >= 2 ? ks[ks.size() - 2] : 0);
    const std::uint8_t drop = in.next() % (target.size() + 1);
    for (std::size_t i = drop; i < target.size(); ++i) {
      const std::uint8_t how = in.next();
      // A wrong size: one or two more, or (near the int64 limit, where adding overflows) less.
      const std::int64_t wrong = target[i] < std::numeric_limits<std::int64_t>::max() - 2
                                     ? target[i] + 1 + how % 2
                                     : target[i] - 2;
      ms.push_back(how < 150 ? target[i] : how < 250 ? 1 : wrong);
    }
  }

  Filled q = fill(in, dtype, qs, false), k = fill(in, dtype, ks, false),
         v = fill(in, dtype, vs, false);
  Filled m;
  if (has_mask) m = fill(in, mask_dtype, ms, true);

  auto ref_of = [](const Filled& f, DType dt, const std::vector<std::int64_t>& s) {
    return sdpa::TensorRef{f.allocated ? f.array.data() : nullptr, dt, s};
  };
  const sdpa::TensorRef qr = ref_of(q, dtype, qs), kr = ref_of(k, dtype, ks),
                        vr = ref_of(v, dtype, vs), mr = ref_of(m, mask_dtype, ms);

  std::vector<std::int64_t> os = qs;
  os.back() = vs.back();
  std::vector<std::int64_t> ls(qs.begin(), qs.end() - 1);
  const std::int64_t on = numel_or_max(os), ln = numel_or_max(ls);
  sdpa::Array out, lse;
  try {
    if (on >= 0 && on <= kMaxElements) out = sdpa::Array(dtype, os);
    if (ln >= 0 && ln <= kMaxElements) lse = sdpa::Array(dtype, ls);
  } catch (const sdpa::Error&) {
    // as in fill(): left unallocated, so attention_forward must refuse the call
  }
  const sdpa::MutableTensorRef outr{out.numel() > 0 ? out.data() : nullptr, dtype, os};
  const sdpa::MutableTensorRef lser{lse.numel() > 0 ? lse.data() : nullptr, dtype, ls};
  try {
    sdpa::attention_forward(qr, kr, vr, has_mask ? &mr : nullptr, options, outr,
                            want_lse ? &lser : nullptr);
  } catch (const sdpa::Error&) {
    return 0;
  }
  // Accepted: every tensor was real (null data only for empty tensors).
  const bool mask_finite = !has_mask || m.finite;
  const double max_q = q.max_abs, max_k = k.max_abs, max_v = v.max_abs;
  const double scale = options.scale.value_or(E > 0 ? 1.0 / std::sqrt(double(E)) : 1.0);
  const bool tame = q.finite && k.finite && v.finite && mask_finite &&
                    std::fabs(scale) * double(E) * max_q * max_k < 1e300;
  if (!tame) return 0;
  const double u = std::ldexp(1.0, -24);
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    const double x = value_at(out, i);
    if (!std::isfinite(x)) fail("non-finite out at flat index " + std::to_string(i));
    if (std::fabs(x) > max_v * (1 + (vs.back() + S + 8) * u)) {
      fail("out outside the range of value at flat index " + std::to_string(i));
    }
  }
  if (want_lse) {
    for (std::int64_t i = 0; i < lse.numel(); ++i) {
      if (std::isnan(value_at(lse, i))) fail("NaN lse at flat index " + std::to_string(i));
    }
  }
  // The backward from this forward's out and lse, when every exact gradient is far inside
  // float32's range (bounds as in src/kernels/range.cpp: |dP|, |D| <= Ev max|dO| max|v|, dQ sums
  // S terms of scale dS k, dK and dV sum the rows of every query head of the group, with the
  // scale or without it): then every gradient must come out finite.
  if (want_lse && out.numel() > 0) {
    Filled g = fill(in, dtype, os, false);
    // The query rows come from q's accepted shape, not from L: a corrupted dimension may have
    // changed q's row count, which the forward accepts because nothing else depends on it.
    const std::int64_t group = rank >= 3 && ks[rank - 3] > 0 ? qs[rank - 3] / ks[rank - 3] : 1;
    const double sc = std::max(std::fabs(scale), 1.0), rows = double(qs[rank - 2]) * double(group);
    const double ds = 2.0 * double(vs.back()) * g.max_abs * max_v;
    const bool small = g.allocated && g.finite && sc * double(S) * ds * max_k < 1e30 &&
                       sc * rows * ds * max_q < 1e30 && rows * g.max_abs < 1e30 && ds < 1e30;
    if (small) {
      sdpa::Array dq(dtype, qs), dk(dtype, ks), dv(dtype, vs);
      try {
        sdpa::attention_backward(qr, kr, vr, has_mask ? &mr : nullptr, out, lse, g.array, options,
                                 dq.mut(), dk.mut(), dv.mut());
      } catch (const sdpa::Error& e) {
        fail(std::string("backward refused what forward accepted: ") + e.what());
      }
      for (const auto* a : {&dq, &dk, &dv}) {
        for (std::int64_t i = 0; i < a->numel(); ++i) {
          if (!std::isfinite(value_at(*a, i))) {
            fail(std::string("non-finite ") +
                 (a == &dq   ? "dq"
                  : a == &dk ? "dk"
                             : "dv") +
                 " at flat index " + std::to_string(i));
          }
        }
      }
    }
  }
  // Differential check against the reference for moderate inputs.
  const bool moderate = q.moderate && k.moderate && v.moderate && (!has_mask || m.moderate);
  if (!moderate || options.impl == sdpa::Impl::reference || out.numel() == 0) return 0;
  sdpa::AttentionOptions ref_options = options;
  ref_options.impl = sdpa::Impl::reference;
  sdpa::Array ref_out(dtype, os);
  const sdpa::MutableTensorRef ref_outr{ref_out.data(), dtype, os};
  sdpa::attention_forward(qr, kr, vr, has_mask ? &mr : nullptr, ref_options, ref_outr);
  const double bound = differential_bound(scale, E, S, max_q, max_k, max_v);
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    const double d = std::fabs(value_at(out, i) - value_at(ref_out, i));
    if (!(d <= bound)) {
      fail(std::string(sdpa::impl_name(options.impl)) + " differs from the reference by " +
           std::to_string(d) + " > bound " + std::to_string(bound) + " at flat index " +
           std::to_string(i));
    }
  }
  return 0;
}
