// The fused, decode and naive kernels read and write strided operands in place, on every
// compiled SIMD target:
//   - (B, H, L, E) views with padded rows, (B, L, H, E) views, slices of a packed (B, L, 3, H, E)
//     QKV projection and broadcast (stride 0) key/value heads, as inputs;
//   - out, lse and the gradients written into strided tensors, grad_out read from one;
// forward and backward, float32 and float64. Each strided call gives bit for bit what the same
// call on contiguous copies gives (same kernel, same arithmetic), lies within the accuracy
// contract's 2e-5 of the largest magnitude from the float64 reference on those copies, gives the
// same bits for 1 and 3 threads, and makes no copy (core/layout.h's counter stays put). Leading
// batch dimensions that do not flatten into one stride are the one case that is copied.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/layout.h"
#include "core/problem.h"
#include "hwy/highway.h"
#include "kernels/decode.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::AttentionOptions;
using sdpa::Causal;
using sdpa::DType;
using sdpa::Impl;
using sdpa::MutableTensorRef;
using sdpa::TensorRef;
using std::int64_t;

enum class Layout { bhle_padded, blhe, broadcast_heads };

// A rank-4 (B, H, N, W) tensor stored somewhere in `buf` with explicit strides.
template <class T>
struct View {
  std::shared_ptr<std::vector<T>> buf;
  int64_t offset = 0;
  std::vector<int64_t> shape, strides;

  T& at(int64_t a, int64_t b, int64_t c, int64_t d) const {
    return (*buf)[static_cast<std::size_t>(offset + a * strides[0] + b * strides[1] +
                                           c * strides[2] + d * strides[3])];
  }
  TensorRef ref() const { return TensorRef{buf->data() + offset, dtype(), shape, strides}; }
  MutableTensorRef mut() const {
    return MutableTensorRef{buf->data() + offset, dtype(), shape, strides};
  }
  static DType dtype() { return sizeof(T) == 4 ? DType::float32 : DType::float64; }
  int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  // The elements in C order.
  std::vector<T> gather() const {
    std::vector<T> out;
    out.reserve(static_cast<std::size_t>(numel()));
    for (int64_t a = 0; a < shape[0]; ++a)
      for (int64_t b = 0; b < shape[1]; ++b)
        for (int64_t c = 0; c < shape[2]; ++c)
          for (int64_t d = 0; d < shape[3]; ++d) out.push_back(at(a, b, c, d));
    return out;
  }
};

template <class T>
View<T> make_view(Layout layout, int64_t B, int64_t H, int64_t N, int64_t W) {
  View<T> v;
  v.shape = {B, H, N, W};
  switch (layout) {
    case Layout::bhle_padded: {  // rows of W + 5 elements, of which the view takes W
      const int64_t ld = W + 5;
      v.strides = {H * N * ld, N * ld, ld, 1};
      v.buf = std::make_shared<std::vector<T>>(static_cast<std::size_t>(B * H * N * ld), T(-9));
      break;
    }
    case Layout::blhe:
      v.strides = {N * H * W, W, H * W, 1};
      v.buf = std::make_shared<std::vector<T>>(static_cast<std::size_t>(B * N * H * W), T(-9));
      break;
    case Layout::broadcast_heads:
      v.strides = {N * W, 0, W, 1};
      v.buf = std::make_shared<std::vector<T>>(static_cast<std::size_t>(B * N * W), T(-9));
      break;
  }
  return v;
}

template <class T>
void fill(View<T>& v, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n;
  // Writes through the view; a broadcast element is written once per index, the last wins.
  for (int64_t a = 0; a < v.shape[0]; ++a)
    for (int64_t b = 0; b < v.shape[1]; ++b)
      for (int64_t c = 0; c < v.shape[2]; ++c)
        for (int64_t d = 0; d < v.shape[3]; ++d) v.at(a, b, c, d) = static_cast<T>(n(rng));
}

