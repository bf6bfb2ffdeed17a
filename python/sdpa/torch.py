"""sdpa for PyTorch users: torch tensors in and out, autograd through the fused backward.

    import sdpa.torch
    out = sdpa.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # q: (N, H, L, E)
    out.sum().backward()                                                      # q.grad, k.grad, ...

    with sdpa.torch.use():        # routes torch.nn.functional.scaled_dot_product_attention
        loss = model(x)
    sdpa.torch.patch(model)       # nn.MultiheadAttention submodules call sdpa

PyTorch 2.x's signature and semantics, on CPU tensors of PyTorch 1.13 and later (float32,
float64, float16 and bfloat16; see docs/precision.md). Tensors are passed to the C++ library by pointer, shape and strides: (N, H, L, E)
tensors, (N, L, H, E) views transposed to (N, H, L, E), slices of a packed QKV projection and
expanded (stride 0) masks go in as they are. The GIL is released while the library computes.
See docs/python.md.
"""
import contextlib
import math
import numbers

import numpy as np
import torch
import torch.nn.functional as _F
from torch.autograd.function import once_differentiable

from . import _sdpa

__all__ = ["scaled_dot_product_attention", "attention_varlen", "use", "patch", "unpatch"]

_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.bool: "bool",
          torch.float16: "float16", torch.bfloat16: "bfloat16"}
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_HALF = (torch.float16, torch.bfloat16)


def _kv_dtype_ok(q, kv):
    """The library's rule: one dtype, or a float32/bfloat16 query on a 16-bit key/value."""
    return kv == q or (kv in _HALF and q in (torch.float32, torch.bfloat16))


def _resolved(t):
    """t with torch's lazy negation and conjugation applied: a view whose negative bit is set
    (x.conj().imag, torch._neg_view(x)) holds the values un-negated in memory, and the C++ API
    reads memory. t itself when neither bit is set; differentiable."""
    return t.resolve_conj().resolve_neg()


def _float_values(obj, what):
    """alibi_slopes or sinks (a tensor or an array-like of floats) as a float64 NumPy array of
    its own, its shape kept: the bindings check the shape against the query's. Complex values
    are refused, not cast (which would drop their imaginary parts)."""
    if isinstance(obj, torch.Tensor):
        if obj.is_complex():
            raise TypeError(f"{what}: expected an array of floats, got dtype "
                            f"{str(obj.dtype).replace('torch.', '')}")
        return _resolved(obj.detach()).to(device="cpu", dtype=torch.float64).numpy().copy()
    try:
        values = np.asarray(obj)
    except (TypeError, ValueError):
        values = None
    if values is not None and values.dtype.kind == "c":
        raise TypeError(f"{what}: expected an array of floats, got dtype {values.dtype}")
    try:
        return np.array(obj, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: expected an array of floats, got {type(obj).__name__}") from None


def _describe(t):
    """(data pointer, dtype, shape, strides) for the C++ API; the caller keeps t alive."""
    return (t.data_ptr(), _NAMES[t.dtype], list(t.shape), list(t.stride()))


def _last_contiguous(t):
    """t itself when its last dimension is contiguous (any other strides are fine), else a copy.
    An empty tensor counts as contiguous to torch, so contiguous() keeps its strides (all 0 for
    the expanded zeros autograd passes as an empty gradient): it is cloned into C order.
    A tensor whose data does not start at a multiple of its element size (torch.frombuffer at an
    odd offset) is copied too: the C++ API reads it through typed, hence aligned, pointers."""
    if t.numel() > 0 and t.data_ptr() % t.element_size() != 0:
        return t.clone(memory_format=torch.contiguous_format)
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        if t.numel() == 0:
            return t.clone(memory_format=torch.contiguous_format)
        return t.contiguous()
    return t


def _empty_like_layout(t, shape, dtype):
    """An empty tensor of `shape` whose dimensions lie in memory in the order of t's strides
    (largest first, the last dimension last and contiguous): for a (N, L, H, E) view transposed
    to (N, H, L, E), or a slice of a packed QKV projection, out is (N, L, H, Ev) in memory, so
    that out.transpose(1, 2).reshape(N, L, H * Ev) is a view, not a copy, and a gradient laid out
    like its input flows back through the transposes without copies. The C++ API writes through
    any such strides.
    The tensor is allocated with those strides (empty_strided), not as a permuted view of a
    buffer: a view returned by an autograd Function may not be modified in place (PyTorch
    raises at out.add_(...) when an input requires grad), where a tensor of its own may."""
    n = len(shape)
    if n <= 1:
        return torch.empty(shape, dtype=dtype)
    strides = t.stride()
    order = sorted(range(n - 1), key=lambda i: -strides[i]) + [n - 1]  # stable: ties keep order
    if order == list(range(n)):
        return torch.empty(shape, dtype=dtype)
    stride = [0] * n
    step = 1
    for dim in reversed(order):  # C order over the dimensions as they lie in memory
        stride[dim] = step
        step *= max(int(shape[dim]), 1)
    return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype)


