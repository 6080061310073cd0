"""count_traffic: the bytes an eager module's memory-bound ops read and write, from the ops it dispatches."""

from __future__ import annotations

import pytest
import torch

from autopar.profile.eager_traffic import count_traffic, counted, fused_attention

T, H = 6, 8  # tokens, hidden


def test_an_elementwise_op_reads_its_input_and_writes_its_output():
    x = torch.randn(T, H, requires_grad=True)
    c = count_traffic(lambda: x * 2.0)
    assert c.fwd_bytes == 2 * T * H * 4  # read x, write the product (fp32)
    assert c.bwd_bytes == 2 * T * H * 4  # the gradient: grad * 2
    assert c.by_op["mul"] == c.fwd_bytes
    assert (c.fwd_kernels, c.bwd_kernels) == (1, 1)


def test_matmuls_and_views_move_nothing_counted():
    x = torch.randn(T, H, requires_grad=True)
    w = torch.randn(H, 3 * H, requires_grad=True)
    c = count_traffic(lambda: (x @ w).view(T, 3, H).transpose(0, 1))
    assert c.fwd_bytes == 0
    assert c.bwd_bytes == 0
    assert c.fwd_kernels == 1  # the matmul launches a kernel; the view and transpose do not
    assert not counted("mm") and not counted("view") and not counted("_scaled_dot_product_flash_attention")
    assert counted("add_") and counted("_to_copy") and counted("zeros")  # a fill writes its output
    assert not counted("empty_like")  # an allocation writes nothing


def test_an_upcasting_rmsnorm_moves_nine_times_its_tensor():
    """torchtitan's eager RMSNorm on bf16 x [T, H]: x.float() (2 + 4 bytes an element), pow (4 + 4), mean (4 and
    a row), x * rsqrt (4 + 4 and a row), type_as (4 + 2), * weight (2 + 2 and the weight): 36 bytes an element,
    the per-row statistic 24 bytes a row (mean's output, + eps, rsqrt, its read in the product), the weight's 2."""
    x = torch.randn(T, H, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.ones(H, dtype=torch.bfloat16, requires_grad=True)

    def norm():
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * weight

    c = count_traffic(norm)
    assert c.fwd_bytes == 36 * T * H + 24 * T + 2 * H
    assert c.bwd_bytes > c.fwd_bytes  # autograd's backward of each op, as many passes again and more


def test_meta_tensors_count_the_same_without_computing():
    def run(device):
        x = torch.empty(T, H, device=device, requires_grad=True)
        return count_traffic(lambda: torch.nn.functional.silu(x) * x)

    real, meta = run("cpu"), run("meta")
    assert (meta.fwd_bytes, meta.bwd_bytes) == (real.fwd_bytes, real.bwd_bytes) != (0, 0)


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_fused_attention_has_a_flash_kernel_s_shapes_and_no_counted_traffic(kv_heads):
    q = torch.empty(2, 4, 16, 8, device="meta", requires_grad=True)
    k = torch.empty(2, kv_heads, 16, 8, device="meta", requires_grad=True)
    v = torch.empty(2, kv_heads, 16, 8, device="meta", requires_grad=True)
    c = count_traffic(lambda: fused_attention(q, k, v))
    assert (c.fwd_bytes, c.bwd_bytes) == (0, 0)
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
