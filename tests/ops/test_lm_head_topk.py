"""lm_head_topk against lm_head_topk_ref: exact ids (including ties) on exactly-representable logits, values
within tolerance on random data, bias, splits, errors; bf16 at the Llama-3.1-8B head shapes on the GPU."""

import pytest
import torch

from eagle_triton.ops.lm_head_topk import lm_head_topk, lm_head_topk_ref


def _grid_inputs(M, V, H, dtype, device, gen, bias):
    """Entries in {-0.75, ..., 0.75} step 0.25: every logit is exact in fp32 whatever the summation order, and
    equal logits are common, so the id tie rule is exercised."""
    x = (torch.randint(-3, 4, (M, H), generator=gen).float() * 0.25).to(device, dtype)
    w = (torch.randint(-3, 4, (V, H), generator=gen).float() * 0.25).to(device, dtype)
    b = (torch.randint(-4, 5, (V,), generator=gen).float() * 0.5).to(device, dtype) if bias else None
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,V,H,k,bias,splits", [
    pytest.param(3, 100, 48, 10, False, None, id="M3-V100-k10"),
    pytest.param(1, 37, 20, 1, True, 3, id="M1-V37-k1-bias-s3"),
    pytest.param(17, 70, 40, 16, True, 2, id="M17-V70-k16-bias-s2"),
    pytest.param(2, 33, 16, 33, False, 1, id="M2-V33-k=V"),
])
def test_exact_ids_with_ties(M, V, H, k, bias, splits, dtype, device):
    gen = torch.Generator().manual_seed(M * 1000 + V)
    x, w, b = _grid_inputs(M, V, H, dtype, device, gen, bias)
    logp, ids = lm_head_topk(x, w, k, b, num_splits=splits)
    ref_logp, ref_ids = lm_head_topk_ref(x, w, k, b)
    assert logp.dtype == torch.float32 and ids.dtype == torch.int64 and ids.shape == (M, k)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    logits = x.float() @ w.float().T + (b.float() if b is not None else 0)
    assert (logits[:, :, None] == logits[:, None, :]).sum() > logits.numel()  # ties exist (beyond the diagonal)


@pytest.mark.parametrize("M,V,H,k", [(4, 120, 64, 8), (5, 50, 24, 3)])
def test_random_values(M, V, H, k, device):
    gen = torch.Generator().manual_seed(V)
    x = torch.randn(M, H, generator=gen).to(device)
    w = torch.randn(V, H, generator=gen).to(device)
    logp, ids = lm_head_topk(x, w, k)
    ref_logp, ref_ids = lm_head_topk_ref(x, w, k)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    full = torch.log_softmax(x.float() @ w.float().T, -1)
    torch.testing.assert_close(full.gather(1, ids), logp, atol=1e-5, rtol=1e-5)  # ids carry their values
    gaps = (ref_logp[:, :-1] - ref_logp[:, 1:]).min().item() if k > 1 else 1.0
    if gaps > 1e-4:  # well separated: the order must match exactly
        assert torch.equal(ids, ref_ids)


def test_errors(device):
    x = torch.randn(2, 16, device=device)
    w = torch.randn(40, 16, device=device)
    with pytest.raises(ValueError, match="k must be"):
        lm_head_topk(x, w, 0)
    with pytest.raises(ValueError, match="k must be"):
        lm_head_topk(x, w, 41)
    with pytest.raises(ValueError, match="weight"):
        lm_head_topk(x, w[:, :8].contiguous(), 2)
    with pytest.raises(TypeError, match="weight"):
        lm_head_topk(x, w.half(), 2)
    with pytest.raises(ValueError, match="bias"):
        lm_head_topk(x, w, 2, torch.randn(39, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,V", [(10, 32000), (1, 128256), (60, 32000)])
def test_llama8b_head_gpu(M, V, dtype):
    """fp32-accumulated logits of bf16/fp16 inputs: log-probs within the tolerance rule of a same-dtype PyTorch
    head (logits in dtype, log_softmax in fp32), ids equal where the reference's values are separated."""
    gen = torch.Generator().manual_seed(V + M)
    H, k = 4096, 10
    x = torch.randn(M, H, generator=gen).to("cuda", dtype)
    w = (torch.randn(V, H, generator=gen) * 0.02).to("cuda", dtype)
    logp, ids = lm_head_topk(x, w, k)
    ref32, ref_ids = lm_head_topk_ref(x, w, k)
    lowp = torch.log_softmax((x @ w.T).float(), -1).gather(1, ref_ids)
    floor = 2 * (ref32.to(dtype) + 0.3 - 0.3 - ref32.to(dtype)).abs().max().item()
    err = (logp - ref32).abs().max().item()
    assert err <= 2 * (lowp - ref32).abs().max().item() + floor
    full = torch.log_softmax(x.float() @ w.float().T, -1)
    assert (full.gather(1, ids) - logp).abs().max().item() <= 1e-3
    sep = torch.cat([ref32[:, :-1] - ref32[:, 1:], torch.ones(M, 1, device="cuda")], 1) > 1e-3
    sep = sep & torch.cat([torch.ones(M, 1, device="cuda", dtype=torch.bool), sep[:, :-1]], 1)
    assert torch.equal(ids[sep], ref_ids[sep])


@pytest.mark.gpu
def test_cuda_graph_replay_gpu():
    x = torch.randn(10, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(32000, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    lm_head_topk(x, w, 10)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        logp, ids = lm_head_topk(x, w, 10)
    x.normal_()
    g.replay()
    torch.cuda.synchronize()
    logp2, ids2 = lm_head_topk(x, w, 10)
    assert torch.equal(ids, ids2) and torch.equal(logp, logp2)