// A C-contiguous tensor.
template <class T>
View<T> contiguous(int64_t B, int64_t H, int64_t N, int64_t W) {
  View<T> v;
  v.shape = {B, H, N, W};
  v.strides = {H * N * W, N * W, W, 1};
  v.buf = std::make_shared<std::vector<T>>(static_cast<std::size_t>(B * H * N * W), T(0));
  return v;
}
template <class T>
View<T> contiguous_copy(const View<T>& src) {
  View<T> v = contiguous<T>(src.shape[0], src.shape[1], src.shape[2], src.shape[3]);
  *v.buf = src.gather();
  return v;
}
std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }
std::vector<double> to_double(const std::vector<double>& x) { return x; }

// lse (B, H, L) seen as a rank-4 (B, H, L, 1) tensor for the helpers; `ref3` drops that last 1.
template <class T>
TensorRef ref3(const View<T>& v) {
  return TensorRef{v.buf->data() + v.offset,
                   View<T>::dtype(),
                   {v.shape[0], v.shape[1], v.shape[2]},
                   {v.strides[0], v.strides[1], v.strides[2]}};
}
template <class T>
MutableTensorRef mut3(const View<T>& v) {
  return MutableTensorRef{v.buf->data() + v.offset,
                          View<T>::dtype(),
                          {v.shape[0], v.shape[1], v.shape[2]},
                          {v.strides[0], v.strides[1], v.strides[2]}};
}
// lse stored inside a (B, H + 1, L + 3) buffer: head and row strides of its own.
template <class T>
View<T> strided_lse(int64_t B, int64_t H, int64_t L) {
  View<T> v;
  v.shape = {B, H, L, 1};
  v.strides = {(H + 1) * (L + 3), L + 3, 1, 1};
  v.offset = 2;
  v.buf =
      std::make_shared<std::vector<T>>(static_cast<std::size_t>(B * (H + 1) * (L + 3) + 2), T(-9));
  return v;
}

struct Inputs {
  int64_t B, Hq, Hkv, L, S, E, Ev;
};

