"""sdpa.torch's layouts: strided inputs are read in place (the results are those of contiguous
copies, bit for bit), out is laid out in memory like the query and each gradient like its input,
so that the transposes a model does around attention are views, never copies."""
import math

import pytest

torch = pytest.importorskip("torch")

import sdpa.torch as st  # noqa: E402


def packed_views(N, L, H, E, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, L, 3 * H * E, dtype=dtype, generator=g)
    qkv = x.view(N, L, 3, H, E)
    return [qkv[:, :, i].transpose(1, 2) for i in range(3)]  # (N, H, L, E) views


def test_out_and_gradients_follow_the_input_layout():
    N, L, H, E = 2, 70, 4, 16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, L, 3 * H * E, generator=g, requires_grad=True)  # the projection's output
    qkv = x.view(N, L, 3, H, E)
    views = [qkv[:, :, i].transpose(1, 2) for i in range(3)]  # (N, H, L, E) views
    seen = [None] * 3
    for i, t in enumerate(views):  # the gradients the Function hands back, before autograd's sums
        t.register_hook(lambda grad, i=i: seen.__setitem__(i, grad))
    out = st.scaled_dot_product_attention(*views, is_causal=True)
    # out lies as (N, L, H, E): the model's transpose back and reshape are views.
    assert out.shape == (N, H, L, E)
    assert out.transpose(1, 2).is_contiguous()
    merged = out.transpose(1, 2).reshape(N, L, H * E)
    assert merged.data_ptr() == out.data_ptr(), "the reshape after attention copied"
    grad = torch.randn(N, L, H * E, generator=g)
    merged.backward(grad)
    for t, s in zip(views, seen):
        assert s.shape == t.shape and s.stride(-1) == 1
        assert s.transpose(1, 2).is_contiguous(), "a gradient not laid out like its input"
    # The same call on contiguous copies: the same bits.
    copies = [t.detach().contiguous().requires_grad_(True) for t in views]
    ref = st.scaled_dot_product_attention(*copies, is_causal=True)
    ref.transpose(1, 2).reshape(N, L, H * E).backward(grad)
    assert torch.equal(out, ref)
    for s, c in zip(seen, copies):
        assert torch.equal(s, c.grad)


def test_broadcast_kv_heads_and_c_order_queries():
    N, H, L, S, E = 1, 4, 40, 50, 8
    q = torch.randn(N, H, L, E, dtype=torch.float64, requires_grad=True)
    k0 = torch.randn(N, 1, S, E, dtype=torch.float64, requires_grad=True)
    v0 = torch.randn(N, 1, S, E, dtype=torch.float64, requires_grad=True)
    k, v = k0.expand(N, H, S, E), v0.expand(N, H, S, E)  # stride 0 over the heads
    out = st.scaled_dot_product_attention(q, k, v)
    assert out.is_contiguous()  # a C-order query gives a C-order out
    s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(E)
    want = torch.matmul(torch.softmax(s, -1), v)
    assert torch.allclose(out, want, rtol=0, atol=1e-12)
    out.sum().backward()
    want_k = torch.autograd.grad(want.sum(), k0, retain_graph=True)[0]
    assert torch.allclose(k0.grad, want_k, rtol=0, atol=1e-11)