def _check_tensor(t, what, allowed):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{what}: expected a CPU tensor, got device {t.device}")
    if t.layout != torch.strided:
        raise ValueError(f"{what}: expected a dense (strided) tensor, got layout {t.layout}")
    if t.dtype not in allowed:
        names = ", ".join(_NAMES[d] for d in allowed)
        raise TypeError(f"{what}: expected dtype {names}, got {str(t.dtype).replace('torch.', '')}")


# ---- options, checked as the NumPy functions check them (python/sdpa_python.cpp) --------------

def _given(obj):
    """"'no' (str)" for messages."""
    return f"{obj!r} ({type(obj).__name__})"


def _is_bool(obj):
    return isinstance(obj, (bool, np.bool_))


def _as_bool(obj, what):
    if not _is_bool(obj):
        raise TypeError(f"{what}: expected True or False, got {_given(obj)}")
    return bool(obj)


def _as_real(obj, what):
    if _is_bool(obj) or not isinstance(obj, numbers.Real):
        raise TypeError(f"{what}: expected a real number, got {_given(obj)}")
    return float(obj)


def _as_scale(obj):
    if obj is None:
        return None
    if _is_bool(obj) or not isinstance(obj, numbers.Real):
        raise TypeError(f"scale: expected None or a real number, got {_given(obj)}")
    return float(obj)


def _as_threads(obj):
    if _is_bool(obj) or not isinstance(obj, (int, np.integer)):
        raise TypeError(f"threads: expected an int, 0 (one per core) or 1..1024, got {_given(obj)}")
    if not 0 <= obj <= 1024:
        raise ValueError(f"threads: expected 0 (one per core) or 1..1024, got {obj}")
    return int(obj)


def _as_int(obj, what):
    if _is_bool(obj) or not isinstance(obj, (int, np.integer)):
        raise TypeError(f"{what}: expected an int, got {_given(obj)}")
    return int(obj)


def _as_string(obj, what):
    if not isinstance(obj, str):
        raise TypeError(f"{what}: expected a str, got {_given(obj)}")
    return obj


def _causal_name(is_causal, causal):
    if causal is None:
        return "upper-left" if is_causal else "none"
    _as_string(causal, "causal")
    if causal not in ("none", "upper-left", "lower-right"):
        raise ValueError(f"causal: expected None, 'none', 'upper-left' or 'lower-right', got {causal!r}")
    if is_causal and causal != "upper-left":
        raise ValueError(f"is_causal: expected False when causal='{causal}' is given "
                         "(is_causal=True means causal='upper-left'), got True")
    return causal


def _sum_to(grad, shape):
    """grad summed over the dimensions that broadcasting expanded from `shape`."""
    lead = grad.dim() - len(shape)
    if lead > 0:
        grad = grad.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, d in enumerate(shape) if d == 1 and grad.shape[i] != 1)
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    return grad.reshape(shape)


