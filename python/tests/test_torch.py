"""sdpa against PyTorch: the forward output, the log-sum-exp and the three gradients (PyTorch
autograd) on named and randomized shapes with every option, within the accuracy contract.

The expected values come from PyTorch's own scaled_dot_product_attention (torch 1.13: the
private F._scaled_dot_product_attention) run in float64 on the same inputs, with autograd for
the gradients. What torch 1.13 lacks is built from torch operations, as a user would:
  - explicit scale: the query multiplied by scale * sqrt(E) (torch 1.13 always uses 1/sqrt(E));
  - grouped-query attention: key and value repeat_interleave'd along the head dimension;
  - causal lower-right: an explicit tril(ones(L, S), S - L) mask, combined with the user's mask;
  - fully masked rows: torch 1.13 returns NaN there (and its NaN then spreads through every
    gradient of key and value); we return zeros. The reference lifts the mask of those rows so
    torch computes finite numbers, zeroes them in the expected output, and zeroes grad_out on
    them so they contribute nothing to the expected gradients, which is exactly the zeros
    semantics. test_fully_masked_rows also compares with torch's raw result on the other rows.
"""
import math
from dataclasses import dataclass, replace

import numpy as np
import pytest

import sdpa
from conftest import assert_close, contract

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

# Small problems: one thread each. On the shared two-core machine (load ~15 while others build),
# a two-thread parallel region waits for both threads to be scheduled: a case took 0.2-0.4 s
# with two threads and 0.01-0.04 s with one. A quarter of the random cases use two threads.
torch.set_num_threads(1)


@dataclass(frozen=True)
class Case:
    batch: tuple = (2,)  # leading batch dimensions
    hq: int = 3
    hkv: int = 3
    L: int = 7
    S: int = 11
    E: int = 5
    Ev: int = 9
    heads: bool = True  # False: rank-2 inputs (L, E)
    mask: str = None  # None, "bool" or "float"
    mask_shape: tuple = None  # None: the full (..., Hq, L, S); else a broadcastable shape
    mask_dtype: str = "float64"  # for float masks
    causal: str = None  # None, "upper-left", "lower-right"
    is_causal: bool = False  # PyTorch's flag (upper-left)
    scale: float = None
    gqa: bool = False
    empty_rows: tuple = ()  # query rows l whose every key the mask removes

    def shapes(self):
        head = (self.hq,) if self.heads else ()
        kvhead = (self.hkv,) if self.heads else ()
        q = self.batch + head + (self.L, self.E)
        k = self.batch + kvhead + (self.S, self.E)
        v = self.batch + kvhead + (self.S, self.Ev)
        o = self.batch + head + (self.L, self.Ev)
        m = self.batch + head + (self.L, self.S)
        return q, k, v, o, m


def make_inputs(case, dtype, seed):
    rng = np.random.default_rng(seed)
    qs, ks, vs, os_, ms = case.shapes()
    q = rng.standard_normal(qs).astype(dtype)
    k = rng.standard_normal(ks).astype(dtype)
    v = rng.standard_normal(vs).astype(dtype)
    g = rng.standard_normal(os_).astype(dtype)
    mask = None
    if case.mask is not None:
        shape = case.mask_shape if case.mask_shape is not None else ms
        if case.mask == "bool":
            mask = rng.random(shape) < 0.75
            for l in case.empty_rows:
                mask[..., l, :] = False
        else:
            mask = rng.standard_normal(shape)
            mask[rng.random(shape) < 0.2] = -np.inf
            for l in case.empty_rows:
                mask[..., l, :] = -np.inf
            mask = mask.astype(case.mask_dtype)
    return q, k, v, mask, g


def causal_allowed(causal, L, S):
    if causal == "upper-left":
        return np.tril(np.ones((L, S), dtype=bool))
    if causal == "lower-right":
        return np.tril(np.ones((L, S), dtype=bool), S - L)
    return np.ones((L, S), dtype=bool)


