"""Probe: what limits the fused drafter's FP8 weight phases (issue 19)?

The fused drafter's FP8 phases stream ``W[N, K]`` (e4m3, one byte per weight) in ``[BN, BK]`` tiles for a 16-row
product and convert each tile to bf16 in registers (``tl.load(w).to(tl.bfloat16)``). In the session-15 profile the
FP8 o and down phases were *slower* than bf16 with half the bytes. This probe streams the drafter's product shapes
with one persistent program per SM (whole output tiles per program, as the drafter's fc/o/down/gate/lm_head phases
do), 8 warps, and times the conversion variants against the bf16 product:

- ``bf16``: bf16 weights (the baseline);
- ``fp8-cvt``: e4m3 weights, ``.to(tl.bfloat16)`` (Triton's conversion: ``cvt`` instructions, which issue at a
  fraction of the ALU rate);
- ``fp8-bits``: e4m3 weights converted with integer operations (``prmt``/``shr``/``and``/``lop3``: the byte's sign,
  exponent and mantissa moved into bf16's fields) and one ``mul.bf16x2`` by 2^120 (the exponent bias difference;
  exact, subnormals included): the fused drafter's ``_wcast`` (this probe first held its own copy of the PTX,
  session 15's ``fp8_convert.json`` was measured with it);
- ``fp8-f16``: e4m3 -> fp16 (one ``cvt.rn.f16x2.e4m3x2`` per pair) with the activations cast to fp16 (fp16
  products; not what the drafter computes, timed only to see the conversion's cost);
- ``fp8-bits-2acc``, ``bf16-2acc`` (session 29): each chunk's reduction split in two halves with an accumulator each
  (two independent ``mma`` chains per warp instead of one; the halves come from ``reshape``/``permute``/``split``);
- ``bf16-ksplit``, ``fp8-bits-ksplit`` (session 31): each chunk's reduction split into ``WARPS`` slices, one per warp
  (a batched ``[WARPS, BM, BK / WARPS] @ [WARPS, BK / WARPS, BN]`` product: ``mma`` layout ``warpsPerCTA =
  [WARPS, 1, 1]``), each warp's accumulator ``[BM, BN]`` summed across the warps once per tile. Every warp then
  loads only its slice of the activations (the 2-D product gives each warp a slice of the columns and the whole
  activation chunk) and runs ``BN / 8`` independent ``mma`` chains of ``BK / WARPS / 16`` steps instead of one of
  ``BK / 16``;
- ``fp8-bits-noscale`` (session 31): ``fp8-bits`` without the multiply by 2^120 (three integer operations and half
  a ``prmt`` per pair instead of four and a half): the bf16 weight is the e4m3 one times 2^-120 exactly (e4m3
  subnormals as bf16 subnormals), the activations are passed in times 2^100 (exact in bf16) and the product is
  multiplied by 2^20 afterwards, so the sums are those of ``fp8-bits`` scaled by a power of two if the tensor cores
  take bf16 subnormal inputs as they are (the probe reports whether the result equals ``fp8-bits``' bit for bit);
- ``fp8-bits-halves`` (session 31, ``--rows`` 17-32: 32-row tiles): the 32-row product as two 16-row products on
  the same converted tile. A 32-row ``mma.sync`` product puts the 8 warps in a 2 x 4 grid (compiled for sm_90), so
  each weight is converted by two warps (twice the ``prmt`` of the 16-row product); two 16-row products keep the
  warps in a 1 x 8 row and convert each weight once. (At 64 rows and more sm_90 runs ``wgmma``, with the converted
  tile in shared memory: converted once.);
- ``fp8-bits-2load``, ``bf16-2load`` (session 35): two accumulators as ``-2acc``, but each fed by its own load of
  half the chunk (``[BN, BK / 2]`` tiles at k offsets 0 and ``BK / 2``, each pipelined by ``tl.range``), so no
  loaded register tile is split: two independent ``mma`` chains of ``BK / 32`` steps per warp instead of one of
  ``BK / 16`` (the sm_90 build of the drafter's FP8 loop has one chain of 8 per 128-deep chunk, and a chunk takes
  about 0.5 us where its instructions issue in about 0.2);
- ``bf16-swap``, ``fp8-swap`` (session 27): the product transposed, ``acc[BN, BM] += W_tile @ x.T``: the weight
  tile is the MMA's M side (64 or 128 rows), which sm_90 runs as ``wgmma`` (bf16: both operands from shared
  memory; FP8: the converted weights from registers), where the 16-row product runs as ``mma.sync`` with both
  operands staged through registers. Compiled for sm_90 without a GPU, the swapped products are the only ones
  that use ``wgmma``.

Each variant also checks its product against ``x @ dequant(W).T`` in fp32 (bits of the dequantised weights are exact
in all variants, so only the accumulation order differs). Runs back to back on two copies of the weights (no L2
reuse) and reports the median CUDA-event time and the weight bytes per second. GPU only.

    python bench/probes/fp8_convert.py --out DIR [--modes ...] [--shapes o,down,gate,lm_head]
        [--configs BK:STAGES:WARPS[:PPS],...]   (default 256:4:8,512:3:8,128:6:8; PPS: programs per SM, 1)

Session 41: ``PPS`` programs per SM (``PPS * sms`` programs) and the ``bal`` shape (264 tiles of 64, so 132 or 264
programs take the same number of tiles each) ask whether a loop bound by each warp's chain gains from two
independent programs per SM (e.g. 4 warps x 2, the warps of one program no longer held by the other's barriers).
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

from weight_layout import timed_or_record, write_probe_json  # noqa: E402

from eagle_triton.fused.kernel import _wcast  # noqa: E402  (the drafter's own conversion: integer operations)

# e4m3 -> bf16 times 2^-120 (fp8-bits-noscale): _wcast's integer operations without its final multiply
_E4M3_BF16_SCALED_ASM = tl.constexpr("""{
.reg .b32 lo, hi, s, u;
prmt.b32 lo, $2, 0, 0x1404;
prmt.b32 hi, $2, 0, 0x3424;
shr.b32 s, lo, 4;
and.b32 u, lo, 0x80008000;
lop3.b32 $0, s, 0x07F007F0, u, 0xEA;
shr.b32 s, hi, 4;
and.b32 u, hi, 0x80008000;
lop3.b32 $1, s, 0x07F007F0, u, 0xEA;
}""")


@triton.jit
def _wcast_scaled(w):
    return tl.inline_asm_elementwise(_E4M3_BF16_SCALED_ASM, "=r,=r,r", [w.to(tl.uint8, bitcast=True)],
                                     dtype=tl.bfloat16, is_pure=True, pack=4)


@triton.jit
def stream_kernel(X, W, Y, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr, STAGES: tl.constexpr, NPROG: tl.constexpr, MODE: tl.constexpr,
                  KS: tl.constexpr):
    """MODE 0: W in X's dtype; 1: e4m3 W, ``.to(bf16)``; 2: e4m3 W, integer conversion; 3: e4m3 W and X as fp16;
    4: MODE 2 transposed (``acc[BN, BM] += W @ x.T``); 5: MODE 0 transposed; 6: MODE 2 and 7: MODE 0 with two
    accumulators (each chunk's halves); 8: MODE 0 and 9: MODE 2 with the reduction split over ``KS`` warps; 10:
    e4m3 W converted to bf16 times 2^-120 (X and Y scaled by the caller); 11: MODE 2 for BM = 32 as two 16-row
    products sharing the converted tile; 12: MODE 2 and 13: MODE 0 with two accumulators, each fed by its own load
    of half the chunk."""
    pid = tl.program_id(0)
    offm = tl.arange(0, BM)
    offn = tl.arange(0, BN)
    offk = tl.arange(0, BK)
    rok = offm < M
    NC: tl.constexpr = K // BK
    NT: tl.constexpr = N // BN
    offs = tl.arange(0, KS)[:, None, None]
    offks = tl.arange(0, BK // KS)[None, None, :]
    for t in range(pid, NT, NPROG):
        if MODE == 8 or MODE == 9:
            acc3 = tl.zeros([KS, BM, BN], dtype=tl.float32)
            for c in tl.range(0, NC, num_stages=STAGES):
                kk = c * BK + offs * (BK // KS) + offks
                x = tl.load(X + offm[None, :, None] * K + kk, mask=rok[None, :, None], other=0.0,
                            cache_modifier=".cg")
                w = tl.load(W + (t * BN + offn).to(tl.int64)[None, :, None] * K + kk)
                if MODE == 9:
                    w = _wcast(w, tl.bfloat16)
                acc3 = tl.dot(x, tl.trans(w, (0, 2, 1)), acc3)
            acc = tl.sum(acc3, axis=0)
            tl.store(Y + offm[:, None] * N + t * BN + offn[None, :], acc, mask=rok[:, None])
        elif MODE == 12 or MODE == 13:
            HK: tl.constexpr = BK // 2
            offh = tl.arange(0, HK)
            acc_a = tl.zeros([BM, BN], dtype=tl.float32)
            acc_b = tl.zeros([BM, BN], dtype=tl.float32)
            for c in tl.range(0, NC, num_stages=STAGES):
                ka = c * BK + offh
                wrow = (t * BN + offn).to(tl.int64)[:, None] * K
                x_a = tl.load(X + offm[:, None] * K + ka[None, :], mask=rok[:, None], other=0.0, cache_modifier=".cg")
                x_b = tl.load(X + offm[:, None] * K + HK + ka[None, :], mask=rok[:, None], other=0.0,
                              cache_modifier=".cg")
                w_a = tl.load(W + wrow + ka[None, :])
                w_b = tl.load(W + wrow + HK + ka[None, :])
                if MODE == 12:
                    w_a = _wcast(w_a, tl.bfloat16)
                    w_b = _wcast(w_b, tl.bfloat16)
                acc_a = tl.dot(x_a, tl.trans(w_a), acc_a)
                acc_b = tl.dot(x_b, tl.trans(w_b), acc_b)
            tl.store(Y + offm[:, None] * N + t * BN + offn[None, :], acc_a + acc_b, mask=rok[:, None])
        elif MODE == 11:
            HM: tl.constexpr = BM // 2
            offh = tl.arange(0, HM)
            acc_lo = tl.zeros([HM, BN], dtype=tl.float32)
            acc_hi = tl.zeros([HM, BN], dtype=tl.float32)
            for c in tl.range(0, NC, num_stages=STAGES):
                xo = offh[:, None] * K + c * BK + offk[None, :]
                x_lo = tl.load(X + xo, mask=(offh < M)[:, None], other=0.0, cache_modifier=".cg")
                x_hi = tl.load(X + HM * K + xo, mask=(offh + HM < M)[:, None], other=0.0, cache_modifier=".cg")
                wc = tl.trans(_wcast(tl.load(W + (t * BN + offn).to(tl.int64)[:, None] * K + c * BK + offk[None, :]),
                                     tl.bfloat16))
                acc_lo = tl.dot(x_lo, wc, acc_lo)
                acc_hi = tl.dot(x_hi, wc, acc_hi)
            tl.store(Y + offh[:, None] * N + t * BN + offn[None, :], acc_lo, mask=(offh < M)[:, None])
            tl.store(Y + (offh + HM)[:, None] * N + t * BN + offn[None, :], acc_hi, mask=(offh + HM < M)[:, None])
        else:
            if MODE < 4 or MODE >= 6:
                acc = tl.zeros([BM, BN], dtype=tl.float32)
                acc2 = tl.zeros([BM, BN], dtype=tl.float32)
            else:
                acc = tl.zeros([BN, BM], dtype=tl.float32)
            for c in tl.range(0, NC, num_stages=STAGES):
                woff = (t * BN + offn).to(tl.int64)[:, None] * K + c * BK + offk[None, :]
                x = tl.load(X + offm[:, None] * K + c * BK + offk[None, :], mask=rok[:, None], other=0.0,
                            cache_modifier=".cg")
                w = tl.load(W + woff)
                if MODE == 0:
                    acc = tl.dot(x, tl.trans(w), acc)
                elif MODE == 1:
                    acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
                elif MODE == 2:
                    acc = tl.dot(x, tl.trans(_wcast(w, tl.bfloat16)), acc)
                elif MODE == 10:
                    acc = tl.dot(x, tl.trans(_wcast_scaled(w)), acc)
                elif MODE == 3:
                    acc = tl.dot(x.to(tl.float16), tl.trans(w.to(tl.float16)), acc)
                elif MODE >= 6:
                    wc = _wcast(w, tl.bfloat16) if MODE == 6 else w
                    wa, wb = tl.split(tl.permute(tl.reshape(wc, (BN, 2, BK // 2)), (0, 2, 1)))
                    xa, xb = tl.split(tl.permute(tl.reshape(x, (BM, 2, BK // 2)), (0, 2, 1)))
                    acc = tl.dot(xa, tl.trans(wa), acc)
                    acc2 = tl.dot(xb, tl.trans(wb), acc2)
                elif MODE == 4:
                    acc = tl.dot(_wcast(w, tl.bfloat16), tl.trans(x), acc)
                else:
                    acc = tl.dot(w, tl.trans(x), acc)
            if MODE == 6 or MODE == 7:
                acc = acc + acc2
            if MODE < 4 or MODE >= 6:
                tl.store(Y + offm[:, None] * N + t * BN + offn[None, :], acc, mask=rok[:, None])
            else:
                tl.store(Y + offm[None, :] * N + t * BN + offn[:, None], acc, mask=rok[None, :])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default=None, help="comma list of the variants to time (default: all)")
    ap.add_argument("--shapes", default=None, help="comma list of o, down, gate, lm_head (default: all)")
    ap.add_argument("--rows", type=int, default=10, help="activation rows (1-32; 10 = a 60/7/10 step of one "
                    "sequence, 20 of two); the row tile is the next power of two >= 16")
    ap.add_argument("--configs", default="256:4:8,512:3:8,128:6:8",
                    help="comma list of BK:STAGES:WARPS[:PPS] launch configurations (PPS: programs per SM, default "
                    "1), each timed for every mode and shape")
    args = ap.parse_args(argv)
    if not 1 <= args.rows <= 32:
        raise SystemExit("--rows: 1 to 32")
    rows_m, bm = args.rows, max(16, triton.next_power_of_2(args.rows))
    if "fp8-bits-halves" in (args.modes or "").split(",") and bm != 32:
        raise SystemExit("--modes fp8-bits-halves needs --rows 17 to 32 (a 32-row tile)")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    # the 8B EAGLE-3 head's products (N outputs x K reduction) and the drafter's tile widths
    shapes = {"o 4096x4096": (4096, 4096, 64), "down 4096x14336": (4096, 14336, 64),
              "gate 14336x4096": (14336, 4096, 64), "lm_head 32000x4096": (32000, 4096, 128),
              "bal 16896x4096": (16896, 4096, 64)}
    if args.shapes:
        wanted = args.shapes.split(",")
        unknown = sorted(set(wanted) - {s.split()[0] for s in shapes})
        if unknown:
            raise SystemExit(f"--shapes: unknown {unknown}; known: o, down, gate, lm_head, bal")
        shapes = {s: v for s, v in shapes.items() if s.split()[0] in wanted}
    configs = [tuple(int(v) for v in c.split(":")) for c in args.configs.split(",")]
    if any(len(c) not in (3, 4) for c in configs):
        raise SystemExit("--configs: each entry is BK:STAGES:WARPS[:PPS]")
    configs = [c if len(c) == 4 else (*c, 1) for c in configs]
    modes = {"bf16": 0, "fp8-cvt": 1, "fp8-bits": 2, "fp8-f16": 3, "fp8-swap": 4, "bf16-swap": 5,
             "fp8-bits-2acc": 6, "bf16-2acc": 7, "bf16-ksplit": 8, "fp8-bits-ksplit": 9,
             "fp8-bits-noscale": 10, "fp8-bits-halves": 11, "fp8-bits-2load": 12, "bf16-2load": 13}
    if args.modes:
        unknown = sorted(set(args.modes.split(",")) - set(modes))
        if unknown:
            raise SystemExit(f"--modes: unknown {unknown}; known: {', '.join(modes)}")
        modes = {m: modes[m] for m in args.modes.split(",")}
    rows = []
    torch.manual_seed(0)
    for name, (n, k, bn) in shapes.items():
        w16 = [torch.randn(n, k, device=dev) * 0.05 for _ in range(2)]
        w8 = [w.to(torch.float8_e4m3fn) for w in w16]
        wb = [w.to(torch.bfloat16) for w in w16]
        x = torch.randn(rows_m, k, device=dev, dtype=torch.bfloat16)
        x_up = x * 2.0 ** 100  # exact in bf16 (fp8-bits-noscale's activations)
        ref = x.float() @ w8[0].float().T
        y = torch.empty(rows_m, n, device=dev, dtype=torch.float32)
        for mname, mode in modes.items():
            for bk, stages, nw, pps in configs:
                ws = wb if mode in (0, 5, 7, 8, 13) else w8
                nbytes = n * k * ws[0].element_size()
                it = [0]

                xin = x_up if mode == 10 else x

                nprog = sms * pps

                def go(it=it, ws=ws, x=xin, y=y, n=n, k=k, bn=bn, bk=bk, stages=stages, mode=mode, nw=nw,
                       nprog=nprog):
                    i = it[0] = it[0] ^ 1
                    stream_kernel[(nprog,)](x, ws[i], y, rows_m, n, k, bm, bn, bk, stages, nprog, mode, nw,
                                            num_warps=nw)

                ms = timed_or_record(go, rows, shape=name, mode=mname, bk=bk, stages=stages, warps=nw,
                                     programs_per_sm=pps)
                if ms is None:
                    continue
                it[0] = 1  # the next run uses copy 0
                go()
                torch.cuda.synchronize()
                err, same = None, None
                if mode in (10, 11):  # (10: back to the product's scale) bit for bit against fp8-bits' product
                    if mode == 10:
                        y.mul_(2.0 ** 20)
                    y2 = torch.empty_like(y)
                    stream_kernel[(nprog,)](x, ws[0], y2, rows_m, n, k, bm, bn, bk, stages, nprog, 2, nw,
                                            num_warps=nw)
                    same = bool(torch.equal(y, y2))
                if mode in (1, 2, 4, 6, 9, 10, 11, 12, 13):
                    err = float((y - ref).abs().max() / ref.abs().max())
                rows.append(dict(shape=name, mode=mname, rows=rows_m, bk=bk, stages=stages, warps=nw,
                                 programs_per_sm=pps, us=ms * 1e3,
                                 TBps=nbytes / (ms * 1e-3) / 1e12, max_rel_err=err, equal_to_fp8_bits=same))
                tail = "" if same is None else f"  equal {same}"
                print(f"{name:20s} {mname:13s} bk {bk:3d} st {stages} w {nw:2d} p {pps}  {ms * 1e3:8.1f} us  "
                      f"{nbytes / (ms * 1e-3) / 1e12:5.2f} TB/s  err {err}{tail}", flush=True)
    write_probe_json(args.out, "fp8_convert.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