def _mask_grad(q, k, v, mask, out, g, causal, scale, group, variants):
    """d loss / d attn_mask for an additive mask: dS = P * (dP - rowsum(dO * O)), summed over the
    dimensions the mask was broadcast along (what PyTorch's autograd gives). Formed with torch
    operations, L x S per head: only computed when the mask itself requires a gradient. The
    mask is added after the softcap and ALiBi, so the softcap's derivative does not enter; the
    window removes keys like the causal rule; the sinks join each row's denominator; with
    dropout, dP = z * (dO V^T) with the library's own dropout factors z.
    P is the softmax of the scores formed here, normalised by the row's own maximum, not
    exp(s - lse) with the library's lse: where a row's scores are all one huge constant (a mask
    of finfo.min), lse = s + log(S) rounds to s, and exp(s - lse) would give 1, not 1 / S.
    Computed in float64 for float64 inputs, else in float32: torch has no CPU matmul for
    float16, a float32 query may read a 16-bit key and value, and scores rounded to bfloat16
    would err by |s| * 2^-9. Only the result is rounded to the mask's dtype."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, out, g = (t.to(dtype) for t in (q, k, v, out, g))
    if group > 1:
        k = k.repeat_interleave(group, dim=-3)
        v = v.repeat_interleave(group, dim=-3)
    L, S = q.shape[-2], k.shape[-2]
    H = q.shape[-3] if q.dim() >= 3 else 1
    if S == 0:  # no key: out is zeros whatever the mask
        return torch.zeros(mask.shape, dtype=mask.dtype)
    heads = q.shape[-3:-2]  # (Hq,), or () for a rank-2 query
    d = S - L
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    cap = float(variants.get("softcap") or 0.0)
    if cap:
        s = cap * torch.tanh(s / cap)
    i = torch.arange(L)[:, None]
    j = torch.arange(S)[None, :]
    slopes = variants.get("alibi_slopes")
    if slopes is not None:
        # Shaped (Hq,), (B, Hq) or (..., Hq), as the bindings checked.
        sl = torch.as_tensor(slopes, dtype=s.dtype)
        sl = sl.reshape(heads) if sl.numel() == H else sl.reshape(q.shape[:-3] + heads)
        s = s - sl[..., None, None] * (i + d - j).abs().to(s.dtype)
    s = s + mask.to(dtype)
    allowed = torch.ones(L, S, dtype=torch.bool)
    if causal == "upper-left":
        allowed &= j <= i
    elif causal == "lower-right":
        allowed &= j <= i + d
    left, right = (int(x) for x in variants.get("window_size", (-1, -1)))
    if left >= 0:
        allowed &= j >= i + d - left
    if right >= 0:
        allowed &= j <= i + d + right
    s = s.masked_fill(~allowed, -math.inf)
    sink = variants.get("sinks")
    m = s.amax(-1, keepdim=True)
    if sink is not None:
        sink = torch.as_tensor(sink, dtype=dtype).reshape(heads + (1, 1))
        m = torch.maximum(m, sink)
    seen = m > -math.inf  # False for a row that sees no key (and has no sink): P = 0
    m = m.masked_fill(~seen, 0.0)
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    if sink is not None:
        den = den + torch.exp(sink - m)
    p = (e / den).masked_fill(~seen, 0.0)
    dp = torch.matmul(g, v.transpose(-2, -1))
    if variants.get("dropout_p", 0.0):
        B = int(math.prod(q.shape[:-3]))
        z = _sdpa._dropout_factors(B, H, L, S, variants["dropout_p"], variants["seed"])
        dp = dp * torch.from_numpy(z).reshape(q.shape[:-1] + (S,)).to(dtype)
    ds = p * (dp - (g * out).sum(-1, keepdim=True))
    return _sum_to(ds, mask.shape).to(mask.dtype)


class _Attention(torch.autograd.Function):
    """out = softmax(q k^T * scale + mask) v; backward by the library's fused backward.
    `variants` holds the variant keywords (window_size, softcap, alibi_slopes, dropout_p, seed)
    as the C++ bindings take them; `sinks` is a tensor (it gets a gradient) or None."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, causal, scale, enable_gqa, impl, threads,
                sinks, variants):
        out = _empty_like_layout(query, tuple(query.shape[:-1]) + tuple(value.shape[-1:]),
                                 query.dtype)
        lse = torch.empty(tuple(query.shape[:-1]),
                          dtype=torch.float32 if query.dtype in _HALF else query.dtype)
        kw = dict(variants)
        if sinks is not None:
            kw["sinks"] = sinks.detach().to(torch.float64).numpy()
        _sdpa._forward_described(
            _describe(query), _describe(key), _describe(value),
            None if attn_mask is None else _describe(attn_mask), _describe(out), _describe(lse),
            causal, scale, enable_gqa, impl, threads, **kw)
        ctx.save_for_backward(query, key, value, attn_mask, out, lse, sinks)
        ctx.options = (causal, scale, enable_gqa, impl, threads, kw)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        query, key, value, attn_mask, out, lse, sinks = ctx.saved_tensors
        causal, scale, enable_gqa, impl, threads, kw = ctx.options
        if grad_out.numel() == 0:
            # An empty out (no batch, head, query or value column): the loss does not depend on
            # the inputs, every gradient is zero.
            def zero(t, needed):
                return _empty_like_layout(t, t.shape, t.dtype).zero_() if needed else None

            need = ctx.needs_input_grad
            return (zero(query, need[0]), zero(key, need[1]), zero(value, need[2]),
                    zero(attn_mask, need[3]), None, None, None, None, None,
                    zero(sinks, sinks is not None and need[9]), None)
        g = _last_contiguous(_resolved(grad_out))
        if g.dtype != query.dtype:
            g = g.to(query.dtype)
        dq = _empty_like_layout(query, query.shape, query.dtype)
        dk = _empty_like_layout(key, key.shape, key.dtype)
        dv = _empty_like_layout(value, value.shape, value.dtype)
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[9]:
            dsinks = torch.empty(sinks.shape, dtype=query.dtype)
        _sdpa._backward_described(
            _describe(query), _describe(key), _describe(value),
            None if attn_mask is None else _describe(attn_mask), _describe(out), _describe(lse),
            _describe(g), _describe(dq), _describe(dk), _describe(dv),
            causal, scale, enable_gqa, impl, threads,
            None if dsinks is None else _describe(dsinks), **kw)
        dmask = None
        if ctx.needs_input_grad[3]:
            E = query.shape[-1]
            s = scale if scale is not None else (1.0 / math.sqrt(E) if E > 0 else 1.0)
            group = query.shape[-3] // key.shape[-3] if query.dim() >= 3 and key.shape[-3] else 1
            dmask = _mask_grad(query, key, value, attn_mask, out, g, causal, s, group, kw)
        if dsinks is not None:
            dsinks = dsinks.to(sinks.dtype)
        return dq, dk, dv, dmask, None, None, None, None, None, dsinks, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, causal=None,
                                 impl="fast", threads=0, window_size=None, softcap=0.0,
                                 alibi_slopes=None, sinks=None, seed=None):
    """softmax(query @ key.transpose(-2, -1) * scale + attn_mask) @ value, as
    torch.nn.functional.scaled_dot_product_attention (PyTorch 2.x), with autograd.

    query (..., Hq, L, E), key (..., Hkv, S, E), value (..., Hkv, S, Ev): CPU tensors, float32,
    float64, float16 or bfloat16, all one dtype (or a float32/bfloat16 query on a float16/bfloat16
    key and value; out has the query's dtype, each gradient its input's), any strides whose last
    dimension is contiguous, read in place (a tensor whose last dimension is strided is copied
    first). out is laid out in memory like query (a (N, L, H, E) view gives a (N, L, H, Ev)
    out), the gradients like their inputs.
    attn_mask: None, bool (True = takes part) or float (added to the scores; -inf allowed),
    broadcastable to (..., Hq, L, S); a float mask that requires grad gets one.
    dropout_p: dropout on the attention weights, in [0, 1), scaled by 1 / (1 - p), p rounded to
    a multiple of 2^-16 (docs/variants.md); the mask comes from Philox keyed by `seed` (None: one drawn from torch's generator, so that
    torch.manual_seed governs it) and is regenerated, not stored, by the backward.
    is_causal: PyTorch's upper-left rule, tril(ones(L, S)); it may be combined with attn_mask
    (PyTorch raises there), both must allow a key.
    scale: None means 1/sqrt(E). enable_gqa: Hq a multiple of Hkv (repeat_interleave).
    Keywords beyond PyTorch's: causal ('upper-left' or 'lower-right', FlashAttention's
    tril(ones(L, S), S - L)), impl ('fast', 'reference', 'naive'), threads (0 = one per core),
    and FlashAttention's variants (docs/variants.md): window_size=(left, right) (-1 = unbounded),
    softcap, alibi_slopes ((Hq,) or (B, Hq), B the leading dimensions flattened, or (..., Hq)
    with them), sinks ((Hq,) tensor: one logit per head in the softmax's denominator, with a
    gradient when it requires one, which needs float32 or float64 query, key and value).
    Tensors whose negative or conjugate bit is set are resolved (copied) first.

    Returns out (..., Hq, L, Ev). Rows that see no key are zeros (PyTorch gives NaN there) and
    get zero gradients.
    """
    floats = _FLOATS
    _check_tensor(query, "query", floats)
    _check_tensor(key, "key", floats)
    _check_tensor(value, "value", floats)
    if attn_mask is not None:
        _check_tensor(attn_mask, "attn_mask", (torch.bool,) + floats)
    is_causal = _as_bool(is_causal, "is_causal")
    scale = _as_scale(scale)
    enable_gqa = _as_bool(enable_gqa, "enable_gqa")
    name = _causal_name(is_causal, causal)
    impl = _as_string(impl, "impl")
    threads = _as_threads(threads)
    dropout_p = _as_real(dropout_p, "dropout_p")
    if key.dtype != value.dtype or not _kv_dtype_ok(query.dtype, key.dtype):
        raise TypeError(f"key/value: expected the query's dtype {_NAMES[query.dtype]} for key and "
                        f"value, got key {_NAMES[key.dtype]} and value {_NAMES[value.dtype]} "
                        "(only a float32 or bfloat16 query may read key and value of one other "
                        "dtype, float16 or bfloat16)")
    # The variant keywords go to the bindings as given (window_size, softcap, seed) or as float64
    # arrays of their shape (alibi_slopes, sinks), which check them by name as the NumPy
    # functions do: seed even without dropout.
    variants = _variant_keywords(window_size, softcap, alibi_slopes, dropout_p, seed)
    if sinks is not None:
        if isinstance(sinks, torch.Tensor):
            sinks = _resolved(sinks)
        else:
            sinks = torch.from_numpy(_float_values(sinks, "sinks"))
        if (sinks.requires_grad and torch.is_grad_enabled()
                and any(t.dtype in _HALF for t in (query, key, value))):
            # The backward could not give the sinks' gradient (see attention_backward): refused
            # here, at the call that asks for it.
            raise TypeError("grad_sinks: expected float32 or float64 inputs, got a "
                            "half-precision query, key or value")
    q, k, v = (_last_contiguous(_resolved(t)) for t in (query, key, value))
    m = None if attn_mask is None else _last_contiguous(_resolved(attn_mask))
    return _Attention.apply(q, k, v, m, name, scale, enable_gqa, impl, threads, sinks, variants)


