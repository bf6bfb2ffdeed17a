// The dtype rules of 16-bit inputs: which query/key/value dtypes go together, the dtypes of
// out, lse and the gradients, and the clear sdpa::Error (kind bad_type, naming the argument)
// for everything else.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/test_util.h"
#include "sdpa/array.h"
#include "sdpa/sdpa.h"

namespace {

using sdpa::Array;
using sdpa::DType;

constexpr DType kAll[] = {DType::float32, DType::float64, DType::float16, DType::bfloat16};

bool is16(DType d) { return d == DType::float16 || d == DType::bfloat16; }

/// The rule of docs/precision.md, written out independently of the library's code.
bool allowed(DType q, DType k, DType v) {
  if (q == k && k == v) return true;
  return k == v && is16(k) && (q == DType::float32 || q == DType::bfloat16);
}

std::string forward_error(DType qd, DType kd, DType vd, DType out_dtype, DType lse_dtype) {
  const Array q = sdpa::test::random_array(qd, {2, 5, 8}, 1);
  const Array k = sdpa::test::random_array(kd, {2, 7, 8}, 2);
  const Array v = sdpa::test::random_array(vd, {2, 7, 8}, 3);
  Array out(out_dtype, {2, 5, 8}), lse(lse_dtype, {2, 5});
  const sdpa::MutableTensorRef lref = lse.mut();
  try {
    sdpa::attention_forward(q, k, v, nullptr, {}, out.mut(), &lref);
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.kind(), sdpa::ErrorKind::bad_type) << e.what();
    return e.argument() + "|" + e.what();
  }
  return "";
}

TEST(HalfRules, EveryCombinationOfInputDtypes) {
  int accepted = 0;
  for (DType q : kAll) {
    for (DType k : kAll) {
      for (DType v : kAll) {
        const DType lse = is16(q) ? DType::float32 : q;
        const std::string err = forward_error(q, k, v, q, lse);
        const std::string what = std::string(sdpa::dtype_name(q)) + "/" + sdpa::dtype_name(k) +
                                 "/" + sdpa::dtype_name(v);
        if (allowed(q, k, v)) {
          EXPECT_EQ(err, "") << what;
          ++accepted;
        } else {
          EXPECT_EQ(err.substr(0, err.find('|')), "key/value") << what << ": " << err;
          EXPECT_NE(err.find("expected the query's dtype"), std::string::npos) << err;
        }
      }
    }
  }
  EXPECT_EQ(accepted, 4 + 3);  // four uniform, f32/bf16, f32/f16, bf16/f16
}

TEST(HalfRules, OutHasTheQuerysDtypeAndLseIsFloat32) {
  EXPECT_EQ(forward_error(DType::bfloat16, DType::bfloat16, DType::bfloat16, DType::bfloat16,
                          DType::float32),
            "");
  const std::string wrong_lse = forward_error(DType::bfloat16, DType::bfloat16, DType::bfloat16,
                                              DType::bfloat16, DType::bfloat16);
  EXPECT_EQ(wrong_lse.substr(0, 4), "lse|") << wrong_lse;
  EXPECT_NE(wrong_lse.find("expected dtype float32, got bfloat16"), std::string::npos);
  const std::string wrong_out =
      forward_error(DType::float16, DType::float16, DType::float16, DType::float32, DType::float32);
  EXPECT_EQ(wrong_out.substr(0, 4), "out|") << wrong_out;
  // A float32 query on a bfloat16 cache writes float32.
  EXPECT_EQ(forward_error(DType::float32, DType::bfloat16, DType::bfloat16, DType::float32,
                          DType::float32),
            "");
}

TEST(HalfRules, GradientsHaveTheirInputsDtypes) {
  const Array q = sdpa::test::random_array(DType::float32, {4, 8}, 1);
  const Array k = sdpa::test::random_array(DType::float16, {6, 8}, 2);
  const Array v = sdpa::test::random_array(DType::float16, {6, 8}, 3);
  const Array g = sdpa::test::random_array(DType::float32, {4, 8}, 4);
  Array out(DType::float32, {4, 8}), lse(DType::float32, {4});
  const sdpa::MutableTensorRef lref = lse.mut();
  sdpa::attention_forward(q, k, v, nullptr, {}, out.mut(), &lref);
  Array dq(DType::float32, {4, 8}), dk(DType::float16, {6, 8}), dv(DType::float16, {6, 8});
  sdpa::attention_backward(q, k, v, nullptr, out, lse, g, {}, dq.mut(), dk.mut(), dv.mut());
  EXPECT_TRUE(sdpa::test::all_finite(dk) && sdpa::test::max_abs(dk) > 0);
  Array dk32(DType::float32, {6, 8});
  try {
    sdpa::attention_backward(q, k, v, nullptr, out, lse, g, {}, dq.mut(), dk32.mut(), dv.mut());
    ADD_FAILURE() << "a float32 grad_key for a float16 key was accepted";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.argument(), "grad_key") << e.what();
    EXPECT_EQ(e.kind(), sdpa::ErrorKind::bad_type);
  }
}

