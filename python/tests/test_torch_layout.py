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


def test_out_of_a_transposed_query_may_be_modified_in_place():
    # out laid out like an (N, L, H, E) view is a tensor of its own with those strides, not a
    # view of a buffer: PyTorch forbids in-place changes of a view that an autograd Function
    # returns, and a model may well write into its attention's output (out *= gate).
    N, L, H, E = 2, 6, 3, 8
    x = torch.randn(N, L, 3, H, E, dtype=torch.float64, requires_grad=True)
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    out = st.scaled_dot_product_attention(q, k, v)
    assert out.transpose(1, 2).is_contiguous() and out._base is None
    before = out.detach().clone()
    out.mul_(2.0)  # raised RuntimeError ("... is a view and is being modified inplace")
    assert torch.equal(out.detach(), 2.0 * before)
    with torch.no_grad():
        out2 = st.scaled_dot_product_attention(q, k, v)
    out2.add_(1.0)
    assert torch.equal(out2, before + 1.0)
    # Gradients flow as before where out is not changed in place.
    out3 = st.scaled_dot_product_attention(q, k, v)
    (g,) = torch.autograd.grad(out3.transpose(1, 2).reshape(N, L, H * E).sum(), x)
    ref = x.detach().clone().requires_grad_(True)
    rq, rk, rv = (ref[:, :, i].transpose(1, 2) for i in range(3))
    s = torch.softmax(rq @ rk.transpose(-2, -1) / math.sqrt(E), -1) @ rv
    (g_ref,) = torch.autograd.grad(s.sum(), ref)
    assert torch.allclose(g, g_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", [(2, 0, 5, 4), (0, 3, 5, 4), (2, 3, 0, 4)])
def test_empty_outputs_laid_out_like_a_transposed_query(shape):
    N, H, L, E = shape
    q = torch.randn(N, L, H, E).transpose(1, 2).requires_grad_(True)
    k = torch.randn(N, 7, H, E).transpose(1, 2).requires_grad_(True)
    out = st.scaled_dot_product_attention(q, k, k)
    assert out.shape == (N, H, L, E)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    assert not q.grad.any() and not k.grad.any()


def test_misaligned_inputs_are_read_through_aligned_copies():
    # torch.frombuffer at an odd byte offset gives float32 data that does not start at a multiple
    # of 4 bytes; the results and gradients are those of aligned copies.
    N, H, L, E = 1, 2, 9, 8
    g = torch.Generator().manual_seed(3)
    aligned = [torch.randn(N, H, L, E, generator=g) for _ in range(3)]
    shifted = []
    for t in aligned:
        raw = bytearray(t.numel() * 4 + 1)
        view = torch.frombuffer(raw, dtype=torch.float32, count=t.numel(), offset=1)
        view.copy_(t.reshape(-1))
        assert view.data_ptr() % 4 != 0
        shifted.append(view.view(N, H, L, E).requires_grad_())
    leaves = [t.clone().requires_grad_() for t in aligned]
    want = st.scaled_dot_product_attention(*leaves, is_causal=True)
    got = st.scaled_dot_product_attention(*shifted, is_causal=True)
    assert torch.equal(got, want)
    grad = torch.randn(want.shape, generator=g)
    want.backward(grad)
    got.backward(grad)
    for s, a in zip(shifted, leaves):
        assert torch.equal(s.grad, a.grad)