def _variant_keywords(window_size, softcap, alibi_slopes, dropout_p, seed):
    """The variant keywords for the bindings; a seed is drawn from torch's generator for
    dropout without one."""
    variants = {}
    if window_size is not None:
        variants["window_size"] = window_size
    if softcap is not None:
        variants["softcap"] = softcap
    if alibi_slopes is not None:
        variants["alibi_slopes"] = _float_values(alibi_slopes, "alibi_slopes")
    if seed is not None:
        variants["seed"] = seed
    if dropout_p != 0.0:
        variants["dropout_p"] = dropout_p
        if seed is None:
            variants["seed"] = int(torch.randint(0, 2**62, (1,)).item())
    return variants


# ---- variable-length batches ------------------------------------------------------------------

class _Varlen(torch.autograd.Function):
    """sdpa.attention_varlen with autograd: packed (total, heads, dim) tensors; the backward is
    sdpa.attention_varlen_backward (the sinks' gradient when sinks require one)."""

    @staticmethod
    def forward(ctx, query, key, value, cu_q, cu_k, max_q, max_k, sinks, kw):
        arrays = [_resolved(t.detach()).contiguous().numpy() for t in (query, key, value)]
        opts = dict(kw)
        if sinks is not None:
            opts["sinks"] = sinks.detach().to(torch.float64).numpy()
        out, lse = _sdpa.attention_varlen(*arrays, cu_q, cu_k, max_q, max_k, return_lse=True,
                                          **opts)
        out, lse = torch.from_numpy(out), torch.from_numpy(lse)
        ctx.save_for_backward(query, key, value, out, lse, sinks)
        ctx.args = (cu_q, cu_k, max_q, max_k, opts)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        query, key, value, out, lse, sinks = ctx.saved_tensors
        cu_q, cu_k, max_q, max_k, opts = ctx.args
        arrays = [_resolved(t.detach()).contiguous().numpy() for t in (query, key, value)]
        g = _resolved(grad_out.detach()).to(query.dtype).contiguous().numpy()
        grads = _sdpa.attention_varlen_backward(*arrays, cu_q, cu_k, max_q, max_k, out.numpy(),
                                                lse.numpy(), g, **opts)
        dq, dk, dv = (torch.from_numpy(a) for a in grads[:3])
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[7]:
            dsinks = torch.from_numpy(grads[3]).to(sinks.dtype)
        return dq, dk, dv, None, None, None, None, dsinks, None


def attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     *, softmax_scale=None, causal=False, window_size=None, softcap=0.0,
                     alibi_slopes=None, sinks=None, dropout_p=0.0, seed=None, impl="fast",
                     threads=0):
    """sdpa.attention_varlen (FlashAttention's flash_attn_varlen_func) on CPU tensors, with
    autograd: query (total_q, Hq, E), key (total_k, Hkv, E), value (total_k, Hkv, Ev), float32
    or float64, one dtype; cu_seqlens_q / cu_seqlens_k the B + 1 offsets (tensors or sequences
    of ints); sequence b attends only within itself, with every variant keyword of
    scaled_dot_product_attention (sinks a (Hq,) tensor that gets a gradient; seed None draws
    one from torch's generator). Returns out (total_q, Hq, Ev)."""
    for t, what in ((query, "query"), (key, "key"), (value, "value")):
        _check_tensor(t, what, (torch.float32, torch.float64))
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(f"key/value: expected the query's dtype {_NAMES[query.dtype]}, got key "
                        f"{_NAMES[key.dtype]} and value {_NAMES[value.dtype]}")
    def offsets(c):
        # The offsets as given (a copy), for the bindings to check: float offsets are refused
        # there, not truncated.
        if isinstance(c, torch.Tensor):
            return _resolved(c.detach()).cpu().numpy().copy()
        return np.array(c)

    kw = dict(causal=causal, impl=impl, threads=_as_threads(threads))
    if softmax_scale is not None:
        kw["softmax_scale"] = _as_real(softmax_scale, "softmax_scale")
    kw.update(_variant_keywords(window_size, softcap, alibi_slopes, _as_real(dropout_p, "dropout_p"),
                                seed))
    if sinks is not None:
        if isinstance(sinks, torch.Tensor):
            sinks = _resolved(sinks)
        else:
            sinks = torch.from_numpy(_float_values(sinks, "sinks"))
    query, key, value = (_resolved(t) for t in (query, key, value))
    return _Varlen.apply(query, key, value, offsets(cu_seqlens_q), offsets(cu_seqlens_k),
                         _as_int(max_seqlen_q, "max_seqlen_q"),
                         _as_int(max_seqlen_k, "max_seqlen_k"), sinks, kw)


