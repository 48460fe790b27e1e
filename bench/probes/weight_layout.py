"""Probe: does the weight layout or the schedule limit how fast the fused drafter's phases stream?

The drafter's weight phases stream ``W[N, K]`` in ``[BN, BK]`` tiles for a 10-row product. This probe streams the
same shapes with one persistent program per SM and nothing else in the loop: row-major (as checkpoints store them)
or tile-packed (every tile contiguous, a program's work one contiguous range), whole output tiles per program or
stream-K (equal contiguous chunk ranges; partial sums are not combined, only the streaming is timed), one matrix or
two per chunk (like gate/up). Each variant runs back to back on two copies of the weights (no L2 reuse, and no L2
clearing: do_bench's clearing leaves dirty lines whose write-backs slow the next kernel's reads) and reports the
median CUDA-event time and, from globaltimer stamps inside the last run, the in-kernel span (first program start to
last program end) as TB/s of weight bytes. GPU only.

    python bench/probes/weight_layout.py [--out DIR]
"""

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def stream_kernel(X, W, W2, Y, T, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr, STAGES: tl.constexpr, NPROG: tl.constexpr, PACKED: tl.constexpr,
                  STREAMK: tl.constexpr, MODE: tl.constexpr):
    """MODE 0: one [BN, BK] tile of W per chunk; 1: the same tile of W and of W2 (two matrices, like gate/up);
    2: two [BN, BK] tiles of the same W rows, K / 2 apart (the two halves of the reduction at once)."""
    pid = tl.program_id(0)
    tl.store(T + pid * 3, _now())
    offm = tl.arange(0, BM)
    offn = tl.arange(0, BN)
    offk = tl.arange(0, BK)
    rok = offm < M
    NC: tl.constexpr = K // BK // (2 if MODE == 2 else 1)
    NT: tl.constexpr = N // BN
    TOT: tl.constexpr = NT * NC
    if STREAMK:
        lo = pid * TOT // NPROG
        hi = (pid + 1) * TOT // NPROG
    else:  # whole tiles pid, pid + NPROG, ...: chunks of those tiles in turn
        lo = 0
        hi = ((NT - pid + NPROG - 1) // NPROG) * NC
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for g in tl.range(lo, hi, num_stages=STAGES):
        if STREAMK:
            t = g // NC
            c = g - t * NC
        else:
            t = pid + (g // NC) * NPROG
            c = g % NC
        if PACKED:
            woff = ((t * NC + c).to(tl.int64) * BN + offn[:, None]) * BK + offk[None, :]
        else:
            woff = (t * BN + offn).to(tl.int64)[:, None] * K + c * BK + offk[None, :]
        w = tl.load(W + woff)
        x = tl.load(X + offm[:, None] * K + c * BK + offk[None, :], mask=rok[:, None], other=0.0,
                    cache_modifier=".cg")
        acc = tl.dot(x, tl.trans(w), acc)
        if MODE == 1:
            acc = tl.dot(x, tl.trans(tl.load(W2 + woff)), acc)
        if MODE == 2:
            acc = tl.dot(x, tl.trans(tl.load(W + woff + K // 2)), acc)
        if g == lo:  # the first chunk has arrived
            tl.store(T + pid * 3 + 1, tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r",
                                                                  [tl.sum(acc).to(tl.int32, bitcast=True)],
                                                                  dtype=tl.int64, is_pure=False, pack=1))
    tl.store(Y + (pid * BM + offm[:, None]) * BN + offn[None, :], acc)
    tl.store(T + pid * 3 + 2, tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r",
                                                        [tl.sum(acc).to(tl.int32, bitcast=True)], dtype=tl.int64,
                                                        is_pure=False, pack=1))


def pack(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    n, k = w.shape
    return w.view(n // bn, bn, k // bk, bk).permute(0, 2, 1, 3).contiguous()


def timed(fn, reps=20):
    """Median ms of ``fn`` over back-to-back runs timed with CUDA events (no L2 clearing between runs: do_bench's
    clearing leaves the L2 full of dirty lines whose write-backs slow the next kernel's reads)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def timed_or_record(fn, rows: list, **row):
    """:func:`timed`, or ``None`` after recording the failure (e.g. out of shared memory) as ``row`` with its
    error in ``rows``."""
    try:
        return timed(fn)
    except Exception as exc:
        rows.append(dict(row, error=str(exc)[:200]))
        print(*row.values(), "error", str(exc)[:120], flush=True)
        return None


def write_probe_json(out: str, filename: str, rows: list, **meta_extra) -> str:
    """Write ``{"meta": {device, date, versions, command, **meta_extra}, "rows": rows}`` to ``out/filename``."""
    import datetime
    import sys

    meta = dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), torch=torch.__version__, triton=triton.__version__, **meta_extra,
        command=" ".join(["python"] + sys.argv))
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, filename)
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    shapes = {"qkv 6144x8192": (6144, 8192), "gate 14336x4096": (14336, 4096), "down 4096x14336": (4096, 14336)}
    rows = []
    for name, (n, k) in shapes.items():
        # two copies of each matrix, used in turn, so that no run finds the previous run's weights in the L2
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        w2s = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        x = torch.randn(10, k, device=dev, dtype=torch.bfloat16)
        y = torch.empty(sms * 16, 256, device=dev, dtype=torch.float32)
        nbytes = n * k * 2
        # (layout, schedule, BN, BK, stages, mode, programs)
        variants = [("row-major", "tiles", 64, 256, 4, 0, sms), ("row-major", "tiles", 64, 256, 4, 0, 64),
                    ("row-major", "stream-K", 64, 256, 4, 0, sms), ("packed", "stream-K", 64, 256, 4, 0, sms),
                    ("row-major", "stream-K", 64, 128, 4, 0, sms), ("row-major", "stream-K", 128, 128, 4, 0, sms),
                    ("row-major", "stream-K", 64, 128, 4, 1, sms), ("row-major", "tiles", 64, 128, 4, 1, sms),
                    ("row-major", "stream-K", 64, 128, 4, 2, sms)]
        for layout, sched, bn, bk, stages, mode, nprog in variants:
            packed, streamk = layout == "packed", sched == "stream-K"
            wts = [pack(w, bn, bk) for w in ws] if packed else ws
            nb = nbytes * (2 if mode == 1 else 1)
            tm = torch.zeros(nprog, 3, dtype=torch.int64, device=dev)
            it = [0]

            def go(it=it, x=x, wts=wts, w2s=w2s, y=y, tm=tm, n=n, k=k, bn=bn, bk=bk, stages=stages, nprog=nprog,
                   packed=packed, streamk=streamk, mode=mode):  # the loop's values, bound now
                i = it[0] = it[0] ^ 1
                stream_kernel[(nprog,)](x, wts[i], w2s[i], y, tm, 10, n, k, 16, bn, bk, stages, nprog, packed,
                                        streamk, mode, num_warps=8)

            us = timed(go) * 1e3
            t = tm.cpu().double() / 1e3
            t0 = t[:, 0].min()
            span = float(t[:, 2].max() - t0)
            first = float((t[:, 1] - t[:, 0]).median())
            v = dict(layout=layout, schedule=sched, BN=bn, BK=bk, stages=stages, programs=nprog,
                     tiles_per_chunk=["one", "two matrices", "two K halves"][mode])
            rows.append(dict(shape=name, variant=str(v), us=us, TBps=nb / us / 1e6, in_kernel_us=span,
                             in_kernel_TBps=nb / span / 1e6,
                             first_chunk_us=first))
            print(f"{name:16s} {layout:9s} {sched:8s} {bn:3d}x{bk:3d} st{stages} p{nprog:3d} "
                  f"{v['tiles_per_chunk']:12s} "
                  f"{us:6.1f} us {nb / us / 1e6:5.2f} TB/s | in kernel {span:6.1f} us {nb / span / 1e6:5.2f} TB/s, "
                  f"first chunk {first:4.1f} us", flush=True)
    res = dict(device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d %H:%M:%S"),
               triton=triton.__version__, torch=torch.__version__, command="python bench/probes/weight_layout.py",
               rows=rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe_weight_layout_h100.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