def torch_sdpa(q, k, v, mask, is_causal):
    """PyTorch's scaled_dot_product_attention (default scale 1/sqrt(E))."""
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
    return F._scaled_dot_product_attention(q, k, v, mask, 0.0, False, is_causal)[0]


def torch_reference(case, q, k, v, mask, g):
    """Expected out, lse, dq, dk, dv and the fully masked rows, in float64."""
    causal = "upper-left" if case.is_causal else case.causal
    _, _, _, _, ms = case.shapes()
    L, S, E = case.L, case.S, case.E
    scale = 1.0 / math.sqrt(E) if case.scale is None else case.scale
    # Which (.., l, s) take part: the user's mask and the causal rule together.
    allowed = np.broadcast_to(causal_allowed(causal, L, S), ms)
    if mask is not None:
        allowed = allowed & np.broadcast_to(mask if mask.dtype == bool else mask != -np.inf, ms)
    empty = ~allowed.any(-1)  # (..., Hq, L)

    Q = torch.tensor(q, dtype=torch.float64, requires_grad=True)
    K = torch.tensor(k, dtype=torch.float64, requires_grad=True)
    V = torch.tensor(v, dtype=torch.float64, requires_grad=True)
    Kx, Vx = K, V
    if case.gqa:
        Kx = K.repeat_interleave(case.hq // case.hkv, dim=-3)
        Vx = V.repeat_interleave(case.hq // case.hkv, dim=-3)
    use_is_causal = causal == "upper-left" and mask is None and not empty.any()
    tmask = None
    if not use_is_causal and (mask is not None or causal is not None):
        c = np.broadcast_to(causal_allowed(causal, L, S), ms)
        if mask is None or mask.dtype == bool:
            tm = allowed.copy()
            tm[empty] = True  # lifted: torch would give NaN here
        else:
            tm = np.where(c, np.broadcast_to(mask.astype(np.float64), ms), -np.inf)
            tm[empty] = 0.0
        tmask = torch.tensor(tm)
    Qs = Q if case.scale is None else Q * (scale * math.sqrt(E))
    out = torch_sdpa(Qs, Kx, Vx, tmask, use_is_causal)
    keep = torch.tensor(~empty, dtype=torch.float64).unsqueeze(-1)
    out.backward(torch.tensor(g, dtype=torch.float64) * keep)
    out_expected = (out * keep).detach().numpy()

    # lse from torch's logsumexp of the scaled, masked scores (-inf on empty rows).
    with torch.no_grad():
        scores = (Q @ Kx.transpose(-2, -1)) * scale
        if mask is not None and mask.dtype != bool:
            scores = scores + torch.tensor(mask.astype(np.float64))
        scores = scores.masked_fill(torch.tensor(~allowed), -math.inf)
        lse = torch.logsumexp(scores, dim=-1).numpy()
    return dict(out=out_expected, lse=lse, dq=Q.grad.numpy(), dk=K.grad.numpy(),
                dv=V.grad.numpy(), empty=empty)


def options(case):
    return dict(attn_mask=None, is_causal=case.is_causal, scale=case.scale, enable_gqa=case.gqa,
                causal=case.causal)


def check_against_torch(case, dtype, seed, impl="fast", threads=1):
    q, k, v, mask, g = make_inputs(case, dtype, seed)
    opts = options(case)
    opts["attn_mask"] = mask
    out, lse = sdpa.attention_forward(q, k, v, **opts, impl=impl, threads=threads)
    dq, dk, dv = sdpa.attention_backward(q, k, v, out, lse, g, **opts, impl=impl, threads=threads)
    ref = torch_reference(case, q, k, v, mask, g)
    bound = contract(dtype)
    what = f"{case} {np.dtype(dtype).name} impl={impl} seed={seed}"
    for name, ours, shape in (("out", out, ref["out"].shape), ("lse", lse, ref["lse"].shape),
                              ("dq", dq, q.shape), ("dk", dk, k.shape), ("dv", dv, v.shape)):
        assert ours.dtype == np.dtype(dtype), f"{what}: {name} dtype {ours.dtype}"
        assert ours.shape == shape, f"{what}: {name} shape {ours.shape}, expected {shape}"
    empty = ref["empty"]
    # Rows that see no key: exactly zero output and zero query gradient, lse = -inf.
    assert np.all(out[empty] == 0), f"{what}: fully masked rows of out are not zero"
    assert np.all(dq[empty] == 0), f"{what}: fully masked rows of dq are not zero"
    assert np.all(np.isneginf(lse[empty])), f"{what}: lse of fully masked rows is not -inf"
    assert_close(f"out ({what})", out, ref["out"], bound)
    assert_close(f"lse ({what})", lse, ref["lse"], bound, valid=~empty)
    assert_close(f"dq ({what})", dq, ref["dq"], bound)
    assert_close(f"dk ({what})", dk, ref["dk"], bound)
    assert_close(f"dv ({what})", dv, ref["dv"], bound)
    # The PyTorch-named entry point is the same forward.
    out2 = sdpa.scaled_dot_product_attention(q, k, v, **opts, impl=impl, threads=threads)
    assert_close(f"scaled_dot_product_attention ({what})", out2, ref["out"], bound)
    return empty


NAMED = {
    "plain": Case(),
    "rank2": Case(batch=(), hq=1, hkv=1, heads=False, L=9, S=4, E=3, Ev=2),
    "rank3": Case(batch=(), hq=4, hkv=4),
    "rank5": Case(batch=(2, 3), hq=2, hkv=2, L=5, S=6),
    "L>S": Case(L=19, S=5),
    "E!=Ev": Case(L=33, S=65, E=64, Ev=17),
    "tiny": Case(batch=(), hq=1, hkv=1, L=1, S=1, E=1, Ev=1),
    "bool mask": Case(mask="bool"),
    "bool mask (L, S)": Case(mask="bool", mask_shape=(7, 11)),
    "bool key padding (B, 1, 1, S)": Case(mask="bool", mask_shape=(2, 1, 1, 11)),
    "float mask": Case(mask="float"),
    "float32 float mask (Hq, 1, S)": Case(mask="float", mask_shape=(3, 1, 11), mask_dtype="float32"),
    "float mask (1, S)": Case(mask="float", mask_shape=(1, 11)),
    "is_causal": Case(is_causal=True),
    "is_causal L>S": Case(is_causal=True, L=13, S=6),
    "upper-left": Case(causal="upper-left", L=11, S=7),
    "lower-right L<S": Case(causal="lower-right", L=5, S=12),
    "lower-right L>S (empty rows)": Case(causal="lower-right", L=12, S=5),
    "lower-right + bool mask": Case(causal="lower-right", mask="bool", L=6, S=9),
    "is_causal + float mask": Case(is_causal=True, mask="float", mask_shape=(7, 11)),
    "scale 0.1": Case(scale=0.1),
    "scale 2.5": Case(scale=2.5, E=16),
    "scale -0.7": Case(scale=-0.7),
    "gqa 6/2": Case(hq=6, hkv=2, gqa=True),
    "gqa 4/1 + bool mask + lower-right": Case(hq=4, hkv=1, gqa=True, mask="bool",
                                              causal="lower-right", L=9, S=13),
    "gqa without needing it": Case(hq=3, hkv=3, gqa=True),
    "empty rows, bool": Case(mask="bool", empty_rows=(0, 4)),
    "empty rows, float": Case(mask="float", empty_rows=(2, 6), mask_shape=(3, 7, 11)),
    "head dims 33/31": Case(batch=(1,), hq=2, hkv=2, L=17, S=29, E=33, Ev=31),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(NAMED))
def test_named_case(name, dtype):
    check_against_torch(NAMED[name], dtype, seed=7)


def random_case(rng):
    rank = int(rng.integers(2, 6))
    heads = rank >= 3
    batch = tuple(int(d) for d in rng.integers(1, 4, size=max(0, rank - 3)))
    gqa = heads and rng.random() < 0.4
    hkv = int(rng.integers(1, 4)) if heads else 1
    hq = hkv * (int(rng.integers(2, 4)) if gqa else 1)
    L, S = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    E = int(rng.choice([1, 2, 3, 8, 15, 16, 17, 33, 64]))
    Ev = int(rng.choice([1, 3, 16, 31, 64]))
    case = Case(batch=batch, hq=hq, hkv=hkv, L=L, S=S, E=E, Ev=Ev, heads=heads, gqa=gqa)
    kind = rng.choice(["none", "bool", "float"])
    if kind != "none":
        full = case.shapes()[4]
        drop = int(rng.integers(0, len(full) - 1))  # leave at least (L, S)
        shape = tuple(1 if rng.random() < 0.4 else d for d in full[drop:])
        case = replace(case, mask=str(kind), mask_shape=shape,
                       mask_dtype=str(rng.choice(["float32", "float64"])))
    causal = rng.choice(["none", "upper-left", "lower-right", "is_causal"])
    if causal == "is_causal":
        case = replace(case, is_causal=True)
    elif causal != "none":
        case = replace(case, causal=str(causal))
    if rng.random() < 0.5:
        case = replace(case, scale=float(rng.uniform(-1.0, 2.0)))
    return case


@pytest.mark.parametrize("seed", range(40))
def test_random_case(seed):
    rng = np.random.default_rng(1000 + seed)
    case = random_case(rng)
    dtype = np.float32 if rng.random() < 0.6 else np.float64
    check_against_torch(case, dtype, seed=seed, threads=2 if seed % 4 == 0 else 1)


@pytest.mark.parametrize("impl", ["reference", "naive"])
@pytest.mark.parametrize("seed", range(6))
def test_other_impls(impl, seed):
    rng = np.random.default_rng(2000 + seed)
    case = random_case(rng)
    dtype = np.float32 if seed % 2 == 0 else np.float64
    check_against_torch(case, dtype, seed=seed, impl=impl)


def test_fully_masked_rows():
    """torch 1.13 returns NaN for a query row that sees no key; we return zeros. Every other
    row must match torch's own result, unmodified."""
    case = Case(mask="bool", empty_rows=(1, 5))
    q, k, v, mask, g = make_inputs(case, np.float32, seed=3)
    out = sdpa.scaled_dot_product_attention(q, k, v, mask)
    raw = torch_sdpa(*(torch.tensor(a, dtype=torch.float64) for a in (q, k, v)),
                     torch.tensor(mask), False).numpy()
    empty = ~mask.any(-1)
    assert empty[..., 1].all() and empty[..., 5].all()
    assert np.all(out[empty] == 0), "fully masked rows are not zero"
    assert_close("rows with keys vs raw torch", out, np.nan_to_num(raw), contract(np.float32),
                 valid=~empty[..., None])
    lower_right = sdpa.scaled_dot_product_attention(q, k[..., :3, :], v[..., :3, :],
                                                    causal="lower-right")
    # L = 7 queries, S = 3 keys: rows 0..3 see no key under the lower-right rule.
    assert np.all(lower_right[..., :4, :] == 0)
    assert np.all(np.abs(lower_right[..., 4:, :]).max(-1) > 0)


def test_masked_nan_never_reaches_output():
    """A NaN stored at a masked-out key position is skipped, not multiplied by zero."""
    case = Case(mask="bool", mask_shape=(1, 11))
    q, k, v, mask, g = make_inputs(case, np.float64, seed=4)
    mask[..., 3] = False
    k2, v2 = k.copy(), v.copy()
    k2[..., 3, :] = np.nan
    v2[..., 3, :] = np.inf
    ref = torch_reference(case, q, k, v, mask, g)
    out = sdpa.scaled_dot_product_attention(q, k2, v2, mask)
    assert_close("out with NaN at masked keys", out, ref["out"], contract(np.float64))