TEST(HalfRules, SixteenBitMaskIsReadAsItsValues) {
  // An additive bfloat16 mask gives exactly what the same values in float32 give.
  const Array q = sdpa::test::random_array(DType::bfloat16, {2, 9, 8}, 1);
  const Array k = sdpa::test::random_array(DType::bfloat16, {2, 11, 8}, 2);
  const Array v = sdpa::test::random_array(DType::bfloat16, {2, 11, 8}, 3);
  const Array m16 = sdpa::test::random_array(DType::bfloat16, {9, 11}, 4);
  const Array m32 = m16.astype(DType::float32);
  for (const sdpa::Impl impl : {sdpa::Impl::fast, sdpa::Impl::naive, sdpa::Impl::reference}) {
    sdpa::AttentionOptions o;
    o.impl = impl;
    Array a(DType::bfloat16, {2, 9, 8}), b(DType::bfloat16, {2, 9, 8});
    const sdpa::TensorRef r16 = m16, r32 = m32;
    sdpa::attention_forward(q, k, v, &r16, o, a.mut());
    sdpa::attention_forward(q, k, v, &r32, o, b.mut());
    EXPECT_EQ(sdpa::test::max_abs_diff(a, b), 0.0) << sdpa::impl_name(impl);
  }
}

// A float32 query over a 16-bit cache under the naive baseline is the float32 naive on the
// cache's exact float32 values, range guard included: logits past float32's range are finite.
TEST(HalfRules, Float32QueryUnderNaiveIsTheFloat32BaselineWithItsRangeGuard) {
  Array q = sdpa::test::random_array(DType::float32, {2, 5, 8}, 1);
  for (std::int64_t i = 0; i < q.numel(); ++i) q.data_as<float>()[i] *= 1e30f;
  for (const DType kv : {DType::bfloat16, DType::float16}) {
    const Array k = sdpa::test::random_array(kv, {2, 7, 8}, 2);
    const Array v = sdpa::test::random_array(kv, {2, 7, 8}, 3);
    const Array k32 = k.astype(DType::float32), v32 = v.astype(DType::float32);
    sdpa::AttentionOptions o;
    o.impl = sdpa::Impl::naive;
    Array mixed(DType::float32, {2, 5, 8}), plain(DType::float32, {2, 5, 8});
    Array lse_mixed(DType::float32, {2, 5}), lse_plain(DType::float32, {2, 5});
    const sdpa::MutableTensorRef lm = lse_mixed.mut(), lp = lse_plain.mut();
    sdpa::attention_forward(q, k, v, nullptr, o, mixed.mut(), &lm);
    sdpa::attention_forward(q, k32, v32, nullptr, o, plain.mut(), &lp);
    EXPECT_TRUE(sdpa::test::all_finite(mixed)) << sdpa::dtype_name(kv);
    EXPECT_EQ(sdpa::test::max_abs_diff(mixed, plain), 0.0) << sdpa::dtype_name(kv);
    const Array g = sdpa::test::random_array(DType::float32, {2, 5, 8}, 4);
    Array dq(DType::float32, {2, 5, 8}), dk(kv, {2, 7, 8}), dv(kv, {2, 7, 8});
    Array dq32(DType::float32, {2, 5, 8}), dk32(DType::float32, {2, 7, 8}),
        dv32(DType::float32, {2, 7, 8});
    sdpa::attention_backward(q, k, v, nullptr, mixed, lse_mixed, g, o, dq.mut(), dk.mut(),
                             dv.mut());
    sdpa::attention_backward(q, k32, v32, nullptr, plain, lse_plain, g, o, dq32.mut(), dk32.mut(),
                             dv32.mut());
    EXPECT_TRUE(sdpa::test::all_finite(dq) && sdpa::test::all_finite(dk) &&
                sdpa::test::all_finite(dv))
        << sdpa::dtype_name(kv);
    EXPECT_EQ(sdpa::test::max_abs_diff(dq, dq32), 0.0) << sdpa::dtype_name(kv);
    EXPECT_EQ(sdpa::test::max_abs_diff(dv, dv32.astype(kv)), 0.0) << sdpa::dtype_name(kv);
  }
}

TEST(HalfRules, OtherDtypesStillRefusedNamingTheArgument) {
  const Array b = sdpa::test::random_array(DType::boolean, {5, 8}, 1);
  const Array h = sdpa::test::random_array(DType::float16, {5, 8}, 2);
  Array out(DType::float16, {5, 8});
  try {
    sdpa::attention_forward(h, h, b, nullptr, {}, out.mut());
    ADD_FAILURE() << "a bool value was accepted";
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.argument(), "value");
    EXPECT_EQ(e.kind(), sdpa::ErrorKind::bad_type);
    EXPECT_NE(std::string(e.what()).find("float16 or bfloat16), got bool"), std::string::npos)
        << e.what();
  }
}

}  // namespace
