"""The FP8 product probe's kernel (bench/probes/fp8_convert.py): its 16-bit modes compute ``x @ W.T`` (the FP8
modes need the GPU: inline PTX), with awkward row counts and several tiles per program; fp32 operands under the
interpreter (its bf16 products are not exact), bf16 on a GPU. Session 35's two-load mode feeds each accumulator
from its own half-chunk loads."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def probe():
    sys.path.insert(0, str(ROOT / "bench" / "probes"))
    try:
        import fp8_convert
    finally:
        sys.path.remove(str(ROOT / "bench" / "probes"))
    return fp8_convert


@pytest.mark.parametrize("mode", [0, 7, 13], ids=["bf16", "bf16-2acc", "bf16-2load"])
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_probe_product_modes_compute_x_times_w_transposed(probe, mode, rows):
    gpu = torch.cuda.is_available()
    dev, dt = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    n, k, bn, bk = 48, 96, 16, 32  # 3 output tiles over 2 programs, 3 chunks each
    x, w = torch.randn(rows, k, device=dev, dtype=dt), torch.randn(n, k, device=dev, dtype=dt)
    y = torch.full((rows, n), float("nan"), device=dev)
    probe.stream_kernel[(2,)](x, w, y, rows, n, k, 16, bn, bk, 1, 2, mode, 1, num_warps=4)
    # exact operands, fp32 sums in another order: a few fp32 ulps of sum |x w| (k = 96 terms)
    bound = 1e-5 * (x.float().abs() @ w.float().abs().T) + 1e-6
    assert ((y - x.float() @ w.float().T).abs() <= bound).all()
