"""Probe: FP8 weights through FP8 tensor-core products, the bf16 activations split into exact FP8 terms (issue 19).

The fused drafter's FP8 phases convert each weight to bf16 in registers and feed ``mma.sync``: per 16 KB chunk a
warp runs about 330 instructions (the bf16 loop: about 120 per 32 KB), so a program streams FP8 at about 17 GB/s and
the FP8 products stay near 1-2.4 TB/s of the whole GPU (session 28's profile; session 29's `fp8_convert.json`). An
FP8 x FP8 product (``wgmma`` on sm_90) reads the weights straight from shared memory, with no conversion at all;
what it needs is FP8 activations. A bf16 value has 8 significant bits and an e4m3 value 4, so

    x * s = hi + lo * 2^-t,    hi = e4m3(x * s),   lo = e4m3((x * s - hi) * 2^t)

holds exactly wherever both terms stay inside e4m3's exponent range (``s`` and ``2^t`` per row, powers of two, so
the scaling itself is exact): the rounding residual ``x * s - hi`` is a multiple of x's last bit no larger than half
hi's, 4 significant bits at most. Elements far below their row's largest (beyond about 2^-10 of it) keep fewer
bits; the product's error from them is bounded by about 2^-17 of ``max|x| * sum|w|``, far below the rounding of the
bf16 activations themselves. A third term (``split3``) makes even those exact down to about 2^-24.

The terms are stacked as the rows of one 64-row MMA tile (16 rows per term: two or three of its four row blocks),
one FP8 product gives every term's partial sums, and the rows are combined after the reduction loop:
``y[r] = sum_t acc[16 t + r] / scale_t[r]``. This probe streams the 8B EAGLE-3 head's product shapes with one
persistent program per SM, as ``fp8_convert.py`` does, and times against it in the same run:

- ``bf16``: bf16 weights, ``mma.sync`` on 16 rows (the drafter's bf16 products; ``fp8_convert.py``'s mode 0);
- ``fp8-bits``: e4m3 weights converted in registers (the drafter's FP8 products, ``_wcast``; its mode 2);
- ``fp8-split2``, ``fp8-split3``: the activations as 2 or 3 e4m3 terms (prepared on the host here, as a producer
  phase would store them), FP8 x FP8 products.

Each row reports the median CUDA-event time, the weight bytes per second and the largest error against
``x @ dequant(W).T`` computed in float64, relative to ``max|x| * max_row sum|w|`` (the scale of the product's
rounding). GPU only.

    python bench/probes/fp8_split_wgmma.py --out DIR
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))

from fp8_convert import stream_kernel  # noqa: E402  (modes 0 and 2: the bf16 and the drafter's FP8 product)
from weight_layout import timed_or_record, write_probe_json  # noqa: E402

_E4M3_MAX = 448.0


@triton.jit
def split_kernel(X8, INV, W, Y, M, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 STAGES: tl.constexpr, NPROG: tl.constexpr, TERMS: tl.constexpr):
    """``Y[:M] = sum_t X8[16 t + r] * INV[16 t + r] @ W.T``: the terms of each row in row blocks of one 64-row tile
    (X8 ``[64, K]`` e4m3, rows of unused terms zero; INV ``[64]`` the terms' inverse scales)."""
    pid = tl.program_id(0)
    offm = tl.arange(0, 64)
    offn = tl.arange(0, BN)
    offk = tl.arange(0, BK)
    rok = (offm % 16 < M) & (offm < 16 * TERMS)
    inv = tl.load(INV + offm)
    for t in range(pid, N // BN, NPROG):
        acc = tl.zeros([64, BN], dtype=tl.float32)
        for c in tl.range(0, K // BK, num_stages=STAGES):
            x = tl.load(X8 + offm[:, None] * K + c * BK + offk[None, :], mask=rok[:, None], other=0.0,
                        cache_modifier=".cg")
            w = tl.load(W + (t * BN + offn).to(tl.int64)[:, None] * K + c * BK + offk[None, :])
            acc = tl.dot(x, tl.trans(w), acc)
        y = tl.sum(tl.reshape(acc * inv[:, None], (4, 16, BN)), axis=0)
        offr = tl.arange(0, 16)
        tl.store(Y + offr[:, None] * N + t * BN + offn[None, :], y, mask=(offr < M)[:, None])


def split_terms(x: torch.Tensor, terms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of ``x [M <= 16, K]`` as ``terms`` e4m3 terms with power-of-two scales: ``X8 [64, K]`` (term t in
    rows 16 t ..) and the inverse scales ``INV [64]``; ``sum_t X8[16 t + r] * INV[16 t + r]`` is row r."""
    m, k = x.shape
    x8 = torch.zeros(64, k, dtype=torch.float8_e4m3fn, device=x.device)
    inv = torch.zeros(64, dtype=torch.float32, device=x.device)
    rest = x.double()
    for t in range(terms):
        amax = rest.abs().amax(dim=1).clamp_min(2.0**-100)
        scale = torch.exp2(torch.floor(torch.log2(_E4M3_MAX / amax)))  # a power of two: exact scaling
        q = (rest * scale[:, None]).to(torch.float8_e4m3fn)
        x8[16 * t:16 * t + m] = q
        inv[16 * t:16 * t + m] = (1.0 / scale).float()
        rest = rest - q.double() / scale[:, None]
    return x8, inv


def _launcher(mode, x, splits, wb, w8, y, mnk, tiling, sms):
    """``(go, weight bytes)``: ``go(i)`` launches ``mode``'s product once on weight copy ``i``."""
    m, n, k = mnk
    bn, bk, stages, nw = tiling
    if mode in ("bf16", "fp8-bits"):
        ws, smode = (wb, 0) if mode == "bf16" else (w8, 2)

        def go(i):
            stream_kernel[(sms,)](x, ws[i], y, m, n, k, 16, bn, bk, stages, sms, smode, num_warps=nw)
    else:
        terms = int(mode[-1])
        x8, inv = splits[terms]

        def go(i):
            split_kernel[(sms,)](x8, inv, w8[i], y, m, n, k, bn, bk, stages, sms, terms, num_warps=nw)

    return go, n * k * wb[0].element_size() if mode == "bf16" else n * k


def _alternating(go):
    """``go`` on the two weight copies in turn (no L2 reuse between runs)."""
    it = [0]

    def run():
        it[0] ^= 1
        go(it[0])

    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=10, help="activation rows (a 60/7/10 tree step: 10)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    # the 8B EAGLE-3 head's products (N outputs x K reduction) and the drafter's tile widths
    shapes = {"o 4096x4096": (4096, 4096, 64), "down 4096x14336": (4096, 14336, 64),
              "gate 14336x4096": (14336, 4096, 64), "lm_head 32000x4096": (32000, 4096, 128)}
    configs = {"bf16": [(256, 4, 8)], "fp8-bits": [(256, 4, 8), (256, 4, 4)],
               "fp8-split2": [(128, 4, 4), (128, 6, 4), (256, 4, 4), (128, 4, 8), (256, 3, 8)],
               "fp8-split3": [(128, 4, 4), (256, 4, 4)]}
    rows = []
    torch.manual_seed(0)
    m = args.rows
    for name, (n, k, bn) in shapes.items():
        w16 = [torch.randn(n, k, device=dev) * 0.05 for _ in range(2)]
        w8 = [w.to(torch.float8_e4m3fn) for w in w16]
        wb = [w.to(torch.bfloat16) for w in w16]
        del w16
        # activations with a realistic spread: RMS-normalised rows with a few large features
        x = torch.randn(m, k, device=dev)
        x[:, torch.randint(0, k, (8,))] *= 30
        x = x.to(torch.bfloat16)
        ref = x.double() @ w8[0].double().T
        scale = float(x.double().abs().max() * w8[0].double().abs().sum(dim=1).max())
        y = torch.empty(m, n, device=dev, dtype=torch.float32)
        splits = {t: split_terms(x, t) for t in (2, 3)}
        for mode, cfgs in configs.items():
            for bk, stages, nw in cfgs:
                go, nbytes = _launcher(mode, x, splits, wb, w8, y, (m, n, k), (bn, bk, stages, nw), sms)
                ms = timed_or_record(_alternating(go), rows, shape=name, mode=mode, bk=bk, stages=stages, warps=nw)
                if ms is None:
                    continue
                go(0)
                torch.cuda.synchronize()
                err = None if mode == "bf16" else float((y.double() - ref).abs().max() / scale)
                rows.append(dict(shape=name, mode=mode, bk=bk, stages=stages, warps=nw, us=ms * 1e3,
                                 TBps=nbytes / (ms * 1e-3) / 1e12, rel_err=err))
                print(f"{name:20s} {mode:11s} bk {bk:3d} st {stages} w {nw:2d} {ms * 1e3:8.1f} us "
                      f"{nbytes / (ms * 1e-3) / 1e12:5.2f} TB/s  err {err}", flush=True)
    write_probe_json(args.out, "fp8_split_wgmma.json", rows, rows_per_product=m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