# ---- routing an existing model through sdpa ---------------------------------------------------

def _mask_supported(mask):
    """None, or a CPU tensor of a dtype sdpa takes as a mask (bool or floating)."""
    return mask is None or (isinstance(mask, torch.Tensor) and mask.device.type == "cpu"
                            and mask.dtype in _FLOATS + (torch.bool,))


def _supported(query, key, value, attn_mask, dropout_p):
    ok = _FLOATS
    for t in (query, key, value):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.dtype not in ok:
            return False
    if not _mask_supported(attn_mask):
        return False
    return dropout_p == 0.0 and query.dim() >= 2


@contextlib.contextmanager
def use():
    """Within the block, torch.nn.functional.scaled_dot_product_attention is sdpa's (installed
    on PyTorch 1.13, which has none). Calls sdpa cannot serve (other devices or dtypes,
    dropout_p > 0) go to PyTorch's own function where there is one, else raise. Covers code that
    calls it as F.scaled_dot_product_attention at run time; a name imported before the block
    (from torch.nn.functional import scaled_dot_product_attention) keeps PyTorch's. The switch is
    process-wide, not per thread."""
    missing = object()
    original = getattr(_F, "scaled_dot_product_attention", missing)

    def routed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
        if _supported(query, key, value, attn_mask, dropout_p):
            return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                is_causal, scale, enable_gqa)
        if original is missing:
            return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                is_causal, scale, enable_gqa)
        kwargs = {} if scale is None else {"scale": scale}
        if enable_gqa:
            kwargs["enable_gqa"] = True
        return original(query, key, value, attn_mask, dropout_p, is_causal, **kwargs)

    _F.scaled_dot_product_attention = routed
    try:
        yield
    finally:
        if original is missing:
            del _F.scaled_dot_product_attention
        else:
            _F.scaled_dot_product_attention = original


