#!/usr/bin/python3
"""sdpa.attention_with_kvcache from Python: against a NumPy float64 reference written from
FlashAttention's definition, the in-place append, and refused calls that leave the caches
unchanged. Run by ctest with PYTHONPATH pointing at the built module."""
import re

import numpy as np
import pytest

sdpa = pytest.importorskip("sdpa")


def reference(q, k_cache, v_cache, seqlens, block_table, causal, scale=None):
    """out (batch, L, Hq, Ev) and lse (batch, Hq, L) in float64, one sequence at a time."""
    batch, L, Hq, E = q.shape
    Hkv, Ev = k_cache.shape[2], v_cache.shape[3]
    scale = 1 / np.sqrt(E) if scale is None else scale
    out = np.zeros((batch, L, Hq, Ev))
    lse = np.full((batch, Hq, L), -np.inf)
    for b in range(batch):
        S = int(seqlens[b])
        if block_table is None:
            k, v = k_cache[b, :S], v_cache[b, :S]
        else:
            page = k_cache.shape[1]
            rows = [(block_table[b, s // page], s % page) for s in range(S)]
            k = np.array([k_cache[p, o] for p, o in rows]).reshape(S, Hkv, E)
            v = np.array([v_cache[p, o] for p, o in rows]).reshape(S, Hkv, Ev)
        for h in range(Hq):
            g = h // (Hq // Hkv)
            s = scale * q[b, :, h].astype(np.float64) @ k[:, g].astype(np.float64).T  # (L, S)
            if causal:
                s = np.where(np.arange(S)[None, :] <= np.arange(L)[:, None] + S - L, s, -np.inf)
            m = s.max(axis=1, initial=-np.inf)
            ok = np.isfinite(m)
            p = np.exp(s - np.where(ok, m, 0)[:, None])
            denom = p.sum(axis=1)
            out[b, ok, h] = (p[ok] @ v[:, g].astype(np.float64)) / denom[ok, None]
            lse[b, h, ok] = m[ok] + np.log(denom[ok])
    return out, lse


def make(rng, dtype, batch, L, Hq, Hkv, E, Ev, page, capacity, lens, L_new):
    q = rng.standard_normal((batch, L, Hq, E)).astype(dtype)
    if page:
        max_blocks = capacity // page
        num_blocks = batch * max_blocks + 1
        k_cache = rng.standard_normal((num_blocks, page, Hkv, E)).astype(dtype)
        v_cache = rng.standard_normal((num_blocks, page, Hkv, Ev)).astype(dtype)
        table = rng.permutation(num_blocks)[: batch * max_blocks].reshape(batch, max_blocks)
        table = table.astype(np.int32)
    else:
        k_cache = rng.standard_normal((batch, capacity, Hkv, E)).astype(dtype)
        v_cache = rng.standard_normal((batch, capacity, Hkv, Ev)).astype(dtype)
        table = None
    k = rng.standard_normal((batch, L_new, Hkv, E)).astype(dtype) if L_new else None
    v = rng.standard_normal((batch, L_new, Hkv, Ev)).astype(dtype) if L_new else None
    return q, k_cache, v_cache, k, v, np.array(lens, dtype=np.int32), table


def write_rows(cache, table, lens, new):
    """The cache with the rows of `new` written at lens[b] (what the append must produce)."""
    cache = cache.copy()
    for b in range(new.shape[0]):
        for i in range(new.shape[1]):
            s = lens[b] + i
            if table is None:
                cache[b, s] = new[b, i]
            else:
                cache[table[b, s // cache.shape[1]], s % cache.shape[1]] = new[b, i]
    return cache


CASES = [
    # dtype, batch, L, Hq, Hkv, E, Ev, page, capacity, lens, L_new, causal
    (np.float32, 2, 1, 8, 2, 64, 64, 0, 100, [37, 0], 1, True),
    (np.float32, 3, 4, 4, 4, 17, 9, 16, 64, [16, 31, 0], 4, True),
    (np.float64, 2, 16, 6, 2, 33, 33, 256, 512, [300, 255], 0, False),
    (np.float32, 1, 3, 3, 1, 8, 8, 16, 48, [44], 3, True),
    (np.float64, 2, 2, 2, 1, 5, 7, 0, 30, [30, 11], 0, True),
]


@pytest.mark.parametrize("case", CASES)
def test_matches_reference_and_appends_in_place(case):
    dtype, batch, L, Hq, Hkv, E, Ev, page, capacity, lens, L_new, causal = case
    rng = np.random.default_rng(len(lens) * 100 + L)
    q, kc, vc, k, v, sl, table = make(rng, dtype, batch, L, Hq, Hkv, E, Ev, page, capacity, lens,
                                      L_new)
    k_want = write_rows(kc, table, sl, k) if L_new else kc.copy()
    v_want = write_rows(vc, table, sl, v) if L_new else vc.copy()
    out, lse = sdpa.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=sl, block_table=table,
                                           causal=causal, return_lse=True, threads=2)
    assert out.dtype == dtype and out.shape == (batch, L, Hq, Ev) and lse.shape == (batch, Hq, L)
    assert np.array_equal(kc, k_want) and np.array_equal(vc, v_want), "append"
    ref, ref_lse = reference(q, kc, vc, sl + L_new, table, causal)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, ref, atol=tol, rtol=tol)
    np.testing.assert_allclose(lse, ref_lse, atol=tol, rtol=tol)
    empty = (sl + L_new) == 0
    assert np.all(out[empty] == 0) and np.all(lse[empty] == -np.inf)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("source", ["own cache", "other cache"])
def test_new_rows_that_view_a_cache_are_read_before_any_row_is_written(paged, source):
    # k and v are views of cache rows 0..2, appended at row 1: written one row at a time from
    # the views themselves, rows 2 and 3 would copy what this call had just written.
    rng = np.random.default_rng(21)
    Hkv, E = 2, 16
    q = rng.standard_normal((1, 2, 4, E)).astype(np.float32)
    shape = (4, 4, Hkv, E) if paged else (1, 8, Hkv, E)
    kc = rng.standard_normal(shape).astype(np.float32)
    vc = rng.standard_normal(shape).astype(np.float32)
    table = np.array([[0, 1]], np.int32) if paged else None
    k, v = (kc[0:1, 0:3], vc[0:1, 0:3]) if source == "own cache" else (vc[0:1, 0:3], kc[0:1, 0:3])
    assert np.shares_memory(k, kc if source == "own cache" else vc) and k.flags.c_contiguous
    k0, v0 = k.copy(), v.copy()
    sl = np.array([1], np.int32)
    k_want, v_want = write_rows(kc, table, sl, k0), write_rows(vc, table, sl, v0)
    out = sdpa.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=sl, block_table=table)
    assert np.array_equal(kc, k_want) and np.array_equal(vc, v_want)
    ref, _ = reference(q, k_want, v_want, sl + 3, table, False)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("table, seqlens, fragment", [
    ([[0, 0, 0]], [0], "got row 0 of block 0 twice: sequence 0 writing it for positions 0 and 1"),
    ([[0, 1, 2], [0, 3, 4]], [0, 0], "got row 0 of block 0 twice: sequences 0 (position 0) and 1"),
])
def test_one_cache_row_written_twice_is_named(table, seqlens, fragment):
    rng = np.random.default_rng(22)
    kc = rng.standard_normal((5, 1, 1, 4)).astype(np.float32)
    vc = rng.standard_normal((5, 1, 1, 4)).astype(np.float32)
    batch = len(table)
    q = rng.standard_normal((batch, 3, 1, 4)).astype(np.float32)
    k = rng.standard_normal((batch, 3, 1, 4)).astype(np.float32)
    kc0, vc0 = kc.copy(), vc.copy()
    with pytest.raises(ValueError, match=re.escape("block_table: expected distinct cache rows")
                       + ".*" + re.escape(fragment)):
        sdpa.attention_with_kvcache(q, kc, vc, k, k.copy(), np.array(seqlens, np.int32),
                                    np.array(table, np.int32))
    assert np.array_equal(kc, kc0) and np.array_equal(vc, vc0)


@pytest.mark.parametrize("value", [2**64 - 1, 2**63])
def test_unsigned_block_ids_are_named_as_given(value):
    # Cast to int64 first, 2^64 - 1 read as -1 (the unused-entry filler) and 2^63 as -2^63.
    rng = np.random.default_rng(23)
    kc = rng.standard_normal((4, 2, 1, 4)).astype(np.float32)
    q = rng.standard_normal((1, 1, 1, 4)).astype(np.float32)
    for table in ([[value, 0]], [[0, value]]):
        with pytest.raises(ValueError, match=f"block_table: expected values that fit int32, got "
                           f"the range \\[0, {value}\\]"):
            sdpa.attention_with_kvcache(q, kc, kc.copy(), cache_seqlens=np.array([2], np.int32),
                                        block_table=np.array(table, np.uint64))


def test_defaults_whole_cache_and_plain_out():
    rng = np.random.default_rng(3)
    q, kc, vc, _, _, _, _ = make(rng, np.float32, 2, 1, 4, 2, 16, 16, 0, 40, [0, 0], 0)
    out = sdpa.attention_with_kvcache(q, kc, vc, scale=0.3)
    ref, _ = reference(q, kc, vc, [40, 40], None, False, scale=0.3)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("page", [0, 16])
def test_logits_past_float32_range_give_the_exact_result(page):
    """Scores past float32's range (q and k of 1e20: q.k ~ 1e40), scores that all overflow to
    -inf, and value sums past it (values of 3e38) are computed in float32 and overflow there;
    those rows come out exact, as the float64 reference gives them, and the ordinary heads of the
    same call stay within the float32 contract."""
    rng = np.random.default_rng(11)
    batch, L, Hq, Hkv, E, Ev, capacity = 2, 2, 8, 4, 32, 16, 1600
    q, kc, vc, _, _, _, table = make(rng, np.float32, batch, L, Hq, Hkv, E, Ev, page, capacity,
                                     [0] * batch, 0)
    sl = np.array([1600, 1100], dtype=np.int32)
    q[:, :, 2:4] *= 1e20  # kv head 1: huge scores of both signs
    kc[:, :, 1] *= 1e20
    q[:, :, 4:6] = np.abs(q[:, :, 4:6]) * 1e20  # kv head 2: every score below -3.4e38
    kc[:, :, 2] = -np.abs(kc[:, :, 2]) * 1e20
    vc[:, :, 3] = np.sign(vc[:, :, 3]) * 3e38  # kv head 3: value sums past float32's range
    out, lse = sdpa.attention_with_kvcache(q, kc, vc, cache_seqlens=sl, block_table=table,
                                           causal=True, return_lse=True, threads=2)
    ref, ref_lse = reference(q, kc, vc, sl, table, True)
    assert np.all(np.isfinite(out))
    # lse near +-1e40 is past float32's range: it rounds to +-inf, as the reference's does.
    with np.errstate(over="ignore"):
        ref_lse32 = ref_lse.astype(np.float32)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(ref_lse32))
    for h in range(Hq):
        scale = np.abs(vc[..., h // 2, :]).max()
        tol = 2e-5 if h < 2 else 1e-6  # heads 2..7 are recomputed in float64
        np.testing.assert_allclose(out[:, :, h] / scale, ref[:, :, h] / scale, atol=tol, rtol=0,
                                   err_msg=f"head {h}")
        np.testing.assert_allclose(lse[:, h], ref_lse32[:, h], rtol=tol,
                                   err_msg=f"lse head {h}")


def test_same_result_for_any_thread_count():
    rng = np.random.default_rng(4)
    q, kc, vc, _, _, sl, table = make(rng, np.float32, 2, 2, 8, 2, 32, 32, 16, 3200, [3199, 1500],
                                      0)
    outs = [sdpa.attention_with_kvcache(q, kc, vc, cache_seqlens=sl, block_table=table,
                                        threads=t) for t in (1, 2, 3)]
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def refusals():
    # (name, change, exception, text in the message)
    def bad_block(a):
        a["block_table"][0, 0] = a["k_cache"].shape[0]

    def too_long(a):
        a["cache_seqlens"][1] = 64

    def append_past(a):
        a["cache_seqlens"][1] = 63

    def dtype(a):
        a["k"] = a["k"].astype(np.float64)

    def heads(a):
        a["v_cache"] = np.zeros(a["v_cache"].shape[:2] + (1, a["v_cache"].shape[3]), np.float32)

    def no_v(a):
        a["v"] = None

    def shared_caches(a):  # the append would write value rows over key rows
        a["v_cache"] = a["k_cache"]

    def page_mismatch(a):
        s = a["v_cache"].shape
        a["v_cache"] = np.zeros((s[0], s[1] // 2, s[2], s[3]), np.float32)

    return [("block index", bad_block, ValueError, "block_table"),
            ("length past capacity", too_long, ValueError, "cache_seqlens"),
            ("append past capacity", append_past, ValueError, "capacity"),
            ("dtype", dtype, TypeError, "dtype"),
            ("heads", heads, ValueError, "v_cache"),
            ("k without v", no_v, ValueError, "together"),
            ("pages", page_mismatch, ValueError, "page_size"),
            ("one array as both caches", shared_caches, ValueError, "v_cache: .*overlaps k_cache")]


@pytest.mark.parametrize("name,change,error,text", refusals())
def test_refused_calls_leave_the_caches_unchanged(name, change, error, text):
    rng = np.random.default_rng(5)
    q, kc, vc, k, v, sl, table = make(rng, np.float32, 2, 2, 4, 2, 8, 8, 16, 64, [20, 33], 2)
    a = dict(q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=sl, block_table=table)
    change(a)
    k_before, v_before = a["k_cache"].copy(), a["v_cache"].copy()
    with pytest.raises(error, match=text):
        sdpa.attention_with_kvcache(a["q"], a["k_cache"], a["v_cache"], a["k"], a["v"],
                                    a["cache_seqlens"], a["block_table"])
    assert np.array_equal(a["k_cache"], k_before) and np.array_equal(a["v_cache"], v_before), name


def test_caches_must_be_writeable_contiguous_arrays():
    rng = np.random.default_rng(6)
    q, kc, vc, _, _, _, _ = make(rng, np.float32, 1, 1, 2, 2, 8, 8, 0, 10, [5], 0)
    with pytest.raises(ValueError, match="k_cache"):
        sdpa.attention_with_kvcache(q, kc[:, ::2], vc[:, ::2])
    with pytest.raises(TypeError, match="k_cache"):
        sdpa.attention_with_kvcache(q, kc.tolist(), vc)
    frozen = kc.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="k_cache"):
        sdpa.attention_with_kvcache(q, frozen, vc)
    with pytest.raises(TypeError, match="cache_seqlens"):
        sdpa.attention_with_kvcache(q, kc, vc, cache_seqlens=np.array([1.5]))


def test_float16_caches_equal_their_widened_float32():
    # A float16 cache (and float16 k/v appended to it) gives exactly what a float32 cache holding
    # the same widened values gives: the kernel widens exactly, then computes in float32.
    rng = np.random.default_rng(7)
    q, kc, vc, k, v, sl, table = make(rng, np.float32, 2, 2, 8, 2, 128, 128, 16, 96, [40, 0], 2)
    kc16, vc16, k16, v16 = (a.astype(np.float16) for a in (kc, vc, k, v))
    kc32, vc32 = kc16.astype(np.float32), vc16.astype(np.float32)
    out16, lse16 = sdpa.attention_with_kvcache(q, kc16, vc16, k16, v16, sl, table, causal=True,
                                               return_lse=True)
    out32, lse32 = sdpa.attention_with_kvcache(q, kc32, vc32, k16.astype(np.float32),
                                               v16.astype(np.float32), sl, table, causal=True,
                                               return_lse=True)
    assert out16.dtype == np.float32 and np.array_equal(out16, out32)
    assert np.array_equal(lse16, lse32)
    assert np.array_equal(kc16.astype(np.float32), kc32)  # the append wrote the same rows
    before = kc16.copy()
    with pytest.raises(TypeError, match="k: expected dtype float16"):
        sdpa.attention_with_kvcache(q, kc16, vc16, k, v16, sl, table)  # float32 k, float16 cache
    assert np.array_equal(kc16, before)


def test_float16_query_returns_float32_lse():
    # lse is float32 for a 16-bit query, as in the C++ API; out keeps the query's dtype and is
    # the float32 call's result rounded (its lse the float32 call's exactly).
    rng = np.random.default_rng(7)
    kc = rng.standard_normal((1, 9, 2, 8)).astype(np.float16)
    vc = rng.standard_normal((1, 9, 2, 8)).astype(np.float16)
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float16)
    out, lse = sdpa.attention_with_kvcache(q, kc, vc, return_lse=True)
    assert out.dtype == np.float16 and lse.dtype == np.float32 and lse.shape == (1, 2, 1)
    out32, lse32 = sdpa.attention_with_kvcache(q.astype(np.float32), kc, vc, return_lse=True)
    assert np.array_equal(out, out32.astype(np.float16))
    assert np.array_equal(lse, lse32)


@pytest.mark.parametrize("scale", ["0.5", True, [0.5], 1j])
def test_scale_must_be_a_real_number(scale):
    rng = np.random.default_rng(8)
    q, kc, vc, _, _, _, _ = make(rng, np.float32, 1, 1, 2, 2, 8, 8, 0, 10, [5], 0)
    with pytest.raises(TypeError, match="scale"):
        sdpa.attention_with_kvcache(q, kc, vc, scale=scale)


@pytest.mark.parametrize("option,value,error", [
    ("causal", "yes", TypeError), ("causal", 1, TypeError), ("return_lse", None, TypeError),
    ("threads", 2**40, ValueError), ("threads", -1, ValueError), ("threads", 1.0, TypeError),
    ("threads", True, TypeError)])
def test_options_are_checked_naming_the_argument(option, value, error):
    # Each wrong option is refused by name, and the appended rows stay out of the caches.
    rng = np.random.default_rng(9)
    q, kc, vc, k, v, sl, _ = make(rng, np.float32, 1, 1, 2, 2, 8, 8, 0, 10, [5], 1)
    k_before, v_before = kc.copy(), vc.copy()
    with pytest.raises(error, match=option):
        sdpa.attention_with_kvcache(q, kc, vc, k, v, sl, **{option: value})
    assert np.array_equal(kc, k_before) and np.array_equal(vc, v_before)
    # NumPy's own bool and int are taken as Python's.
    good = {"causal": np.bool_(True), "return_lse": np.bool_(False), "threads": np.int64(1)}
    out = sdpa.attention_with_kvcache(q, kc, vc, **{option: good[option]})
    assert np.all(np.isfinite(out))