// Largest |a - b| against the largest |b|.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - want[i]));
    if (std::isnan(got[i]) != std::isnan(want[i])) worst = INFINITY;
    scale = std::max(scale, std::fabs(want[i]));
  }
  EXPECT_LE(worst, rel * std::max(scale, 1e-30))
      << what << " (largest |reference| " << scale << ")";
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// One forward and backward with strided q, k, v (layouts lq, lk for k and v), strided outputs
// and gradients, against contiguous copies and the float64 reference.
template <class T>
void check_strided(const Inputs& s, Layout lq, Layout lkv, Impl impl, Causal causal,
                   const std::string& name) {
  SCOPED_TRACE(name);
  View<T> q = make_view<T>(lq, s.B, s.Hq, s.L, s.E);
  View<T> k = make_view<T>(lkv, s.B, s.Hkv, s.S, s.E);
  View<T> v = make_view<T>(lkv, s.B, s.Hkv, s.S, s.Ev);
  fill(q, 11);
  fill(k, 12);
  fill(v, 13);
  AttentionOptions o;
  o.impl = impl;
  o.causal = causal;
  o.enable_gqa = s.Hq != s.Hkv;
  o.threads = 3;
  const View<T> qc = contiguous_copy(q), kc = contiguous_copy(k), vc = contiguous_copy(v);

  // Forward: out (B, L, H, Ev)-strided, lse strided; against the same call on copies.
  View<T> out = make_view<T>(Layout::blhe, s.B, s.Hq, s.L, s.Ev);
  View<T> lse = strided_lse<T>(s.B, s.Hq, s.L);
  View<T> out_c = contiguous<T>(s.B, s.Hq, s.L, s.Ev), lse_c = contiguous<T>(s.B, s.Hq, s.L, 1);
  const MutableTensorRef lse_m = mut3(lse), lse_cm = mut3(lse_c);
  const std::int64_t copies = sdpa::detail::layout_copies();
  sdpa::attention_forward(q.ref(), k.ref(), v.ref(), nullptr, o, out.mut(), &lse_m);
  EXPECT_EQ(sdpa::detail::layout_copies(), copies) << "the strided forward made a copy";
  sdpa::attention_forward(qc.ref(), kc.ref(), vc.ref(), nullptr, o, out_c.mut(), &lse_cm);
  if (impl == Impl::fast) {
    EXPECT_TRUE(same_bits(out.gather(), *out_c.buf)) << "out differs from the contiguous call's";
    EXPECT_TRUE(same_bits(lse.gather(), *lse_c.buf)) << "lse differs from the contiguous call's";
  }

  // The oracle: the float64 reference on float64 copies.
  auto f64 = [](const View<T>& x) {
    View<double> y = contiguous<double>(x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    *y.buf = to_double(x.gather());
    return y;
  };
  const View<double> q64 = f64(q), k64 = f64(k), v64 = f64(v);
  AttentionOptions r = o;
  r.impl = Impl::reference;
  View<double> out_r = contiguous<double>(s.B, s.Hq, s.L, s.Ev);
  View<double> lse_r = contiguous<double>(s.B, s.Hq, s.L, 1);
  const MutableTensorRef lse_rm = mut3(lse_r);
  sdpa::attention_forward(q64.ref(), k64.ref(), v64.ref(), nullptr, r, out_r.mut(), &lse_rm);
  // Naive float32 materialises L x S in float32 with BLAS: its error is looser than the fused
  // kernel's contract (the contract is 2 x naive's error); 1e-4 bounds it on these shapes.
  const double rel = sizeof(T) == 8 ? 1e-12 : (impl == Impl::fast ? 2e-5 : 1e-4);
  expect_close(to_double(out.gather()), *out_r.buf, rel, "out");
  expect_close(to_double(lse.gather()), *lse_r.buf, rel, "lse");

  // Backward: grad_out read from a padded (B, H, L, Ev) view; dq (B, L, H, E)-strided, dk and
  // dv as slices of one packed (B, S, 2, Hkv, E) buffer when E == Ev, else (B, S, H, E) views.
  View<T> g = make_view<T>(Layout::bhle_padded, s.B, s.Hq, s.L, s.Ev);
  fill(g, 14);
  const View<T> gc = contiguous_copy(g);
  View<T> dq = make_view<T>(Layout::blhe, s.B, s.Hq, s.L, s.E);
  View<T> dk = make_view<T>(Layout::blhe, s.B, s.Hkv, s.S, s.E);
  View<T> dv = make_view<T>(Layout::blhe, s.B, s.Hkv, s.S, s.Ev);
  if (s.E == s.Ev) {
    auto packed = std::make_shared<std::vector<T>>(
        static_cast<std::size_t>(s.B * s.S * 2 * s.Hkv * s.E), T(-9));
    for (View<T>* d : {&dk, &dv}) {
      d->buf = packed;
      d->strides = {s.S * 2 * s.Hkv * s.E, s.E, 2 * s.Hkv * s.E, 1};
    }
    dv.offset = s.Hkv * s.E;
  }
  View<T> dq_c = contiguous<T>(s.B, s.Hq, s.L, s.E), dk_c = contiguous<T>(s.B, s.Hkv, s.S, s.E),
          dv_c = contiguous<T>(s.B, s.Hkv, s.S, s.Ev);
  const std::int64_t before = sdpa::detail::layout_copies();
  sdpa::attention_backward(q.ref(), k.ref(), v.ref(), nullptr, out.ref(), ref3(lse), g.ref(), o,
                           dq.mut(), dk.mut(), dv.mut());
  EXPECT_EQ(sdpa::detail::layout_copies(), before) << "the strided backward made a copy";
  sdpa::attention_backward(qc.ref(), kc.ref(), vc.ref(), nullptr, out_c.ref(), ref3(lse_c),
                           gc.ref(), o, dq_c.mut(), dk_c.mut(), dv_c.mut());
  if (impl == Impl::fast) {
    EXPECT_TRUE(same_bits(dq.gather(), *dq_c.buf)) << "dq differs from the contiguous call's";
    EXPECT_TRUE(same_bits(dk.gather(), *dk_c.buf)) << "dk differs from the contiguous call's";
    EXPECT_TRUE(same_bits(dv.gather(), *dv_c.buf)) << "dv differs from the contiguous call's";
    // Any thread count gives the same bits through the strides too.
    AttentionOptions one = o;
    one.threads = 1;
    View<T> dq1 = make_view<T>(Layout::blhe, s.B, s.Hq, s.L, s.E);
    View<T> dk1 = make_view<T>(Layout::blhe, s.B, s.Hkv, s.S, s.E);
    View<T> dv1 = make_view<T>(Layout::blhe, s.B, s.Hkv, s.S, s.Ev);
    sdpa::attention_backward(q.ref(), k.ref(), v.ref(), nullptr, out.ref(), ref3(lse), g.ref(), one,
                             dq1.mut(), dk1.mut(), dv1.mut());
    EXPECT_TRUE(same_bits(dq1.gather(), dq.gather())) << "dq: 1 thread differs from 3";
    EXPECT_TRUE(same_bits(dk1.gather(), dk.gather())) << "dk: 1 thread differs from 3";
    EXPECT_TRUE(same_bits(dv1.gather(), dv.gather())) << "dv: 1 thread differs from 3";
  }
  const View<double> g64 = f64(g);
  View<double> dq_r = contiguous<double>(s.B, s.Hq, s.L, s.E),
               dk_r = contiguous<double>(s.B, s.Hkv, s.S, s.E),
               dv_r = contiguous<double>(s.B, s.Hkv, s.S, s.Ev);
  sdpa::attention_backward(q64.ref(), k64.ref(), v64.ref(), nullptr, out_r.ref(), ref3(lse_r),
                           g64.ref(), r, dq_r.mut(), dk_r.mut(), dv_r.mut());
  const double grel = sizeof(T) == 8 ? 1e-11 : (impl == Impl::fast ? 2e-5 : 1e-4);
  expect_close(to_double(dq.gather()), *dq_r.buf, grel, "dq");
  expect_close(to_double(dk.gather()), *dk_r.buf, grel, "dk");
  expect_close(to_double(dv.gather()), *dv_r.buf, grel, "dv");
}

// Slices of one packed (B, L, 3, H, E) projection, as q, k and v; L = S, E = Ev.
template <class T>
void check_packed_qkv(int64_t B, int64_t H, int64_t N, int64_t E, Causal causal) {
  SCOPED_TRACE("packed qkv");
  auto buf = std::make_shared<std::vector<T>>(static_cast<std::size_t>(B * N * 3 * H * E));
  std::mt19937_64 rng(21);
  std::normal_distribution<double> n;
  for (auto& x : *buf) x = static_cast<T>(n(rng));
  View<T> slot[3];
  for (int i = 0; i < 3; ++i) {
    slot[i].buf = buf;
    slot[i].offset = i * H * E;
    slot[i].shape = {B, H, N, E};
    slot[i].strides = {N * 3 * H * E, E, 3 * H * E, 1};
  }
  const View<T> qc = contiguous_copy(slot[0]), kc = contiguous_copy(slot[1]),
                vc = contiguous_copy(slot[2]);
  AttentionOptions o;
  o.causal = causal;
  o.threads = 2;
  View<T> out = contiguous<T>(B, H, N, E), out_c = contiguous<T>(B, H, N, E);
  View<T> lse = contiguous<T>(B, H, N, 1), lse_c = contiguous<T>(B, H, N, 1);
  const MutableTensorRef lse_m = mut3(lse), lse_cm = mut3(lse_c);
  const std::int64_t copies = sdpa::detail::layout_copies();
  sdpa::attention_forward(slot[0].ref(), slot[1].ref(), slot[2].ref(), nullptr, o, out.mut(),
                          &lse_m);
  EXPECT_EQ(sdpa::detail::layout_copies(), copies) << "the packed forward made a copy";
  sdpa::attention_forward(qc.ref(), kc.ref(), vc.ref(), nullptr, o, out_c.mut(), &lse_cm);
  EXPECT_TRUE(same_bits(*out.buf, *out_c.buf));
  EXPECT_TRUE(same_bits(*lse.buf, *lse_c.buf));
  // Gradients into one packed buffer, as the projection's gradient would be.
  auto gbuf = std::make_shared<std::vector<T>>(buf->size(), T(-9));
  View<T> grad[3];
  for (int i = 0; i < 3; ++i) {
    grad[i] = slot[i];
    grad[i].buf = gbuf;
  }
  View<T> g = contiguous<T>(B, H, N, E);
  fill(g, 22);
  View<T> dq_c = contiguous<T>(B, H, N, E), dk_c = contiguous<T>(B, H, N, E),
          dv_c = contiguous<T>(B, H, N, E);
  const std::int64_t before = sdpa::detail::layout_copies();
  sdpa::attention_backward(slot[0].ref(), slot[1].ref(), slot[2].ref(), nullptr, out.ref(),
                           ref3(lse), g.ref(), o, grad[0].mut(), grad[1].mut(), grad[2].mut());
  EXPECT_EQ(sdpa::detail::layout_copies(), before) << "the packed backward made a copy";
  sdpa::attention_backward(qc.ref(), kc.ref(), vc.ref(), nullptr, out_c.ref(), ref3(lse_c), g.ref(),
                           o, dq_c.mut(), dk_c.mut(), dv_c.mut());
  EXPECT_TRUE(same_bits(grad[0].gather(), *dq_c.buf)) << "dq";
  EXPECT_TRUE(same_bits(grad[1].gather(), *dk_c.buf)) << "dk";
  EXPECT_TRUE(same_bits(grad[2].gather(), *dv_c.buf)) << "dv";
}

// 70 query rows (a full and a short query tile), 135 keys (a full and a short key tile).
// E = 32 float32 rows are 128 bytes: K, V and dO are used in place by the products; E = 24 and
// Ev = 40 take the padded copies instead.
TEST(StridedKernels, EveryCompiledTarget) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    check_strided<float>({2, 4, 4, 70, 135, 32, 32}, Layout::blhe, Layout::blhe, Impl::fast,
                         Causal::upper_left, "blhe, in place");
    check_strided<float>({2, 4, 2, 70, 135, 24, 40}, Layout::bhle_padded, Layout::bhle_padded,
                         Impl::fast, Causal::lower_right, "bhle padded rows, gqa, padded copies");
    check_strided<float>({1, 4, 4, 70, 135, 32, 32}, Layout::blhe, Layout::broadcast_heads,
                         Impl::fast, Causal::none, "broadcast kv heads");
    check_strided<double>({2, 2, 1, 67, 70, 9, 16}, Layout::blhe, Layout::blhe, Impl::fast,
                          Causal::upper_left, "float64, gqa");
    check_packed_qkv<float>(2, 3, 70, 32, Causal::upper_left);
    // Decode-sized queries (L <= 16) take the decode kernel in the forward: its direct path
    // (E a multiple of the lanes, Ev of 64 floats on every target) and its packed one. The
    // direct path in both key orders (decode.h, DecodeKeyOrder): a (B, S, H, E) view and its
    // head-major copy take the same order (16 tiles a group at Hkv 2, E 64, and 2 at Hkv 8,
    // E 128), with 16 sequences too, where the view's items hold every kv head.
    for (auto order : {sdpa::detail::DecodeKeyOrder::memory, sdpa::detail::DecodeKeyOrder::page}) {
      sdpa::detail::set_decode_key_order(order);
      check_strided<float>({2, 8, 2, 1, 300, 64, 64}, Layout::blhe, Layout::blhe, Impl::fast,
                           Causal::lower_right, "decode, direct, gqa");
      check_strided<float>({16, 8, 2, 1, 300, 64, 64}, Layout::blhe, Layout::blhe, Impl::fast,
                           Causal::none, "decode, direct, gqa, 16 sequences");
      check_strided<float>({16, 32, 8, 2, 70, 128, 128}, Layout::blhe, Layout::blhe, Impl::fast,
                           Causal::lower_right, "decode, direct, 8 kv heads, 16 sequences");
    }
    sdpa::detail::set_decode_key_order(sdpa::detail::DecodeKeyOrder::automatic);
    check_strided<float>({2, 4, 4, 5, 135, 24, 40}, Layout::bhle_padded, Layout::bhle_padded,
                         Impl::fast, Causal::upper_left, "decode, packed, padded rows");
    check_strided<float>({1, 4, 4, 3, 200, 64, 64}, Layout::blhe, Layout::broadcast_heads,
                         Impl::fast, Causal::none, "decode, broadcast kv heads");
    check_strided<double>({2, 2, 1, 4, 70, 16, 32}, Layout::blhe, Layout::blhe, Impl::fast,
                          Causal::upper_left, "decode, float64, gqa");
    // Every plan of the backward (two passes; one chunk per kv head; three chunks) on strides.
    for (int chunks : {0, 1, 3}) {
      sdpa::detail::set_backward_chunks_for_test(chunks);
      check_strided<float>({1, 2, 2, 150, 300, 16, 24}, Layout::blhe, Layout::bhle_padded,
                           Impl::fast, Causal::upper_left,
                           "backward plan " + std::to_string(chunks));
    }
    sdpa::detail::set_backward_chunks_for_test(-1);
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(StridedKernels, NaiveReadsStridesInPlace) {
  check_strided<float>({2, 4, 2, 40, 50, 24, 16}, Layout::blhe, Layout::bhle_padded, Impl::naive,
                       Causal::upper_left, "naive");
  check_strided<float>({1, 4, 4, 40, 50, 16, 16}, Layout::bhle_padded, Layout::broadcast_heads,
                       Impl::naive, Causal::none, "naive, broadcast kv heads");
}

// Leading batch dimensions (B1, B2) stored transposed cannot be one batch stride: that input is
// the one that gets copied, and the result is still right.
TEST(StridedKernels, UnflattenableBatchIsCopied) {
  constexpr int64_t B1 = 2, B2 = 3, H = 2, L = 33, E = 16;
  std::vector<float> q(B1 * B2 * H * L * E), k(q.size()), v(q.size());
  std::mt19937_64 rng(5);
  std::normal_distribution<float> n;
  for (auto* x : {&q, &k, &v})
    for (auto& y : *x) y = n(rng);
  // q stored as (B2, B1, H, L, E) and viewed as (B1, B2, H, L, E).
  const TensorRef qt{
      q.data(), DType::float32, {B1, B2, H, L, E}, {H * L * E, B1 * H * L * E, L * E, E, 1}};
  std::vector<float> qc(q.size());
  for (int64_t a = 0; a < B1; ++a)
    for (int64_t b = 0; b < B2; ++b)
      std::copy_n(q.begin() + (b * B1 + a) * H * L * E, H * L * E,
                  qc.begin() + (a * B2 + b) * H * L * E);
  const TensorRef kr{k.data(), DType::float32, {B1, B2, H, L, E}},
      vr{v.data(), DType::float32, {B1, B2, H, L, E}};
  std::vector<float> out(q.size()), out_c(q.size());
  AttentionOptions o;
  o.threads = 2;
  const std::int64_t before = sdpa::detail::layout_copies();
  sdpa::attention_forward(qt, kr, vr, nullptr, o,
                          MutableTensorRef{out.data(), DType::float32, {B1, B2, H, L, E}});
  EXPECT_EQ(sdpa::detail::layout_copies(), before + 1) << "exactly the query is copied";
  sdpa::attention_forward(TensorRef{qc.data(), DType::float32, {B1, B2, H, L, E}}, kr, vr, nullptr,
                          o, MutableTensorRef{out_c.data(), DType::float32, {B1, B2, H, L, E}});
  EXPECT_TRUE(same_bits(out, out_c));
}

}  // namespace