def _mha_forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                 attn_mask=None, average_attn_weights=True, is_causal=False):
    """nn.MultiheadAttention.forward through sdpa for the cases it covers (batched 3-D inputs,
    need_weights=False, no bias_k/bias_v, no add_zero_attn, no dropout while training, bool or
    floating masks); the module's own forward otherwise (which takes uint8 masks, for one).
    A floating key_padding_mask together with an attn_mask also takes the module's own forward:
    PyTorch versions merge the two differently (1.13 ORs its nonzero entries into a bool
    attn_mask, 2.x adds it), and a patched module computes what the installed PyTorch does."""
    original = type(self).forward
    float_padding = key_padding_mask is not None and key_padding_mask.dtype != torch.bool
    covered = (not need_weights and query.dim() == 3 and self.bias_k is None
               and not self.add_zero_attn and not (self.training and self.dropout > 0.0)
               and _supported(query, key, value, attn_mask, 0.0)
               and _mask_supported(key_padding_mask)
               and not (float_padding and attn_mask is not None))
    if not covered:
        kwargs = dict(key_padding_mask=key_padding_mask, need_weights=need_weights,
                      attn_mask=attn_mask, average_attn_weights=average_attn_weights)
        if is_causal:
            kwargs["is_causal"] = is_causal
        return original(self, query, key, value, **kwargs)
    if not self.batch_first:  # (L, N, E) -> (N, L, E), views
        query, key, value = (x.transpose(0, 1) for x in (query, key, value))
    N, L, D = query.shape
    S, H = key.shape[1], self.num_heads
    if self._qkv_same_embed_dim:
        wq, wk, wv = self.in_proj_weight.chunk(3)
    else:
        wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
    bq = bk = bv = None
    if self.in_proj_bias is not None:
        bq, bk, bv = self.in_proj_bias.chunk(3)
    # (N, L, D) -> (N, H, L, D / H): views with strides, no copy.
    q = _F.linear(query, wq, bq).view(N, L, H, -1).transpose(1, 2)
    k = _F.linear(key, wk, bk).view(N, S, H, -1).transpose(1, 2)
    v = _F.linear(value, wv, bv).view(N, S, H, -1).transpose(1, 2)
    # MultiheadAttention's masks: bool True means "do not attend"; float masks are added.
    mask = None
    if attn_mask is not None:
        am = attn_mask if attn_mask.dim() == 2 else attn_mask.view(N, H, L, S)
        mask = ~am if am.dtype == torch.bool else am
    if key_padding_mask is not None:
        kp = key_padding_mask.view(N, 1, 1, S)
        kp = ~kp if kp.dtype == torch.bool else kp
        if mask is None:
            mask = kp
        elif mask.dtype == torch.bool:  # kp is bool too (a float one beside a mask falls back)
            mask = mask & kp
        else:
            # A float attn_mask and a bool key_padding_mask: -inf at every padded key, whatever
            # the attn_mask holds there (+inf, NaN), as PyTorch 1.13's masked_fill gives.
            mask = torch.where(kp, mask.to(q.dtype), torch.tensor(-math.inf, dtype=q.dtype))
    out = scaled_dot_product_attention(q, k, v, mask, is_causal=bool(is_causal) and mask is None)
    out = out.transpose(1, 2).reshape(N, L, D)
    out = _F.linear(out, self.out_proj.weight, self.out_proj.bias)
    if not self.batch_first:
        out = out.transpose(0, 1)
    return out, None


def patch(module):
    """Routes every torch.nn.MultiheadAttention in `module` (itself included) through sdpa, for
    the calls _mha_forward covers (need_weights=False: what nn.TransformerEncoderLayer and
    nn.TransformerDecoderLayer pass); other calls keep PyTorch's code. Returns the number of
    modules patched. Undo with unpatch(module)."""
    count = 0
    for m in module.modules():
        if isinstance(m, torch.nn.MultiheadAttention) and "forward" not in m.__dict__:
            m.forward = _mha_forward.__get__(m)
            count += 1
    return count


def unpatch(module):
    """Undoes patch(module); returns the number of modules restored."""
    count = 0
    for m in module.modules():
        if isinstance(m, torch.nn.MultiheadAttention) and "forward" in m.__dict__:
            del m.forward
            count += 1
    return count