// for_each_run (the range guard's reader) visits exactly the elements of a view, each once per
// index, whatever the strides: C order and permuted dense blocks in one run, padded rows and
// broadcast heads in pieces. The multiset of visited offsets is compared with the view's own.
TEST(StridedKernels, RunsCoverEveryElementOfAView) {
  struct Case {
    const char* name;
    int64_t B, H, L, W, sb, sh, sl;
    bool one_run;
  };
  constexpr int64_t B = 2, H = 3, L = 5, W = 4;
  const Case cases[] = {
      {"C order", B, H, L, W, H * L * W, L * W, W, true},
      {"(B, L, H, W) read as (B, H, L, W)", B, H, L, W, L * H * W, W, H * W, true},
      {"(H, B, L, W) read as (B, H, L, W)", B, H, L, W, L * W, B * L * W, W, true},
      {"(L, H, B, W) read as (B, H, L, W)", B, H, L, W, W, B * W, H * B * W, true},
      {"padded rows", B, H, L, W, H * L * (W + 3), L * (W + 3), W + 3, false},
      {"broadcast heads", B, H, L, W, L * W, 0, W, false},
      {"one head, odd head stride", B, 1, L, W, L * W, 999, W, true},
      {"same stride twice", B, H, L, W, W, W, H * W, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<float> buf(1000);
    sdpa::detail::InputView v;
    v.data = buf.data();
    v.sb = c.sb;
    v.sh = c.sh;
    v.sl = c.sl;
    EXPECT_EQ(sdpa::detail::dense_block(v, c.B, c.H, c.L, c.W), c.one_run);
    std::vector<int64_t> want, got;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t l = 0; l < c.L; ++l)
          for (int64_t e = 0; e < c.W; ++e) want.push_back(v.offset(b, h, l) + e);
    int runs = 0;
    sdpa::detail::for_each_run<float>(v, c.B, c.H, c.L, c.W, [&](const float* x, int64_t n) {
      ++runs;
      for (int64_t i = 0; i < n; ++i) got.push_back(x - buf.data() + i);
    });
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want);
    if (c.one_run) {
      EXPECT_EQ(runs, 1);
    }
  }
}

// A mask view: broadcast (stride 0) over huge batch and head dimensions from an (L, S) buffer of
// exactly L * S values, and the columns [0, S) of a wider buffer whose one large positive value
// lies inside the view but past its first L * S stored values. The range guard reads the view
// through its strides: the first call reads nothing past the buffer and equals the plain (L, S)
// mask's; the second sees the 1e37 (the call goes to the reference), where reading L * S
// contiguous values from the start would have missed it.
TEST(StridedKernels, RangeGuardReadsMasksThroughTheirStrides) {
  constexpr int64_t L = 20, S = 24, E = 8, B = 64, H = 64;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random = [&](int64_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = normal(rng);
    return x;
  };
  const std::vector<float> q = random(B * H * L * E), k = random(B * H * S * E),
                           v = random(B * H * S * E);
  const TensorRef qr{q.data(), DType::float32, {B, H, L, E}};
  const TensorRef kr{k.data(), DType::float32, {B, H, S, E}};
  const TensorRef vr{v.data(), DType::float32, {B, H, S, E}};
  AttentionOptions o;
  o.threads = 2;
  {
    const auto base = std::make_unique<float[]>(static_cast<std::size_t>(L * S));
    for (int64_t i = 0; i < L * S; ++i) base[static_cast<std::size_t>(i)] = normal(rng);
    const TensorRef broadcast{base.get(), DType::float32, {B, H, L, S}, {0, 0, S, 1}};
    const TensorRef plain{base.get(), DType::float32, {L, S}};
    std::vector<float> a(static_cast<std::size_t>(B * H * L * E)), b(a.size());
    sdpa::attention_forward(qr, kr, vr, &broadcast, o,
                            MutableTensorRef{a.data(), DType::float32, {B, H, L, E}});
    sdpa::attention_forward(qr, kr, vr, &plain, o,
                            MutableTensorRef{b.data(), DType::float32, {B, H, L, E}});
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
  {
    std::vector<float> wide(static_cast<std::size_t>(L * 2 * S), 0.0f);
    wide[static_cast<std::size_t>((L - 1) * 2 * S + S - 1)] = 1e37f;  // last row, last column
    const TensorRef view{wide.data(), DType::float32, {L, S}, {2 * S, 1}};
    const TensorRef q1{q.data(), DType::float32, {1, 1, L, E}};
    const TensorRef k1{k.data(), DType::float32, {1, 1, S, E}};
    const TensorRef v1{v.data(), DType::float32, {1, 1, S, E}};
    EXPECT_TRUE(
        sdpa::detail::float32_may_overflow(sdpa::detail::resolve_problem(q1, k1, v1, &view, o)));
    std::vector<float> out(static_cast<std::size_t>(L * E)), ref(out.size());
    sdpa::attention_forward(q1, k1, v1, &view, o,
                            MutableTensorRef{out.data(), DType::float32, {1, 1, L, E}});
    AttentionOptions r = o;
    r.impl = Impl::reference;
    sdpa::attention_forward(q1, k1, v1, &view, r,
                            MutableTensorRef{ref.data(), DType::float32, {1, 1, L, E}});
    EXPECT_EQ(std::memcmp(out.data(), ref.data(), out.size() * sizeof(float)), 0);
  }
}
