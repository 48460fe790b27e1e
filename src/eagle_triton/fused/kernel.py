"""The fused persistent drafter: a whole EAGLE-2 draft (root step, ``depth`` expansions, reranking, tree buffers)
in one Triton launch.

Threading model
---------------
``NPROG`` programs, all resident at once (one per SM on the GPU), run every phase together and meet at grid
barriers (a monotonically increasing device counter: ``atomic_add`` with release, spin on an acquire read).
Each phase spreads its work units over all programs (unit ``u`` runs on program ``u % NPROG``):

============  ===========================================================  ==================================
phase         work unit                                                    rows
============  ===========================================================  ==================================
FC (root)     BN output features of ``fc`` (3Ht -> H)                      all ``B*S`` new rows (BMR-row
                                                                           tiles when longer than BM)
QKV           stream-K: an equal share of (BN features x BKQ chunks of     root: ``B*S`` rows, tree: ``B*K``
              the 2H input) per program, partials finished by the tile's
              owner; RMSNorms and RoPE inline; K/V written to the draft
              KV, q to scratch
ATT           (sequence, kv head, KV split): all query heads of the group  root: the last row; tree: ``K``
              over packed prefix + tree keys, ancestor mask implicit       frontier nodes
COMB          (row, head): merges the KV splits (flash-decoding)
O             BN features of ``o_proj`` + residual (FC, O, GU, DOWN:
              stream-K as QKV for heads >= 1024 wide, SKL)
GU            BNG features of gate and up, post-attention RMSNorm inline,
              ``silu(g) * u``
DOWN          BN features of ``down_proj`` + residual: the step output
LM            ``BNV``-wide vocabulary tiles of ``lm_head`` (final
              RMSNorm inline), one pipelined loop over a program's
              tiles; each program ranks its tiles' top-k and
              logsumexp per row (after the loop with warp-level
              reductions up to 64 rows and with FP8 weights, else
              merged per tile)
RM            one row: merges the programs' top-k (``K`` extractions
              of the maximum) and logsumexp -> ``K`` children
              (log-probs in the model dtype)
SEL           one sequence: cumulative scores, the global K-way prune,
              parents / ancestors / next tokens; after the last step
              (same program, no barrier) the final top-T reranking and
              all tree buffers
============  ===========================================================  ==================================

RMSNorm statistics come from the producers: every FC / O / DOWN output tile stores its rows' sums of squares,
and the consuming phase adds ``H / BN`` partial sums per row (the embedding rows' statistics are precomputed per
weight set).

Each phase is a ``noinline`` function: compiled on its own, which keeps compilation fast (Triton's layout passes
grow quickly with function size), at the cost of one call per phase.

With ``NPROG == 1`` every barrier is trivial and the whole algorithm runs in one program, which is how the CPU
tests run it under ``TRITON_INTERPRET=1``.

Rounding follows the PyTorch reference (``heads/layers.py``): every matrix product, norm, RoPE, residual and
log-softmax result is rounded to the model dtype where the reference rounds it, so in fp32 the kernel computes
the same numbers up to summation order, and in bf16 up to one rounding of the differently ordered sums.

Ranking uses packed int64 keys ``(order-preserving float bits << 32) | (2**32 - 1 - index)``: one integer sort
gives (score descending, index ascending), the tie rule of :func:`eagle_triton.tree.rank_topk`. Inside one
program's lm_head tiles a 16-bit model's logits use int32 keys (the 16 value bits, the index within the program's
tiles), in the same order, converted to int64 keys when stored.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..ops._utils import is_interpreter

__all__ = ["fused_drafter_kernel"]

_MINKEY = tl.constexpr(-(2**63))  # below every packed key
PROF_SLOTS = tl.constexpr(128)  # arrival slots per program in the profile buffer (>= barriers + 2)


@triton.jit
def _now():
    """The GPU's global nanosecond timer (comparable across SMs)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _stamp(prof, slot, PROFILE: tl.constexpr):
    """With ``PROFILE``: this program's time at a point inside a phase, in ``prof[pid, slot]`` (slots >= 100)."""
    if PROFILE:
        tl.store(prof + tl.program_id(0) * PROF_SLOTS + slot, _now())


@triton.jit
def _grid_arrive(bar_ptr, target, NPROG: tl.constexpr, prof, PROFILE: tl.constexpr):
    """Arrive at a grid barrier without waiting: for a program that publishes nothing the next phase reads (the
    counter is monotonic, so its later barriers keep their targets)."""
    tl.debug_barrier()
    if PROFILE:
        tl.store(prof + tl.program_id(0) * PROF_SLOTS + target // NPROG, _now())
    if NPROG > 1:
        tl.atomic_add(bar_ptr, 1, sem="release")


@triton.jit
def _grid_sync(bar_ptr, target, NPROG: tl.constexpr, prof, PROFILE: tl.constexpr):
    """All programs wait until the counter reaches ``target`` (= NPROG x barriers so far in this launch).

    With ``PROFILE`` each program first records its arrival time in ``prof[pid, target // NPROG]``: the phase
    breakdown of bench/bench_fused_drafter.py --profile (slowest program per phase, load imbalance)."""
    _grid_arrive(bar_ptr, target, NPROG, prof, PROFILE)
    _grid_wait(bar_ptr, target, NPROG)


@triton.jit
def _grid_wait(bar_ptr, target, NPROG: tl.constexpr):
    """Wait, after :func:`_grid_arrive`, until every program has arrived (the counter reaches ``target``)."""
    if NPROG > 1:
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire")
        while seen < target:
            seen = tl.atomic_add(bar_ptr, 0, sem="acquire")
        tl.debug_barrier()


# FP8 (e4m3) weights to bf16 with integer operations. Triton's own conversion goes through fp16 with two ``cvt``
# instructions per element, and ``cvt`` issues at a fraction of the ALU rate: it limited the FP8 phases (the probe
# bench/probes/fp8_convert.py: 8B down 69 -> 55 us, lm_head 83 -> 69 us, H100). Per pair of bytes: ``prmt`` places
# byte b at bits 8-15 of a 16-bit lane, then sign | (exponent, mantissa) << 4 is a bf16 whose exponent field is the
# e4m3 one (bias 127 instead of 7), and one exact multiply by 2**120 (bf16 0x7B80) restores the value, subnormals
# included (checked for all 256 bytes by tests/fused/test_fused_fp8.py). The interpreter cannot run PTX, so it keeps
# Triton's conversion (the values are the same).
_E4M3_BF16_ASM = tl.constexpr("""{
.reg .b32 lo, hi, s, u, t, sc;
mov.b32 sc, 0x7B807B80;
prmt.b32 lo, $2, 0, 0x1404;
prmt.b32 hi, $2, 0, 0x3424;
shr.b32 s, lo, 4;
and.b32 u, lo, 0x80008000;
lop3.b32 t, s, 0x07F007F0, u, 0xEA;
mul.rn.bf16x2 $0, t, sc;
shr.b32 s, hi, 4;
and.b32 u, hi, 0x80008000;
lop3.b32 t, s, 0x07F007F0, u, 0xEA;
mul.rn.bf16x2 $1, t, sc;
}""")
_PTX = tl.constexpr(not is_interpreter())


@triton.jit
def _wcast(w, DT: tl.constexpr):
    """A loaded weight tile in the model dtype (FP8 weights: converted in registers)."""
    if _PTX and w.dtype == tl.float8e4nv and DT == tl.bfloat16:
        return tl.inline_asm_elementwise(_E4M3_BF16_ASM, "=r,=r,r", [w.to(tl.uint8, bitcast=True)],
                                         dtype=tl.bfloat16, is_pure=True, pack=4)
    else:
        return w.to(DT)


@triton.jit
def _rnd(x, DT: tl.constexpr):
    """Round an fp32 value to the model dtype and back (the reference's storage rounding)."""
    return x.to(DT).to(tl.float32)


# L2 prefetch: between two weight phases the memory system idles while the last programs finish, the barrier
# releases and the next phase's first loads travel to HBM and back. A program waiting at a barrier asks L2 for the
# first weights it will stream next (``DrafterConfig.l2_prefetch`` chunks of its range). A hint only: the values
# loaded later are the same. One ``prefetch.global.L2`` per 128-byte line and thread (the bulk form takes uniform
# operands: the compiler loops over the lanes' distinct rows one at a time).
_PF_ASM = tl.constexpr("""{
.reg .pred p;
setp.ne.b32 p, $2, 0;
@p prefetch.global.L2 [$1];
mov.b32 $0, 0;
}""")


@triton.jit
def _l2_prefetch(rows, k_lo, k_hi, row_ok, KDIM: tl.constexpr):
    """Ask L2 for elements ``[k_lo, min(k_hi, KDIM))`` of the weight rows ``rows`` (``[R, 1]`` pointers to element 0)
    where ``row_ok`` (``[R, 1]``; nothing under the interpreter)."""
    if _PTX:
        LE: tl.constexpr = 128 // (rows.dtype.element_ty.primitive_bitwidth // 8)  # elements per line
        NLW: tl.constexpr = 16  # lines per row per pass
        hi = tl.minimum(k_hi, KDIM)
        offl = tl.arange(0, NLW) * LE
        for k0 in range(k_lo, hi, NLW * LE):
            kk = k0 + offl
            ok = row_ok & (kk < hi)[None, :]
            tl.inline_asm_elementwise(_PF_ASM, "=r,l,r", [rows + kk[None, :], ok.to(tl.int32)],
                                      dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _pack(v, idx):
    """int64 keys whose integer order is (v ascending, idx descending): a descending sort ranks (v desc, idx asc)."""
    u = v.to(tl.int32, bitcast=True)
    o = tl.where(u >= 0, u, u ^ 2147483647)
    # (o << 32) + (2**32 - 1 - idx), written with small constants only (all int64 arithmetic)
    return ((o.to(tl.int64) + 1) << 32) - 1 - idx.to(tl.int64)


@triton.jit
def _unpack_value(key):
    o = (key >> 32).to(tl.int32)
    u = tl.where(o >= 0, o, o ^ 2147483647)
    return u.to(tl.float32, bitcast=True)


@triton.jit
def _unpack_index(key):
    hi = key >> 32
    low = key - (hi << 32)
    return (((hi * 0 + 1) << 32) - 1 - low).to(tl.int32)


@triton.jit
def _pack16(v, idx, DT: tl.constexpr):
    """int32 keys in :func:`_pack`'s order for values exact in the 16-bit ``DT`` and ``idx < 2**16``: the value's
    16 bits made order-preserving, then the index's complement (``_unpack16_index`` inverts it)."""
    u = v.to(DT).to(tl.int16, bitcast=True).to(tl.int32)
    o = tl.where(u >= 0, u, u ^ 32767)
    return o * 65536 + (65535 - idx)


@triton.jit
def _unpack16_index(key):
    return 65535 - (key & 65535)


@triton.jit
def _unpack16_value(key, DT: tl.constexpr):
    o = key >> 16
    u = tl.where(o >= 0, o, o ^ 32767)
    return u.to(tl.int16).to(DT, bitcast=True).to(tl.float32)


# Candidate keys of the flat selections (SEL's frontier, the final tree): int32 ones (K16) for 16-bit models, whose
# scores are already rounded to the model dtype, where the index fits 16 bits; int64 ones otherwise. (The int64
# tl.topk made the 8B sm_90 builds spill.)
@triton.jit
def _cand_key(v, idx, ok, DT: tl.constexpr, K16: tl.constexpr):
    if K16:
        return tl.where(ok, _pack16(v, idx, DT), -2147483648)
    else:
        return tl.where(ok, _pack(v, idx), _MINKEY)


@triton.jit
def _cand_index(key, K16: tl.constexpr):
    if K16:
        return _unpack16_index(key)
    else:
        return _unpack_index(key)


@triton.jit
def _cand_value(key, DT: tl.constexpr, K16: tl.constexpr):
    if K16:
        return _unpack16_value(key, DT)
    else:
        return _unpack_value(key)


# The per-row top-k merges (lm_head tiles, RM) are rolled loops of maximum extractions (keys are unique apart from the
# _MINKEY padding): on the GPU every phase's code is fetched cold once per step (the whole kernel is far larger than
# the instruction cache), at roughly 10 ns per instruction, so unrolled code costs where a rolled loop is short. The
# flat selections of SEL (K of K*K) and of the final tree (T of all candidates) are a bitonic tl.topk: each of their
# extractions was a reduction across the program's warps, and tl.topk measured faster (session 34: SEL 7.4 -> 5.4 us
# per step, the final selection 20.0 -> 8.4 us, 8B, H200).


@triton.jit
def _topk_merge(run, new, K, kmin):
    """Per row, the ``K`` largest keys of ``run [R, C1]`` and ``new [R, C2]``, descending, in the first ``K``
    columns of an ``[R, C1]`` tensor (``kmin``, below every key, elsewhere)."""
    offk = tl.arange(0, run.shape[1])[None, :]
    out = tl.full(run.shape, kmin, dtype=run.dtype)
    for i in range(0, K):
        top = tl.maximum(tl.max(run, axis=1), tl.max(new, axis=1))
        out = tl.where(offk == i, top[:, None], out)
        run = tl.where(run == top[:, None], kmin, run)
        new = tl.where(new == top[:, None], kmin, new)
    return out


@triton.jit
def _topk_flat(keys, K, KP: tl.constexpr, kmin: tl.constexpr = _MINKEY):
    """The ``K`` largest of all keys of the 2-D ``keys``, descending, as ``[KP]`` (``kmin``: below every key)."""
    offk = tl.arange(0, KP)
    out = tl.full([KP], kmin, dtype=keys.dtype)
    for i in range(0, K):
        top = tl.max(tl.max(keys, axis=1), axis=0)
        out = tl.where(offk == i, top, out)
        keys = tl.where(keys == top, kmin, keys)
    return out


@triton.jit
def _dot(x, w, acc, IEEE: tl.constexpr):
    """``acc + x @ w.T`` with fp32 accumulation (true fp32 products when IEEE)."""
    if IEEE:
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    else:
        acc = tl.dot(x, tl.trans(w), acc)
    return acc


@triton.jit
def _rstd_parts(ss_rows, row_ok, NT, NTP: tl.constexpr, KDIM: tl.constexpr, eps):
    """``rsqrt(mean(x**2) + eps)`` of ``[BM]`` rows from the per-tile sums of squares their producer stored
    (``ss_rows [BM, 1]`` points at each row's ``NT`` partial sums): one L2 round trip instead of a pass over the
    rows."""
    offt = tl.arange(0, NTP)[None, :]
    ss = tl.load(ss_rows + offt, mask=row_ok & (offt < NT), other=0.0, cache_modifier=".cg")
    return tl.rsqrt(tl.sum(ss, axis=1) / KDIM + eps)


@triton.jit
def _mm_plain(acc, x_row, row_ok, w_row, w_ok, k_lo, k_hi, KDIM: tl.constexpr, BK: tl.constexpr,
              IEEE: tl.constexpr, STAGES: tl.constexpr):
    """``acc [BM, BN] += X[rows, k_lo:k_hi] @ W[cols, k_lo:k_hi].T`` (row pointers ``[BM, 1]`` and ``[BN, 1]``;
    ``k_lo`` a multiple of BK, columns from KDIM on masked)."""
    offk = tl.arange(0, BK)[None, :]
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        km = k0 + offk < KDIM
        x = tl.load(x_row + k0 + offk, mask=row_ok & km, other=0.0, cache_modifier=".cg")
        w = _wcast(tl.load(w_row + k0 + offk, mask=w_ok & km, other=0.0), x.dtype)  # FP8 weights: converted here
        acc = _dot(x, w, acc, IEEE)
    return acc


@triton.jit
def _mm_plain2(acc, acc2, x_row, row_ok, x_row2, row_ok2, w_row, w_ok, k_lo, k_hi, KDIM: tl.constexpr,
               BK: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr):
    """:func:`_mm_plain` for two row tiles at once (``acc``/``x_row``/``row_ok`` and ``acc2``/``x_row2``/
    ``row_ok2``): each weight chunk is loaded once and feeds both products."""
    offk = tl.arange(0, BK)[None, :]
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        km = k0 + offk < KDIM
        x = tl.load(x_row + k0 + offk, mask=row_ok & km, other=0.0, cache_modifier=".cg")
        x2 = tl.load(x_row2 + k0 + offk, mask=row_ok2 & km, other=0.0, cache_modifier=".cg")
        w = _wcast(tl.load(w_row + k0 + offk, mask=w_ok & km, other=0.0), x.dtype)
        acc = _dot(x, w, acc, IEEE)
        acc2 = _dot(x2, w, acc2, IEEE)
    return acc, acc2


@triton.jit
def _mm_qkv(acc, base, e_off, h_off, row_ok, r_e, r_h, g_ptr, w_row, w_ok, k_lo, k_hi, H: tl.constexpr,
            BK: tl.constexpr, DT: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr):
    """``acc += [RMSNorm(emb) | RMSNorm(hidden)][:, k_lo:k_hi] @ W[cols, k_lo:k_hi].T`` in one pipelined loop
    over the 2H reduction (BK divides H). Both activation rows are addressed from one base pointer by element
    offsets (``e_off``, ``h_off`` ``[BM, 1]``) chosen per chunk: a pointer chosen at run time would make the loads
    scalar, and two loads per chunk (one masked off) spill and double the shared memory. ``g_ptr``: the two
    RMSNorm weights concatenated."""
    offk = tl.arange(0, BK)[None, :]
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        is_e = k0 < H
        xo = h_off + (k0 - H) + is_e.to(tl.int64) * (e_off - h_off + H)
        x = tl.load(base + xo + offk, mask=row_ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        g = tl.load(g_ptr + k0 + offk).to(tl.float32)
        rs = tl.where(is_e, r_e, r_h)
        xn = (g * _rnd(x * rs[:, None], DT)).to(DT)
        w = _wcast(tl.load(w_row + k0 + offk, mask=w_ok, other=0.0), DT)
        acc = _dot(xn, w, acc, IEEE)
    return acc


@triton.jit
def _chunk_gu(x_row, row_ok, rstd, g_ptr, wg_row, wu_row, w_ok, k0, ag, au, KDIM: tl.constexpr,
              BK: tl.constexpr, DT: tl.constexpr, IEEE: tl.constexpr):
    """Gate and up products of one reduction chunk, sharing the normalised rows."""
    offk = k0 + tl.arange(0, BK)[None, :]
    km = offk < KDIM
    x = tl.load(x_row + offk, mask=row_ok & km, other=0.0, cache_modifier=".cg").to(tl.float32)
    g = tl.load(g_ptr + offk, mask=km, other=0.0).to(tl.float32)
    xn = (g * _rnd(x * rstd[:, None], DT)).to(DT)
    ag = _dot(xn, _wcast(tl.load(wg_row + offk, mask=w_ok & km, other=0.0), DT), ag, IEEE)
    au = _dot(xn, _wcast(tl.load(wu_row + offk, mask=w_ok & km, other=0.0), DT), au, IEEE)
    return ag, au


# Stream-K (q/k/v): with one row tile, the (output tile, BK chunk) space is cut into NPROG equal contiguous ranges,
# so every program streams the same number of weight bytes (48 tiles of a head would leave 84 of 132 SMs idle). A
# tile cut between programs is finished by its owner (the program holding its first chunk, which reaches it last in
# its range); the others (holding its later chunks, first in their ranges) publish fp32 partials behind a release
# flag, so no program waits on one that is itself waiting. With more row tiles (long prompts at the root) each
# program takes whole tiles in turn.


@triton.jit
def _streamk_owner(g, TOT, NPROG: tl.constexpr):
    """The program whose stream-K range ``[p * TOT // NPROG, (p + 1) * TOT // NPROG)`` holds chunk ``g``."""
    return ((g + 1) * NPROG - 1) // TOT


@triton.jit
def _streamk_span(pid, n_t, NC: tl.constexpr, split, NPROG: tl.constexpr):
    """This program's share of ``n_t`` tiles of ``NC`` chunks: its chunk range ``[c_lo, c_hi)`` (when ``split``),
    its first tile and its number of tiles (segments)."""
    TOT = n_t * NC
    c_lo = pid * TOT // NPROG
    c_hi = (pid + 1) * TOT // NPROG
    t0 = tl.where(split, c_lo // NC, pid)
    n_seg = tl.where(split, tl.where(c_hi > c_lo, (c_hi - 1) // NC - c_lo // NC + 1, 0),
                     (n_t - pid + NPROG - 1) // NPROG)
    return c_lo, c_hi, t0, n_seg


@triton.jit
def _streamk_segment(i, c_lo, c_hi, t0, NC: tl.constexpr, split, pid, NPROG: tl.constexpr):
    """Segment ``i`` of this program: tile ``t`` and its chunks ``[s0, s1)``."""
    t = tl.where(split, t0 + i, pid + i * NPROG)
    s0 = tl.where(split, tl.maximum(c_lo - t * NC, 0), 0)
    s1 = tl.where(split, tl.minimum(c_hi - t * NC, NC), NC)
    return t, s0, s1


@triton.jit
def _streamk_holds(q, last, TOT, NPROG: tl.constexpr):
    """Whether program ``q`` (a later one than the tile's owner) holds a part of the tile whose last chunk is in
    program ``last``'s range: programs with empty ranges hold none."""
    return (q <= last) & ((q + 1) * TOT // NPROG > q * TOT // NPROG)


@triton.jit
def _streamk_part(part, t, k, owner, last, TOT, NSEG: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  NPROG: tl.constexpr):
    """Part ``k`` of tile ``t`` (zeros where no program holds it)."""
    offm = tl.arange(0, BM)[:, None]
    offn = tl.arange(0, BN)[None, :]
    held = _streamk_holds(owner + k, last, TOT, NPROG)
    seg = (t * NSEG + k).to(tl.int64)
    return tl.load(part + (seg * BM + offm) * BN + offn, mask=offm < tl.where(held, BM, 0), other=0.0,
                   cache_modifier=".cg")


@triton.jit
def _streamk_fixup(acc, t, s0, n_t, NC: tl.constexpr, split, part, flag, pid, NSEG: tl.constexpr,
                   NPROG: tl.constexpr):
    """Combine the parts of tile ``t``: a program holding a later part (``s0 > 0``) publishes its partial sum and
    gets False; the owner adds the other parts in a fixed order (deterministic) and gets True with the full sum."""
    BM: tl.constexpr = acc.shape[0]
    BN: tl.constexpr = acc.shape[1]
    offm = tl.arange(0, BM)[:, None]
    offn = tl.arange(0, BN)[None, :]
    TOT = n_t * NC
    owner = _streamk_owner(t * NC, TOT, NPROG)
    if s0 > 0:
        seg = (t * NSEG + pid - owner).to(tl.int64)
        tl.store(part + (seg * BM + offm) * BN + offn, acc)
        tl.debug_barrier()
        tl.atomic_xchg(flag + seg, 1, sem="release")
    else:
        # the later parts (slots 1.. of the tile; programs with empty ranges hold none): wait for all their flags at
        # once, then load them together (one L2 round trip for all instead of two per part, in turn)
        last = tl.where(split, _streamk_owner(t * NC + NC - 1, TOT, NPROG), owner)
        offs = tl.arange(0, NSEG)
        need = (offs > 0) & _streamk_holds(owner + offs, last, TOT, NPROG)
        segs = (t * NSEG + offs).to(tl.int64)
        if tl.max(need.to(tl.int32), axis=0) > 0:
            pending = 1
            while pending > 0:  # (a scalar loop-carried value: Triton 3.6 fails on a tensor one)
                seen = tl.atomic_add(flag + segs, 0, mask=need, sem="acquire")
                pending = tl.sum((need & (seen == 0)).to(tl.int32), axis=0)
            tl.debug_barrier()
            if BM <= 64:  # unrolled: independent loads in flight together, added in a fixed order
                for k in tl.static_range(1, NSEG):
                    acc += _streamk_part(part, t, k, owner, last, TOT, NSEG, BM, BN, NPROG)
            else:  # 128-row tiles: one part at a time (unrolled, they would spill)
                for k in range(1, NSEG):
                    acc += _streamk_part(part, t, k, owner, last, TOT, NSEG, BM, BN, NPROG)
            tl.atomic_xchg(flag + segs, 0, mask=need, sem="relaxed")
    return acc, s0 == 0


@triton.jit
def _epi(acc, sc, bias, cols, cok, W8: tl.constexpr, HAS_B: tl.constexpr, DT: tl.constexpr):
    """A product tile's output in the model dtype (``acc [BM, BN]`` fp32, output features ``cols [BN]``): ``rnd(acc)``;
    with a bias ``rnd(acc + bias)``; with FP8 weights ``rnd(rnd(acc) * scale (+ bias))``, the per-output-channel scale
    applied here, in the epilogue (the product of eagle_triton.heads.fp8.fp8_linear)."""
    if W8:
        y = _rnd(acc, DT) * tl.load(sc + cols, mask=cok, other=1.0)[None, :]
    else:
        y = acc
    if HAS_B:
        y = y + tl.load(bias + cols, mask=cok, other=0.0).to(tl.float32)[None, :]
    return _rnd(y, DT)


@triton.jit
def _linear_tiles(x_rows, row_ok, w, out_rows, res_rows, ss_rows, pid, sc, bias, part, flag, mc,
                  KDIM: tl.constexpr, N: tl.constexpr, HAS_RES: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  IEEE: tl.constexpr, STAGES: tl.constexpr, NPROG: tl.constexpr, W8: tl.constexpr,
                  HAS_B: tl.constexpr, SK: tl.constexpr = False, NSEG: tl.constexpr = 1, RB: tl.constexpr = 0,
                  PAIR: tl.constexpr = False, x_rows2=None, row_ok2=None, out_rows2=None, res_rows2=None,
                  ss_rows2=None):
    """This program's ``BN``-wide output tiles of one row tile: ``out = x @ w.T``, or with ``HAS_RES`` the
    reference's residual add ``rnd(res + rnd(x @ w.T))`` (row pointers ``[BM, 1]``, ``w`` is ``[N, KDIM]``; the
    product's rounding with FP8 scales ``sc`` and ``bias``: :func:`_epi`).
    Each tile ``t`` also stores its rows' sums of squares of the stored values at ``ss_rows + t``: the consumer's
    RMSNorm statistics (:func:`_rstd_parts`).
    ``SK``: stream-K over (tile, BK chunk) as q/k/v, partial sums in ``part`` / ``flag`` (``NSEG`` >= the programs
    sharing a tile), in a region of its own for row tile ``mc`` (programs reach the row tiles at different times):
    whole tiles leave SMs idle (o and down: 64 tiles on 132 SMs), which costs most where each program's K loop
    bounds the product (FP8 weights, more rows). Otherwise whole tiles, each over the full reduction.
    ``RB``: the rows of a full row tile, which size the regions (0: this tile's; a tail tile has fewer rows).
    ``PAIR``: a second row tile (``x_rows2`` ... ``ss_rows2``, the tail after full row tile ``mc``, its parts in
    region ``mc + 1``) in the same pass: each weight chunk feeds both products
    (``DrafterConfig.tail_one_pass``)."""
    BM: tl.constexpr = row_ok.shape[0]
    RBM: tl.constexpr = BM if RB == 0 else RB
    NC: tl.constexpr = (KDIM + BK - 1) // BK
    n_t = (N + BN - 1) // BN
    offn = tl.arange(0, BN)
    if SK:
        part_mc = part + mc * n_t * NSEG * RBM * BN
        flag_mc = flag + mc * n_t * NSEG
        c_lo, c_hi, t0, n_seg = _streamk_span(pid, n_t, NC, True, NPROG)
        for i in range(0, n_seg):
            t, s0, s1 = _streamk_segment(i, c_lo, c_hi, t0, NC, True, pid, NPROG)
            cols = t * BN + offn
            w_row = w + cols.to(tl.int64)[:, None] * KDIM
            if PAIR:
                acc, acc2 = _mm_plain2(tl.zeros([BM, BN], dtype=tl.float32),
                                       tl.zeros([row_ok2.shape[0], BN], dtype=tl.float32), x_rows, row_ok,
                                       x_rows2, row_ok2, w_row, (cols < N)[:, None], s0 * BK, s1 * BK, KDIM, BK,
                                       IEEE, STAGES)
                # (every program takes the tail's parts, then the full tile's: a part's publisher never waits)
                acc2, _ = _streamk_fixup(acc2, t, s0, n_t, NC, True, part_mc + n_t * NSEG * RBM * BN,
                                         flag_mc + n_t * NSEG, pid, NSEG, NPROG)
            else:
                acc = _mm_plain(tl.zeros([BM, BN], dtype=tl.float32), x_rows, row_ok, w_row, (cols < N)[:, None],
                                s0 * BK, s1 * BK, KDIM, BK, IEEE, STAGES)
            acc, own = _streamk_fixup(acc, t, s0, n_t, NC, True, part_mc, flag_mc, pid, NSEG, NPROG)
            if own:
                _linear_out(acc, t, cols, row_ok, out_rows, res_rows, ss_rows, sc, bias, N, HAS_RES, W8, HAS_B)
                if PAIR:
                    _linear_out(acc2, t, cols, row_ok2, out_rows2, res_rows2, ss_rows2, sc, bias, N, HAS_RES, W8,
                                HAS_B)
    else:
        for t in range(pid, n_t, NPROG):
            cols = t * BN + offn
            w_row = w + cols.to(tl.int64)[:, None] * KDIM
            if PAIR:
                acc, acc2 = _mm_plain2(tl.zeros([BM, BN], dtype=tl.float32),
                                       tl.zeros([row_ok2.shape[0], BN], dtype=tl.float32), x_rows, row_ok,
                                       x_rows2, row_ok2, w_row, (cols < N)[:, None], 0, KDIM, KDIM, BK, IEEE,
                                       STAGES)
                _linear_out(acc2, t, cols, row_ok2, out_rows2, res_rows2, ss_rows2, sc, bias, N, HAS_RES, W8, HAS_B)
            else:
                acc = _mm_plain(tl.zeros([BM, BN], dtype=tl.float32), x_rows, row_ok, w_row, (cols < N)[:, None], 0,
                                KDIM, KDIM, BK, IEEE, STAGES)
            _linear_out(acc, t, cols, row_ok, out_rows, res_rows, ss_rows, sc, bias, N, HAS_RES, W8, HAS_B)


@triton.jit
def _linear_out(acc, t, cols, row_ok, out_rows, res_rows, ss_rows, sc, bias, N: tl.constexpr, HAS_RES: tl.constexpr,
                W8: tl.constexpr, HAS_B: tl.constexpr):
    """Tile ``t``'s output (``cols`` its features) from its full fp32 sum, and its rows' sums of squares."""
    DT: tl.constexpr = out_rows.dtype.element_ty
    cok = cols < N
    m = row_ok & cok[None, :]
    if HAS_RES:
        res = tl.load(res_rows + cols[None, :], mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
        y = _rnd(res + _epi(acc, sc, bias, cols, cok, W8, HAS_B, DT), DT)
    else:
        y = _epi(acc, sc, bias, cols, cok, W8, HAS_B, DT)
    tl.store(out_rows + cols[None, :], y.to(DT), mask=m)
    tl.store(ss_rows + t, tl.sum(tl.where(m, y * y, 0.0), axis=1, keep_dims=True), mask=row_ok)


@triton.jit
def _row_tiles(MQ, BM: tl.constexpr, BMT: tl.constexpr):
    """A phase's row tiles of ``MQ`` rows: ``n_big`` full ``BM``-row tiles, then, with ``BMT`` > 0, a tail tile of
    ``BMT`` rows at row ``n_full * BM`` (``tail``) where the rows left after the full tiles fit it (else one more
    full tile takes them). Returns (n_full, n_big, tail)."""
    if BMT > 0:
        n_full = MQ // BM
        rem = MQ - n_full * BM
        tail = (rem > 0) & (rem <= BMT)
        n_big = n_full + (rem > BMT).to(tl.int32)
    else:  # (tail and n_full unused then)
        n_big = (MQ + BM - 1) // BM
        n_full = n_big
        tail = n_big < 0
    return n_full, n_big, tail


# ---------------------------------------------------------------------------------------------------------- phases
# One noinline function per phase: each is compiled as its own function, which keeps Triton's per-function passes
# (layout coalescing in particular, quadratic in function size) fast; a call costs nothing next to a phase.
# Every phase reads device memory written by other programs with ``.cg`` loads (L2, never a stale L1 line).


@triton.jit(noinline=True)
def _fc_phase(X, fc_w, hbuf, hss, wsc, part, flag, B, S, pid, H: tl.constexpr, W: tl.constexpr, NTH: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr,
              NPROG: tl.constexpr, W8: tl.constexpr, SK: tl.constexpr, NSEG: tl.constexpr):
    """Root step: ``h = fc(features)`` for all ``B*S`` new rows into hbuf[0] (row statistics into hss[0])."""
    offm = tl.arange(0, BM)
    MR0 = B * S
    n_mc = (MR0 + BM - 1) // BM
    for mc in range(0, n_mc):
        r = (mc * BM + offm).to(tl.int64)
        rok = r < MR0
        _linear_tiles(X + r[:, None] * W, rok[:, None], fc_w, hbuf + r[:, None] * H, hbuf, hss + r[:, None] * NTH,
                      pid, wsc, wsc, part, flag, mc, W, H, False, BN, BK, IEEE, STAGES, NPROG, W8, False, SK,
                      NSEG)


@triton.jit
def _qkv_tile_rows(t, H: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, BN: tl.constexpr):
    """Output features of QKV tile ``t`` (q tiles, then k, then v): which matrix (0, 1, 2), whether the tile is
    RoPE'd, its first frequency index within the head and the feature of every lane (RoPE tiles pair features d
    and d + HD/2 of one head; others are contiguous)."""
    QW: tl.constexpr = NH * HD
    KVW: tl.constexpr = NKV * HD
    BH: tl.constexpr = BN // 2
    n_qt = (QW + BN - 1) // BN
    n_kt = (KVW + BN - 1) // BN
    which = tl.where(t < n_qt, 0, tl.where(t < n_qt + n_kt, 1, 2))
    lt = tl.where(which == 0, t, tl.where(which == 1, t - n_qt, t - n_qt - n_kt))
    rope = which < 2
    head = lt // (HD // BN)
    jj = (lt % (HD // BN)) * BH
    row_a = tl.where(rope, head * HD + jj, lt * BN)
    row_b = tl.where(rope, row_a + HD // 2, row_a + BH)
    offn = tl.arange(0, BN)
    f = tl.where(offn < BH, row_a + offn, row_b + offn - BH)
    return which, rope, jj, f


@triton.jit
def _qkv_tile_weights(t, wq, wk, wv, H: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr,
                      BN: tl.constexpr):
    """:func:`_qkv_tile_rows` of tile ``t``, which of its features exist, and the row pointers ``[BN, 1]`` of its
    weight matrix (each row 2H long: the embedding half, then the hidden half)."""
    which, rope, jj, f = _qkv_tile_rows(t, H, NH, NKV, HD, BN)
    fok = f < tl.where(which == 0, NH * HD, NKV * HD)
    if which == 0:
        wbase = wq
    elif which == 1:
        wbase = wk
    else:
        wbase = wv
    return which, rope, jj, f, fok, wbase + f.to(tl.int64)[:, None] * (2 * H)


@triton.jit(noinline=True)
def _qkv_phase(s, emb_off, emb_rstd, g_qkv, wq, wk, wv, cos_t, sin_t, ids, nnew, kvlen, kc, vc, hbuf, hss, qbuf,
               part, flag, tok_in, src, status, wsc, wb, B, S, LMAX, MCAP, eps, pid, H: tl.constexpr, NH: tl.constexpr,
               NKV: tl.constexpr, HD: tl.constexpr, K: tl.constexpr, NTH: tl.constexpr, NTHP: tl.constexpr,
               NSEG: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
               STAGES: tl.constexpr, NPROG: tl.constexpr, W8: tl.constexpr, HAS_B: tl.constexpr,
               HQ_IN: tl.constexpr = 0, hq_part=None, NSEGH: tl.constexpr = 1, NHQ: tl.constexpr = 1,
               TQ: tl.constexpr = 0, tq_tab=None, BMT: tl.constexpr = 0):
    """q/k/v of the step's rows from RMSNorm(embedding) ++ RMSNorm(hidden), RoPE inline; K/V into the draft KV.
    Stream-K over (output tile, BK chunk of the 2H reduction) with one row tile (every tree step, and root steps
    of at most BM rows). ``HQ_IN`` (tree steps, with one row tile): the hidden half was computed in the previous
    step (:func:`_hq_phase`, per parent row): the stream-K covers the embedding half only, and each tile's owner
    adds the hidden half's parts of its rows' parents (``src``). ``TQ`` (tree steps): the embedding half of every
    draft token's q/k/v is read from ``tq_tab`` (:func:`eagle_triton.fused.host.token_qkv_table`; ``tok_in`` then
    holds draft-vocabulary indices): the stream-K covers the hidden half only, or nothing with ``HQ_IN`` (each
    program then finishes whole tiles: table row + hidden parts + epilogue)."""
    QW: tl.constexpr = NH * HD
    KVW: tl.constexpr = NKV * HD
    NCH: tl.constexpr = H // BK  # chunks per half (the host makes BK divide H)
    NC: tl.constexpr = (2 - HQ_IN - TQ) * NCH
    NCS: tl.constexpr = NC if NC > 0 else 1  # (the schedule divides by it; with nothing to reduce it is not split)
    MR = tl.where(s == 0, B * S, B * K)  # rows whose K/V are computed
    n_t = (QW + BN - 1) // BN + 2 * ((KVW + BN - 1) // BN)
    n_full, n_big, tail = _row_tiles(MR, BM, BMT)
    if BMT > 0:
        n_mc = n_big + tail.to(tl.int32)
    else:
        n_mc = n_big
    split = (n_mc == 1) & (NC > 0)  # one row tile; nothing to reduce: whole tiles in turn
    c_lo, c_hi, t0, n_seg = _streamk_span(pid, n_t, NCS, split, NPROG)
    for mc in range(0, n_big):
        _qkv_rows(mc * BM + tl.arange(0, BM), s, emb_off, emb_rstd, g_qkv, wq, wk, wv, cos_t, sin_t, ids, nnew, kvlen,
                  kc, vc, hbuf, hss, qbuf, part, flag, tok_in, src, status, wsc, wb, S, LMAX, MCAP, MR, eps, pid, n_t,
                  split, c_lo, c_hi, t0, n_seg, H, NH, NKV, HD, K, NTH, NTHP, NSEG, BN, BK, IEEE, STAGES, NPROG, W8,
                  HAS_B, HQ_IN, hq_part, NSEGH, NHQ, TQ, tq_tab)
    if BMT > 0:
        if tail:
            _qkv_rows(n_full * BM + tl.arange(0, BMT), s, emb_off, emb_rstd, g_qkv, wq, wk, wv, cos_t, sin_t, ids,
                      nnew, kvlen, kc, vc, hbuf, hss, qbuf, part, flag, tok_in, src, status, wsc, wb, S, LMAX, MCAP,
                      MR, eps, pid, n_t, split, c_lo, c_hi, t0, n_seg, H, NH, NKV, HD, K, NTH, NTHP, NSEG, BN, BK,
                      IEEE, STAGES, NPROG, W8, HAS_B, HQ_IN, hq_part, NSEGH, NHQ, TQ, tq_tab)


@triton.jit
def _qkv_rows(r, s, emb_off, emb_rstd, g_qkv, wq, wk, wv, cos_t, sin_t, ids, nnew, kvlen, kc, vc, hbuf, hss, qbuf,
              part, flag, tok_in, src, status, wsc, wb, S, LMAX, MCAP, MR, eps, pid, n_t, split, c_lo, c_hi, t0,
              n_seg, H: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, K: tl.constexpr,
              NTH: tl.constexpr, NTHP: tl.constexpr, NSEG: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              IEEE: tl.constexpr, STAGES: tl.constexpr, NPROG: tl.constexpr, W8: tl.constexpr, HAS_B: tl.constexpr,
              HQ_IN: tl.constexpr, hq_part, NSEGH: tl.constexpr, NHQ: tl.constexpr, TQ: tl.constexpr, tq_tab):
    """:func:`_qkv_phase` for the rows ``r`` of one row tile (the stream-K schedule ``split``, ``c_lo``, ``c_hi``,
    ``t0``, ``n_seg`` over ``n_t`` tiles computed by the phase)."""
    DT: tl.constexpr = hbuf.dtype.element_ty
    BM: tl.constexpr = r.shape[0]
    QW: tl.constexpr = NH * HD
    KVW: tl.constexpr = NKV * HD
    BH: tl.constexpr = BN // 2
    NCH: tl.constexpr = H // BK  # chunks per half (the host makes BK divide H)
    NC: tl.constexpr = (2 - HQ_IN - TQ) * NCH
    KB: tl.constexpr = TQ * H  # the first reduction element streamed (the hidden half's when the table holds the other)
    NCS: tl.constexpr = NC if NC > 0 else 1
    is_root = s == 0
    lvl = s - 1
    in_off = (s % 2) * MCAP  # hbuf parity (in rows): the step reads buffer s % 2 and writes (s + 1) % 2
    rok = r < MR
    b = tl.where(is_root, r // S, r // K)
    j = tl.where(is_root, r % S, r % K)
    nb = tl.load(nnew + b, mask=rok, other=1)
    kvl = tl.load(kvlen + b, mask=rok, other=0)
    tok = tl.where(is_root, tl.load(ids + r, mask=rok & is_root, other=0),
                   tl.load(tok_in + r, mask=rok & (s > 0), other=0, cache_modifier=".cg"))
    hrow = tl.where(is_root, r, tl.load(src + r, mask=rok & (s > 0), other=0, cache_modifier=".cg"))
    valid = rok & ((s > 0) | (j < nb))
    slot = tl.where(is_root, kvl + j, kvl + nb + lvl * K + j)
    pos = tl.where(is_root, kvl + j, kvl + nb + lvl)
    over = valid & (slot >= LMAX)
    tl.store(status + r * 0, tl.full([BM], 1, tl.int32), mask=over)
    # a sequence said to have more new rows than the input holds (the rows past S would be garbage in its KV)
    tl.store(status + r * 0, tl.full([BM], 2, tl.int32), mask=rok & is_root & (j == 0) & (nb > S))
    valid = valid & (slot < LMAX)
    e_off = emb_off + tok.to(tl.int64)[:, None] * H  # elements from hbuf to the embedding rows
    h_off = (in_off + hrow).to(tl.int64)[:, None] * H
    if TQ:  # tok: draft-vocabulary indices; the embedding rows are not read
        r_e = tl.full([BM], 1.0, tl.float32)
    else:
        r_e = tl.load(emb_rstd + tok, mask=rok, other=1.0)
    r_h = _rstd_parts(hss + (in_off + hrow).to(tl.int64)[:, None] * NTH, rok[:, None], NTH, NTHP, H, eps)
    for i in range(0, n_seg):
        t, s0, s1 = _streamk_segment(i, c_lo, c_hi, t0, NCS, split, pid, NPROG)
        which, rope, jj, f, fok, w_row = _qkv_tile_weights(t, wq, wk, wv, H, NH, NKV, HD, BN)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        if NC > 0:
            acc = _mm_qkv(acc, hbuf, e_off, h_off, rok[:, None], r_e, r_h, g_qkv, w_row, fok[:, None],
                          KB + s0 * BK, KB + s1 * BK, H, BK, DT, IEEE, STAGES)
            acc, own = _streamk_fixup(acc, t, s0, n_t, NC, split, part, flag, pid, NSEG, NPROG)
        else:
            own = True
        if own:
            if HQ_IN:
                acc += _hq_parts(hq_part, t, hrow, rok, n_t, NCH, NSEGH, NHQ, BM, BN)
            # scales of q, k, v follow fc's H in wsc; biases of q, k, v (then o) start wb; the table's columns
            # are q, k, v too
            moff = tl.where(which == 0, 0, tl.where(which == 1, QW, QW + KVW))
            if TQ:
                acc += tl.load(tq_tab + tok.to(tl.int64)[:, None] * (QW + 2 * KVW) + (moff + f)[None, :],
                               mask=rok[:, None] & fok[None, :], other=0.0)
            y = _epi(acc, wsc + H + moff, wb + moff, f, fok, W8, HAS_B, DT)
            # RoPE (half rotation) on the paired halves, with the tables rounded to the model dtype
            y3 = tl.permute(tl.reshape(y, (BM, 2, BH)), (0, 2, 1))
            x1, x2 = tl.split(y3)
            dfreq = jj + tl.arange(0, BH)
            cs = _rnd(tl.load(cos_t + pos.to(tl.int64)[:, None] * HD + dfreq[None, :], mask=rok[:, None],
                              other=0.0), DT)
            sn = _rnd(tl.load(sin_t + pos.to(tl.int64)[:, None] * HD + dfreq[None, :], mask=rok[:, None],
                              other=0.0), DT)
            o1 = _rnd(_rnd(x1 * cs, DT) + _rnd(-x2 * sn, DT), DT)
            o2 = _rnd(_rnd(x2 * cs, DT) + _rnd(x1 * sn, DT), DT)
            yr = tl.reshape(tl.permute(tl.join(o1, o2), (0, 2, 1)), (BM, BN))
            y = tl.where(rope, yr, y)
            smask = valid[:, None] & fok[None, :]
            if which == 0:
                tl.store(qbuf + r.to(tl.int64)[:, None] * QW + f[None, :], y.to(DT),
                         mask=rok[:, None] & fok[None, :])
            else:
                kvp = (b.to(tl.int64) * LMAX + slot)[:, None] * KVW + f[None, :]
                if which == 1:
                    tl.store(kc + kvp, y.to(DT), mask=smask)
                else:
                    tl.store(vc + kvp, y.to(DT), mask=smask)


@triton.jit
def _hq_parts(hq_part, t, hrow, rok, n_t, NCH: tl.constexpr, NSEGH: tl.constexpr, NHQ: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr):
    """The hidden half of q/k/v tile ``t`` for rows whose parents are ``hrow``: the parts :func:`_hq_phase`'s
    programs stored (one per program holding chunks of the tile), added in chunk order."""
    offn = tl.arange(0, BN)[None, :]
    TOT = n_t * NCH
    owner = _streamk_owner(t * NCH, TOT, NHQ)
    last = _streamk_owner(t * NCH + NCH - 1, TOT, NHQ)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in tl.static_range(NSEGH):
        held = _streamk_holds(owner + k, last, TOT, NHQ)
        seg = (t * NSEGH + k).to(tl.int64)
        acc += tl.load(hq_part + (seg * BM + hrow.to(tl.int64)[:, None]) * BN + offn,
                       mask=rok[:, None] & (offn < tl.where(held, BN, 0)), other=0.0, cache_modifier=".cg")
    return acc


@triton.jit(noinline=True)
def _hq_phase(s, hbuf, hss, g_qkv, wq, wk, wv, hq_part, B, MCAP, eps, lp, H: tl.constexpr, NH: tl.constexpr,
              NKV: tl.constexpr, HD: tl.constexpr, K: tl.constexpr, NTH: tl.constexpr, NTHP: tl.constexpr,
              NSEGH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
              STAGES: tl.constexpr, NHQ: tl.constexpr):
    """The hidden half of the next step's q/k/v for every row of step ``s`` (the next rows' possible parents):
    ``W_qkv[:, H:2H] @ RMSNorm_h(hidden[r])``, unscaled fp32 parts (the owner applies FP8 scales, bias and RoPE
    to the sum). Program ``lp`` of the ``NHQ`` taking part reduces its stream-K range of (tile, chunk) pairs of
    the hidden half and stores one part per tile in slot ``lp - owner`` of that tile (:func:`_hq_parts`)."""
    DT: tl.constexpr = hbuf.dtype.element_ty
    QW: tl.constexpr = NH * HD
    KVW: tl.constexpr = NKV * HD
    NCH: tl.constexpr = H // BK
    offm = tl.arange(0, BM)
    offn = tl.arange(0, BN)[None, :]
    MQ = tl.where(s == 0, B, B * K)  # the rows step s computed (its DOWN wrote their hidden states)
    rok = offm < MQ
    in_off = ((s + 1) % 2) * MCAP  # the hbuf parity step s + 1 reads
    h_off = (in_off + offm).to(tl.int64)[:, None] * H
    r_h = _rstd_parts(hss + (in_off + offm).to(tl.int64)[:, None] * NTH, rok[:, None], NTH, NTHP, H, eps)
    r_e = tl.full([BM], 1.0, tl.float32)  # the embedding half is not read (every chunk lies in the hidden half)
    n_t = (QW + BN - 1) // BN + 2 * ((KVW + BN - 1) // BN)
    TOT = n_t * NCH
    c_lo, c_hi, t0, n_seg = _streamk_span(lp, n_t, NCH, True, NHQ)
    for i in range(0, n_seg):
        t, s0, s1 = _streamk_segment(i, c_lo, c_hi, t0, NCH, True, lp, NHQ)
        which, rope, jj, f, fok, w_row = _qkv_tile_weights(t, wq, wk, wv, H, NH, NKV, HD, BN)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        acc = _mm_qkv(acc, hbuf, h_off, h_off, rok[:, None], r_e, r_h, g_qkv, w_row, fok[:, None], H + s0 * BK,
                      H + s1 * BK, H, BK, DT, IEEE, STAGES)
        seg = (t * NSEGH + lp - _streamk_owner(t * NCH, TOT, NHQ)).to(tl.int64)
        tl.store(hq_part + (seg * BM + offm[:, None]) * BN + offn, acc)


@triton.jit(noinline=True)
def _att_phase(s, qbuf, kc, vc, anc, nnew, kvlen, att_o, att_ml, B, S, LMAX, sm_scale, pid, prof, NH: tl.constexpr,
               NKV: tl.constexpr, HD: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, D: tl.constexpr,
               NSPLIT: tl.constexpr, BKV: tl.constexpr, BQ: tl.constexpr, IEEE: tl.constexpr, NPROG: tl.constexpr,
               PROFILE: tl.constexpr):
    """Split-KV attention, one unit per (sequence, kv head, split) with all query heads of the GQA group: the
    root's last row, or the ``K`` frontier nodes over the prefix plus their ancestors (mask implicit)."""
    DT: tl.constexpr = qbuf.dtype.element_ty
    GQ: tl.constexpr = NH // NKV
    QW: tl.constexpr = NH * HD
    KVW: tl.constexpr = NKV * HD
    DP1: tl.constexpr = D + 1
    is_root = s == 0
    apar = (s + 1) % 2  # ancestor table this step reads (root writes table 0)
    offq = tl.arange(0, BQ)
    offd = tl.arange(0, HD)
    offj = tl.arange(0, BKV)
    n_att = B * NKV * NSPLIT
    for u in range(pid, n_att, NPROG):
        b = u // (NKV * NSPLIT)
        g = (u // NSPLIT) % NKV
        sp = u % NSPLIT
        nb = tl.load(nnew + b)
        L = tl.load(kvlen + b) + nb
        nq = tl.where(is_root, 1, K)
        nkeys = tl.where(is_root, L, L + s * K)
        kq = offq // GQ
        hh = offq % GQ
        qok = kq < nq
        qrow = tl.where(is_root, b * S + nb - 1, b * K + kq)
        q = tl.load(qbuf + qrow.to(tl.int64)[:, None] * QW + (g * GQ + hh)[:, None] * HD + offd[None, :],
                    mask=qok[:, None], other=0.0, cache_modifier=".cg")
        _stamp(prof, 100, PROFILE)
        chunk = (nkeys + NSPLIT - 1) // NSPLIT
        start = sp * chunk
        end = tl.minimum(start + chunk, nkeys)
        m_i = tl.full([BQ], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BQ], dtype=tl.float32)
        acc = tl.zeros([BQ, HD], dtype=tl.float32)
        for j0 in tl.range(start, end, BKV, num_stages=1):  # 1-2 iterations: no pipeline prologue code
            jk = j0 + offj
            kok = jk < end
            kvp = (tl.cast(b, tl.int64) * LMAX + jk)[:, None] * KVW + g * HD + offd[None, :]
            kb = tl.load(kc + kvp, mask=kok[:, None], other=0.0, cache_modifier=".cg")
            vb = tl.load(vc + kvp, mask=kok[:, None], other=0.0, cache_modifier=".cg")
            sco = tl.zeros([BQ, BKV], dtype=tl.float32)
            sco = _dot(q, kb, sco, IEEE)
            sco = _rnd(_rnd(sco, DT) / sm_scale, DT)
            # tree keys: slot L + t is level t // K; visible iff it is the query's ancestor at that level
            tk = jk - L
            tree = tk >= 0
            a = tl.load(anc + ((apar * B + b) * KP + kq[:, None]) * DP1 + tk[None, :] // K,
                        mask=qok[:, None] & (tree & kok)[None, :], other=-1, cache_modifier=".cg")
            vis = qok[:, None] & kok[None, :] & ((~tree)[None, :] | (a == tk[None, :]))
            sco = tl.where(vis, sco, -1.0e30)
            m_new = tl.maximum(m_i, tl.max(sco, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.where(vis, tl.exp(sco - m_new[:, None]), 0.0)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None]
            acc = _dot(p.to(DT), tl.trans(vb), acc, IEEE)
            m_i = m_new
        _stamp(prof, 101, PROFILE)
        qr = tl.where(is_root, b, b * K + kq)
        prow = (qr * NH + g * GQ + hh) * NSPLIT + sp
        tl.store(att_o + prow.to(tl.int64)[:, None] * HD + offd[None, :], acc, mask=qok[:, None])
        tl.store(att_ml + prow * 2, m_i, mask=qok)
        tl.store(att_ml + prow * 2 + 1, l_i, mask=qok)
        _stamp(prof, 102, PROFILE)


@triton.jit(noinline=True)
def _comb_phase(s, att_o, att_ml, attn, B, pid, NH: tl.constexpr, HD: tl.constexpr, K: tl.constexpr,
                NSPLIT: tl.constexpr, NPROG: tl.constexpr):
    """Merge the KV splits of every (row, head) (flash-decoding), ``G`` (row, head) units at a time: one L2
    round trip for all of a program's units at batch 1 instead of one per unit."""
    DT: tl.constexpr = attn.dtype.element_ty
    QW: tl.constexpr = NH * HD
    G: tl.constexpr = 4
    n_u = tl.where(s == 0, B, B * K) * NH
    offg = tl.arange(0, G)
    offs = tl.arange(0, NSPLIT)
    offd = tl.arange(0, HD)
    for u0 in range(pid * G, n_u, NPROG * G):
        u = u0 + offg
        uok = u < n_u
        prow = u[:, None] * NSPLIT + offs[None, :]
        m_s = tl.load(att_ml + prow * 2, mask=uok[:, None], other=-1.0e30, cache_modifier=".cg")
        l_s = tl.load(att_ml + prow * 2 + 1, mask=uok[:, None], other=1.0, cache_modifier=".cg")
        o_s = tl.load(att_o + prow.to(tl.int64)[:, :, None] * HD + offd[None, None, :], mask=uok[:, None, None],
                      other=0.0, cache_modifier=".cg")
        wgt = tl.exp(m_s - tl.max(m_s, axis=1)[:, None])
        o = tl.sum(o_s * wgt[:, :, None], axis=1) / tl.sum(l_s * wgt, axis=1)[:, None]
        tl.store(attn + (u // NH).to(tl.int64)[:, None] * QW + (u % NH)[:, None] * HD + offd[None, :], o.to(DT),
                 mask=uok[:, None])


@triton.jit(noinline=True)
def _o_phase(s, attn, wo, hbuf, src, nnew, h1, h1ss, wsc, wb, part, flag, B, S, MCAP, pid, H: tl.constexpr,
             QW: tl.constexpr, KVW: tl.constexpr, K: tl.constexpr, NTH: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr, NPROG: tl.constexpr,
             W8: tl.constexpr, HAS_B: tl.constexpr, SK: tl.constexpr, NSEG: tl.constexpr, BMT: tl.constexpr = 0,
             TP1: tl.constexpr = False):
    """``h1 = hidden + o_proj(attn)`` for the rows that continue (the root's last row, or the frontier).
    ``TP1``: the tail tile in one pass with the last full tile (``DrafterConfig.tail_one_pass``)."""
    MQ = tl.where(s == 0, B, B * K)
    n_full, n_big, tail = _row_tiles(MQ, BM, BMT)
    n_alone, paired = _paired_tail(n_full, n_big, tail) if TP1 else (n_big, False)  # (False: no paired code)
    for mc in range(0, n_alone):
        _o_rows(mc * BM + tl.arange(0, BM), mc, s, attn, wo, hbuf, src, nnew, h1, h1ss, wsc, wb, part, flag, S, MQ,
                MCAP, pid, H, QW, KVW, NTH, BM, BN, BK, IEEE, STAGES, NPROG, W8, HAS_B, SK, NSEG)
    if BMT > 0:
        if paired:
            _o_rows((n_full - 1) * BM + tl.arange(0, BM), n_full - 1, s, attn, wo, hbuf, src, nnew, h1, h1ss, wsc, wb,
                    part, flag, S, MQ, MCAP, pid, H, QW, KVW, NTH, BM, BN, BK, IEEE, STAGES, NPROG, W8, HAS_B, SK,
                    NSEG, n_full * BM + tl.arange(0, BMT))
        elif tail:
            _o_rows(n_full * BM + tl.arange(0, BMT), n_full, s, attn, wo, hbuf, src, nnew, h1, h1ss, wsc, wb, part,
                    flag, S, MQ, MCAP, pid, H, QW, KVW, NTH, BM, BN, BK, IEEE, STAGES, NPROG, W8, HAS_B, SK, NSEG)


@triton.jit
def _paired_tail(n_full, n_big, tail):
    """``DrafterConfig.tail_one_pass``: a tail tile after at least one full tile is taken in one pass with the last
    full tile (``paired``), the full tiles before it alone. Returns (the tiles from 0 taken alone, paired)."""
    paired = tail & (n_full > 0)
    return tl.where(paired, n_full - 1, n_big), paired


@triton.jit
def _o_ptrs(r, s, attn, hbuf, src, nnew, h1, h1ss, S, MQ, MCAP, H: tl.constexpr, QW: tl.constexpr,
            NTH: tl.constexpr):
    """o_proj's row pointers ``[R, 1]`` for the rows ``r``: (inputs, rows that exist, outputs, residuals, sums of
    squares)."""
    is_root = s == 0
    in_off = (s % 2) * MCAP * H
    rok = r < MQ
    nb = tl.load(nnew + r, mask=rok & is_root, other=1)
    hrow = tl.where(is_root, r * S + nb - 1, tl.load(src + r, mask=rok & (s > 0), other=0, cache_modifier=".cg"))
    r64 = r.to(tl.int64)[:, None]
    return (attn + r64 * QW, rok[:, None], h1 + r64 * H, hbuf + in_off + hrow.to(tl.int64)[:, None] * H,
            h1ss + r64 * NTH)


@triton.jit
def _o_rows(r, mc, s, attn, wo, hbuf, src, nnew, h1, h1ss, wsc, wb, part, flag, S, MQ, MCAP, pid, H: tl.constexpr,
            QW: tl.constexpr, KVW: tl.constexpr, NTH: tl.constexpr, RB: tl.constexpr, BN: tl.constexpr,
            BK: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr, NPROG: tl.constexpr, W8: tl.constexpr,
            HAS_B: tl.constexpr, SK: tl.constexpr, NSEG: tl.constexpr, r2=None):
    """:func:`_o_phase` for the rows ``r`` of row tile ``mc`` (``RB``: the rows of a full tile), and with ``r2``
    the tail tile's rows in the same pass."""
    x, ok, out, res, ss = _o_ptrs(r, s, attn, hbuf, src, nnew, h1, h1ss, S, MQ, MCAP, H, QW, NTH)
    sc, bias = wsc + H + QW + 2 * KVW, wb + QW + 2 * KVW
    if r2 is None:
        _linear_tiles(x, ok, wo, out, res, ss, pid, sc, bias, part, flag, mc, QW, H, True, BN, BK, IEEE, STAGES,
                      NPROG, W8, HAS_B, SK, NSEG, RB)
    else:
        x2, ok2, out2, res2, ss2 = _o_ptrs(r2, s, attn, hbuf, src, nnew, h1, h1ss, S, MQ, MCAP, H, QW, NTH)
        _linear_tiles(x, ok, wo, out, res, ss, pid, sc, bias, part, flag, mc, QW, H, True, BN, BK, IEEE, STAGES,
                      NPROG, W8, HAS_B, SK, NSEG, RB, True, x2, ok2, out2, res2, ss2)


@triton.jit(noinline=True)
def _gu_phase(s, h1, h1ss, g_post, wg, wu, act, sc_g, part, flag, B, eps, pid, H: tl.constexpr, INTER: tl.constexpr,
              K: tl.constexpr, NTH: tl.constexpr, NTHP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr, NPROG: tl.constexpr, W8: tl.constexpr,
              SK: tl.constexpr, NSEG: tl.constexpr, BMT: tl.constexpr = 0, TP1: tl.constexpr = False):
    """``act = silu(gate(x)) * up(x)``, x = post-attention RMSNorm(h1) computed inline. Whole tiles, or with ``SK``
    stream-K over (tile, BK chunk) as :func:`_linear_tiles` (per row tile, gate's and up's partial sums in two
    halves of a region of ``part`` / ``flag``): every program then reduces the same number of chunks (224 tiles of
    the 8B head on 132 SMs are otherwise 1 or 2 per program). ``TP1``: the tail tile in one pass with the last
    full tile (``DrafterConfig.tail_one_pass``)."""
    MQ = tl.where(s == 0, B, B * K)
    n_full, n_big, tail = _row_tiles(MQ, BM, BMT)
    n_alone, paired = _paired_tail(n_full, n_big, tail) if TP1 else (n_big, False)  # (False: no paired code)
    for mc in range(0, n_alone):
        _gu_rows(mc * BM + tl.arange(0, BM), mc, h1, h1ss, g_post, wg, wu, act, sc_g, part, flag, MQ, eps, pid, H,
                 INTER, NTH, NTHP, BM, BN, BK, IEEE, STAGES, NPROG, W8, SK, NSEG)
    if BMT > 0:
        if paired:
            _gu_rows((n_full - 1) * BM + tl.arange(0, BM), n_full - 1, h1, h1ss, g_post, wg, wu, act, sc_g, part,
                     flag, MQ, eps, pid, H, INTER, NTH, NTHP, BM, BN, BK, IEEE, STAGES, NPROG, W8, SK, NSEG,
                     n_full * BM + tl.arange(0, BMT))
        elif tail:
            _gu_rows(n_full * BM + tl.arange(0, BMT), n_full, h1, h1ss, g_post, wg, wu, act, sc_g, part, flag, MQ,
                     eps, pid, H, INTER, NTH, NTHP, BM, BN, BK, IEEE, STAGES, NPROG, W8, SK, NSEG)


@triton.jit
def _gu_rows(r, mc, h1, h1ss, g_post, wg, wu, act, sc_g, part, flag, MQ, eps, pid, H: tl.constexpr,
             INTER: tl.constexpr, NTH: tl.constexpr, NTHP: tl.constexpr, RB: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr, NPROG: tl.constexpr, W8: tl.constexpr,
             SK: tl.constexpr, NSEG: tl.constexpr, r2=None):
    """:func:`_gu_phase` for the rows ``r`` of row tile ``mc`` (``RB``: the rows of a full tile, which size the
    regions of ``part``), and with ``r2`` the tail tile's rows in the same pass (its parts in region ``mc + 1``)."""
    DT: tl.constexpr = h1.dtype.element_ty
    BM: tl.constexpr = r.shape[0]
    NC: tl.constexpr = (H + BK - 1) // BK
    n_it: tl.constexpr = (INTER + BN - 1) // BN
    offn = tl.arange(0, BN)
    rok = r < MQ
    x_row = h1 + r.to(tl.int64)[:, None] * H
    rs = _rstd_parts(h1ss + r.to(tl.int64)[:, None] * NTH, rok[:, None], NTH, NTHP, H, eps)
    if r2 is not None:
        BM2: tl.constexpr = r2.shape[0]
        rok2 = r2 < MQ
        x_row2 = h1 + r2.to(tl.int64)[:, None] * H
        rs2 = _rstd_parts(h1ss + r2.to(tl.int64)[:, None] * NTH, rok2[:, None], NTH, NTHP, H, eps)
    if SK:  # a region of part / flag per row tile: gate's parts, then up's
        part_g = part + mc * 2 * n_it * NSEG * RB * BN
        flag_g = flag + mc * 2 * n_it * NSEG
        c_lo, c_hi, t0, n_seg = _streamk_span(pid, n_it, NC, True, NPROG)
        for i in range(0, n_seg):
            t, s0, s1 = _streamk_segment(i, c_lo, c_hi, t0, NC, True, pid, NPROG)
            cols = t * BN + offn
            if r2 is None:
                ag, au = _gu_tile(x_row, rok, rs, g_post, wg, wu, cols, s0 * BK, s1 * BK, H, INTER, BK, DT, IEEE,
                                  STAGES)
            else:
                ag, au, ag2, au2 = _gu_tile2(x_row, rok, rs, x_row2, rok2, rs2, g_post, wg, wu, cols, s0 * BK,
                                             s1 * BK, H, INTER, BK, DT, IEEE, STAGES)
                # the tail's parts in the next region (every program takes them before the full tile's)
                part_g2 = part_g + 2 * n_it * NSEG * RB * BN
                flag_g2 = flag_g + 2 * n_it * NSEG
                ag2, _ = _streamk_fixup(ag2, t, s0, n_it, NC, True, part_g2, flag_g2, pid, NSEG, NPROG)
                au2, _ = _streamk_fixup(au2, t, s0, n_it, NC, True, part_g2 + n_it * NSEG * BM2 * BN,
                                        flag_g2 + n_it * NSEG, pid, NSEG, NPROG)
            ag, own = _streamk_fixup(ag, t, s0, n_it, NC, True, part_g, flag_g, pid, NSEG, NPROG)
            au, _ = _streamk_fixup(au, t, s0, n_it, NC, True, part_g + n_it * NSEG * BM * BN,
                                   flag_g + n_it * NSEG, pid, NSEG, NPROG)  # the same owner as gate's
            if own:
                _gu_out(ag, au, r, rok, cols, act, sc_g, INTER, W8, DT)
                if r2 is not None:
                    _gu_out(ag2, au2, r2, rok2, cols, act, sc_g, INTER, W8, DT)
    else:
        for t in range(pid, n_it, NPROG):
            cols = t * BN + offn
            if r2 is None:
                ag, au = _gu_tile(x_row, rok, rs, g_post, wg, wu, cols, 0, H, H, INTER, BK, DT, IEEE, STAGES)
            else:
                ag, au, ag2, au2 = _gu_tile2(x_row, rok, rs, x_row2, rok2, rs2, g_post, wg, wu, cols, 0, H, H,
                                             INTER, BK, DT, IEEE, STAGES)
                _gu_out(ag2, au2, r2, rok2, cols, act, sc_g, INTER, W8, DT)
            _gu_out(ag, au, r, rok, cols, act, sc_g, INTER, W8, DT)


@triton.jit
def _gu_tile2(x_row, rok, rs, x_row2, rok2, rs2, g_post, wg, wu, cols, k_lo, k_hi, H: tl.constexpr,
              INTER: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr):
    """:func:`_gu_tile` for two row tiles at once: each gate and up chunk is loaded once and feeds both."""
    BM: tl.constexpr = rok.shape[0]
    BM2: tl.constexpr = rok2.shape[0]
    BN: tl.constexpr = cols.shape[0]
    cok = cols < INTER
    ag = tl.zeros([BM, BN], dtype=tl.float32)
    au = tl.zeros([BM, BN], dtype=tl.float32)
    ag2 = tl.zeros([BM2, BN], dtype=tl.float32)
    au2 = tl.zeros([BM2, BN], dtype=tl.float32)
    wg_row = wg + cols.to(tl.int64)[:, None] * H
    wu_row = wu + cols.to(tl.int64)[:, None] * H
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        offk = k0 + tl.arange(0, BK)[None, :]
        km = offk < H
        g = tl.load(g_post + offk, mask=km, other=0.0).to(tl.float32)
        x = tl.load(x_row + offk, mask=rok[:, None] & km, other=0.0, cache_modifier=".cg").to(tl.float32)
        xn = (g * _rnd(x * rs[:, None], DT)).to(DT)
        x2 = tl.load(x_row2 + offk, mask=rok2[:, None] & km, other=0.0, cache_modifier=".cg").to(tl.float32)
        xn2 = (g * _rnd(x2 * rs2[:, None], DT)).to(DT)
        w_g = _wcast(tl.load(wg_row + offk, mask=cok[:, None] & km, other=0.0), DT)
        w_u = _wcast(tl.load(wu_row + offk, mask=cok[:, None] & km, other=0.0), DT)
        ag = _dot(xn, w_g, ag, IEEE)
        au = _dot(xn, w_u, au, IEEE)
        ag2 = _dot(xn2, w_g, ag2, IEEE)
        au2 = _dot(xn2, w_u, au2, IEEE)
    return ag, au, ag2, au2


@triton.jit
def _gu_tile(x_row, rok, rs, g_post, wg, wu, cols, k_lo, k_hi, H: tl.constexpr, INTER: tl.constexpr,
             BK: tl.constexpr, DT: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr):
    """Gate's and up's fp32 sums of output features ``cols`` over the reduction ``[k_lo, k_hi)``."""
    BM: tl.constexpr = rok.shape[0]
    BN: tl.constexpr = cols.shape[0]
    cok = cols < INTER
    ag = tl.zeros([BM, BN], dtype=tl.float32)
    au = tl.zeros([BM, BN], dtype=tl.float32)
    wg_row = wg + cols.to(tl.int64)[:, None] * H
    wu_row = wu + cols.to(tl.int64)[:, None] * H
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        ag, au = _chunk_gu(x_row, rok[:, None], rs, g_post, wg_row, wu_row, cok[:, None], k0, ag, au, H, BK, DT, IEEE)
    return ag, au


@triton.jit
def _gu_out(ag, au, r, rok, cols, act, sc_g, INTER: tl.constexpr, W8: tl.constexpr, DT: tl.constexpr):
    """``silu(gate) * up`` of one tile from the full fp32 sums (gate's scales at ``sc_g``, up's at ``sc_g + INTER``)."""
    cok = cols < INTER
    gr = _epi(ag, sc_g, sc_g, cols, cok, W8, False, DT)
    a = _rnd(_rnd(gr / (1.0 + tl.exp(-gr)), DT) * _epi(au, sc_g + INTER, sc_g, cols, cok, W8, False, DT), DT)
    tl.store(act + r.to(tl.int64)[:, None] * INTER + cols[None, :], a.to(DT), mask=rok[:, None] & cok[None, :])


@triton.jit(noinline=True)
def _down_phase(s, act, wd, h1, hbuf, hss, sc_d, part, flag, B, MCAP, pid, H: tl.constexpr, INTER: tl.constexpr,
                K: tl.constexpr, NTH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                IEEE: tl.constexpr, STAGES: tl.constexpr, NPROG: tl.constexpr, W8: tl.constexpr, SK: tl.constexpr,
                NSEG: tl.constexpr, BMT: tl.constexpr = 0, TP1: tl.constexpr = False):
    """The step output ``h1 + down(act)`` into hbuf[(s + 1) % 2] (row statistics into hss[(s + 1) % 2]).
    ``TP1``: the tail tile in one pass with the last full tile (``DrafterConfig.tail_one_pass``)."""
    MQ = tl.where(s == 0, B, B * K)
    n_full, n_big, tail = _row_tiles(MQ, BM, BMT)
    n_alone, paired = _paired_tail(n_full, n_big, tail) if TP1 else (n_big, False)  # (False: no paired code)
    for mc in range(0, n_alone):
        _down_rows(mc * BM + tl.arange(0, BM), mc, s, act, wd, h1, hbuf, hss, sc_d, part, flag, MQ, MCAP, pid, H,
                   INTER, NTH, BM, BN, BK, IEEE, STAGES, NPROG, W8, SK, NSEG)
    if BMT > 0:
        if paired:
            _down_rows((n_full - 1) * BM + tl.arange(0, BM), n_full - 1, s, act, wd, h1, hbuf, hss, sc_d, part, flag,
                       MQ, MCAP, pid, H, INTER, NTH, BM, BN, BK, IEEE, STAGES, NPROG, W8, SK, NSEG,
                       n_full * BM + tl.arange(0, BMT))
        elif tail:
            _down_rows(n_full * BM + tl.arange(0, BMT), n_full, s, act, wd, h1, hbuf, hss, sc_d, part, flag, MQ, MCAP,
                       pid, H, INTER, NTH, BM, BN, BK, IEEE, STAGES, NPROG, W8, SK, NSEG)


@triton.jit
def _down_ptrs(r, s, act, h1, hbuf, hss, MQ, MCAP, H: tl.constexpr, INTER: tl.constexpr, NTH: tl.constexpr):
    """down's row pointers ``[R, 1]`` for the rows ``r``: (inputs, rows that exist, outputs, residuals, sums of
    squares)."""
    out_off = ((s + 1) % 2) * MCAP
    r = r.to(tl.int64)
    return (act + r[:, None] * INTER, (r < MQ)[:, None], hbuf + (out_off + r[:, None]) * H, h1 + r[:, None] * H,
            hss + (out_off + r[:, None]) * NTH)


@triton.jit
def _down_rows(r, mc, s, act, wd, h1, hbuf, hss, sc_d, part, flag, MQ, MCAP, pid, H: tl.constexpr,
               INTER: tl.constexpr, NTH: tl.constexpr, RB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               IEEE: tl.constexpr, STAGES: tl.constexpr, NPROG: tl.constexpr, W8: tl.constexpr, SK: tl.constexpr,
               NSEG: tl.constexpr, r2=None):
    """:func:`_down_phase` for the rows ``r`` of row tile ``mc`` (``RB``: the rows of a full tile), and with ``r2``
    the tail tile's rows in the same pass."""
    x, ok, out, res, ss = _down_ptrs(r, s, act, h1, hbuf, hss, MQ, MCAP, H, INTER, NTH)
    if r2 is None:
        _linear_tiles(x, ok, wd, out, res, ss, pid, sc_d, sc_d, part, flag, mc, INTER, H, True, BN, BK, IEEE,
                      STAGES, NPROG, W8, False, SK, NSEG, RB)
    else:
        x2, ok2, out2, res2, ss2 = _down_ptrs(r2, s, act, h1, hbuf, hss, MQ, MCAP, H, INTER, NTH)
        _linear_tiles(x, ok, wd, out, res, ss, pid, sc_d, sc_d, part, flag, mc, INTER, H, True, BN, BK, IEEE,
                      STAGES, NPROG, W8, False, SK, NSEG, RB, True, x2, ok2, out2, res2, ss2)


@triton.jit
def _tile_key(v, lidx, gidx, DT: tl.constexpr):
    """A program's vocabulary keys: for a 16-bit model dtype int32 ``(order-preserving bits of v << 16) | (65535 -
    lidx)`` with ``lidx`` the index within the program's tiles (v is exactly a DT value), else :func:`_pack` with
    the vocabulary row ``gidx``. Same order as _pack within one program."""
    if DT.primitive_bitwidth == 16:
        u = v.to(DT).to(tl.int16, bitcast=True).to(tl.int32)
        o = tl.where(u >= 0, u, u ^ 32767)
        return (o << 16) + (65535 - lidx)
    else:
        return _pack(v, gidx)


@triton.jit
def _tile_key_value(key, DT: tl.constexpr):
    if DT.primitive_bitwidth == 16:
        o = key >> 16
        u = tl.where(o >= 0, o, o ^ 32767)
        return u.to(tl.int16).to(DT, bitcast=True).to(tl.float32)
    else:
        return _unpack_value(key)


@triton.jit
def _tile_key_global(key, pid, kmin, DT: tl.constexpr, BNV: tl.constexpr, NPROG: tl.constexpr):
    """:func:`_tile_key` of program ``pid`` -> the int64 key :func:`_pack` gives the same value and vocabulary row
    (local index ``tt * BNV + c`` is row ``(pid + tt * NPROG) * BNV + c``)."""
    if DT.primitive_bitwidth == 16:
        lidx = 65535 - (key & 65535)
        g = _pack(_tile_key_value(key, DT), (pid + (lidx // BNV) * NPROG) * BNV + lidx % BNV)
        return tl.where(key == kmin, _MINKEY, g)
    else:
        return key


@triton.jit
def _lse_update(kt, run_m, run_s, kmin, DT: tl.constexpr):
    """Online logsumexp over the values of the keys ``kt`` (``kmin``: none); the row maximum comes from the largest
    key (an integer warp reduction)."""
    top = tl.max(kt, axis=1)
    m_new = tl.maximum(run_m, tl.where(top != kmin, _tile_key_value(top, DT), -1.0e30))
    e = tl.where(kt != kmin, tl.exp(_tile_key_value(kt, DT) - m_new[:, None]), 0.0)
    return m_new, run_s * tl.exp(run_m - m_new) + tl.sum(e, axis=1)


@triton.jit
def _lm_select(scr, sidx, n_my, n_ext, kmin, DT: tl.constexpr, BNV: tl.constexpr):
    """The epilogue of a program's lm_head tiles, from their keys parked in scratch (``n_my`` blocks of
    ``[BM, BNV]``): the logsumexp and the top-``n_ext`` keys of every row. Reloaded from memory the keys sit in a
    layout that keeps each row inside one warp, so every reduction is warp-level (REDUX / shuffles); in the product's
    layout a row spans all warps and each of the K extractions costs shared-memory round trips and block barriers.
    Returns (keys ``[BM, BNV]`` with the top list in columns ``[0, n_ext)``, row max, row sum of exp).
    (A narrower running list, ``[BM, KP]`` beside tiles viewed as ``[BM, BNV / KP, KP]``, measured slower: 98 vs
    94 us per step at the 8B shape.)"""
    BM: tl.constexpr = sidx.shape[0]
    # the first tile is the running list as it is; each later one (or an empty one when there is a single tile)
    # is merged into it by n_ext extractions (a program may have no tile: fewer tiles than programs)
    run = tl.load(scr + sidx, mask=(sidx * 0) < n_my, other=kmin)
    run_m, run_s = _lse_update(run, tl.full([BM], -1.0e30, dtype=tl.float32), tl.zeros([BM], dtype=tl.float32),
                               kmin, DT)
    for t in range(1, tl.maximum(n_my, 2)):
        kt = tl.load(scr + t * BM * BNV + sidx, mask=(sidx * 0 + t) < n_my, other=kmin)
        run_m, run_s = _lse_update(kt, run_m, run_s, kmin, DT)
        run = _topk_merge(run, kt, n_ext, kmin)
    return run, run_m, run_s


@triton.jit(noinline=True)
def _lm_phase(s, hbuf, hss, g_norm, wlm, lm_key, lm_ms, lm_scr, sc_lm, B, MCAP, eps, pid, H: tl.constexpr,
              VD: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, NPP: tl.constexpr, NTH: tl.constexpr,
              NTHP: tl.constexpr, BM: tl.constexpr, BNV: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
              STAGES: tl.constexpr, NPROG: tl.constexpr, LMW: tl.constexpr, W8: tl.constexpr, BMT: tl.constexpr = 0):
    """LM head over ``BNV``-wide vocabulary tiles (final RMSNorm inline): each program computes, per row, the top-``K``
    packed keys and the logsumexp of its tiles (``pid``, ``pid + NPROG``, ...), stored to its own slot of lm_key /
    lm_ms. (Contiguous ranges of ``VD / NPROG`` rows per program, equal bytes where whole tiles leave some programs
    a tile short, measured slower: H100 session 6, H200 session 36, docs/fused_drafter.md levers table.)

    Ranking, two ways (the host picks ``LMW``: ``DrafterConfig.lm_warp_rank``):
    - ``LMW`` (row tiles of up to 64 rows, and every row tile with FP8 weights): the pipelined product loop only
      parks each tile's keys in this program's slot of ``lm_scr`` (a barrier or a load inside the loop would stop
      Triton from pipelining it) and :func:`_lm_select` ranks them after the loop with warp-level reductions. At
      16 rows the cost was the block barriers of reductions across warps: LM 100 -> 94 us per step at the 8B shape
      (docs/fused_drafter.md session 6); at 64 rows, and with FP8 weights at 128, it measured faster too (session
      37).
    - otherwise (16-bit weights at 128-row tiles) each tile is merged into a running top-k inside the loop, in the
      product's layout, where half of the element work hides under the next tile's loads (ranked by warps there:
      8B batch 16 7.09 -> 7.23 ms on an H200, session 37)."""
    DT: tl.constexpr = hbuf.dtype.element_ty
    MQ = tl.where(s == 0, B, B * K)
    NVT: tl.constexpr = (VD + BNV - 1) // BNV
    MT: tl.constexpr = (NVT + NPROG - 1) // NPROG  # the most tiles a program has
    tl.static_assert(DT.primitive_bitwidth != 16 or MT * BNV <= 65536, "int32 tile keys hold 16-bit row indices")
    scr = lm_scr + pid * (MT * BM * BNV)  # this program's scratch (sized for a full row tile)
    n_full, n_big, tail = _row_tiles(MQ, BM, BMT)
    for mc in range(0, n_big):
        _lm_rows(mc * BM + tl.arange(0, BM), s, hbuf, hss, g_norm, wlm, lm_key, lm_ms, scr, sc_lm, MQ, MCAP, eps, pid,
                 H, VD, K, KP, NPP, NTH, NTHP, BNV, BK, IEEE, STAGES, NPROG, LMW, W8)
    if BMT > 0:
        if tail:
            _lm_rows(n_full * BM + tl.arange(0, BMT), s, hbuf, hss, g_norm, wlm, lm_key, lm_ms, scr, sc_lm, MQ, MCAP,
                     eps, pid, H, VD, K, KP, NPP, NTH, NTHP, BNV, BK, IEEE, STAGES, NPROG, LMW, W8)


@triton.jit
def _lm_rows(r, s, hbuf, hss, g_norm, wlm, lm_key, lm_ms, scr, sc_lm, MQ, MCAP, eps, pid, H: tl.constexpr,
             VD: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, NPP: tl.constexpr, NTH: tl.constexpr,
             NTHP: tl.constexpr, BNV: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr,
             NPROG: tl.constexpr, LMW: tl.constexpr, W8: tl.constexpr):
    """:func:`_lm_phase` for the rows ``r`` of one row tile (``scr``: this program's key scratch)."""
    DT: tl.constexpr = hbuf.dtype.element_ty
    KT: tl.constexpr = scr.dtype.element_ty
    if LMW and DT.primitive_bitwidth == 16:
        KMIN: tl.constexpr = -2147483648
    else:
        KMIN: tl.constexpr = _MINKEY
    BM: tl.constexpr = r.shape[0]
    out_off = ((s + 1) % 2) * MCAP
    offm = tl.arange(0, BM)
    offn = tl.arange(0, BNV)
    offkp = tl.arange(0, KP)
    offk = tl.arange(0, BK)[None, :]
    NKL: tl.constexpr = (H + BK - 1) // BK
    NVT: tl.constexpr = (VD + BNV - 1) // BNV
    n_my = (NVT - pid + NPROG - 1) // NPROG  # vocabulary tiles pid, pid + NPROG, ...
    # K as a trip count the compiler cannot see (MCAP >= 1, not specialised): the extraction loops stay rolled
    # (the phase's code is fetched cold every step)
    n_ext = K + (MCAP < 0).to(tl.int32)
    sidx = offm[:, None] * BNV + offn[None, :]
    rok = r < MQ
    x_row = hbuf + (out_off + r.to(tl.int64)[:, None]) * H
    rs = _rstd_parts(hss + (out_off + r.to(tl.int64)[:, None]) * NTH, rok[:, None], NTH, NTHP, H, eps)
    run_key = tl.full([BM, KP], _MINKEY, dtype=tl.int64)
    run_m = tl.full([BM], -1.0e30, dtype=tl.float32)
    run_s = tl.zeros([BM], dtype=tl.float32)
    if LMW:
        tl.debug_barrier()  # the previous row chunk's keys have been read
    # one pipelined loop over (this program's tiles x K chunks): the next tile's weights are in flight while a
    # tile's epilogue runs (a loop per tile would drain and refill the pipeline each time)
    acc = tl.zeros([BM, BNV], dtype=tl.float32)
    for it in tl.range(0, n_my * NKL, num_stages=STAGES):
        tt = it // NKL
        kk = it - tt * NKL
        cols = (pid + tt * NPROG) * BNV + offn
        cok = cols < VD
        k0 = kk * BK
        km = k0 + offk < H
        x = tl.load(x_row + k0 + offk, mask=rok[:, None] & km, other=0.0, cache_modifier=".cg").to(tl.float32)
        g = tl.load(g_norm + k0 + offk, mask=km, other=0.0).to(tl.float32)
        xn = (g * _rnd(x * rs[:, None], DT)).to(DT)
        w = _wcast(tl.load(wlm + cols.to(tl.int64)[:, None] * H + k0 + offk, mask=cok[:, None] & km, other=0.0),
                   DT)
        acc = _dot(xn, w, acc, IEEE)
        if kk == NKL - 1:
            lg = _epi(acc, sc_lm, sc_lm, cols, cok, W8, False, DT)
            if LMW:
                # local index tt * BNV + column: ordered as the vocabulary rows within this program
                key = tl.where(cok[None, :] & rok[:, None],
                               _tile_key(lg, (tt * BNV + offn)[None, :], cols[None, :] + r[:, None] * 0, DT), KMIN)
                tl.store(scr + tt * (BM * BNV) + sidx, key.to(KT))
            else:
                lgm = tl.where(cok[None, :], lg, -1.0e30)
                m_new = tl.maximum(run_m, tl.max(lgm, axis=1))
                run_s = run_s * tl.exp(run_m - m_new) + tl.sum(tl.where(cok[None, :],
                                                                        tl.exp(lgm - m_new[:, None]), 0.0), axis=1)
                run_m = m_new
                key = tl.where(cok[None, :] & rok[:, None], _pack(lg, cols[None, :] + r[:, None] * 0), _MINKEY)
                run_key = _topk_merge(run_key, key, K, _MINKEY)
            acc = tl.zeros([BM, BNV], dtype=tl.float32)
    prow = r.to(tl.int64) * NPP + pid
    if LMW:
        tl.debug_barrier()
        best, run_m, run_s = _lm_select(scr, sidx, n_my, n_ext, KMIN, DT, BNV)
        tl.store(lm_key + prow[:, None] * KP + offn[None, :], _tile_key_global(best, pid, KMIN, DT, BNV, NPROG),
                 mask=rok[:, None] & (offn[None, :] < KP))
    else:
        tl.store(lm_key + prow[:, None] * KP + offkp[None, :], run_key, mask=rok[:, None])
    tl.store(lm_ms + prow * 2, run_m, mask=rok)
    tl.store(lm_ms + prow * 2 + 1, run_s, mask=rok)


@triton.jit(noinline=True)
def _rm_phase(s, lm_key, lm_ms, ch_lp, ch_id, B, pid, prof, DT: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
              NPP: tl.constexpr, NPROG: tl.constexpr, PROFILE: tl.constexpr, RM32: tl.constexpr = False):
    """One row per unit: the top-``K`` of all programs' keys (``K`` extractions of the maximum; keys are unique apart
    from the padding) and the merged logsumexp -> the row's ``K`` children and their log-probs (model dtype).

    ``RM32`` (a 16-bit model dtype, a draft vocabulary of at most 65536 rows): the keys are ranked as int32 ones
    (:func:`_pack16`, the same order), whose reductions across the warps move half the bits: the extractions 7.2 ->
    3.6 us per step at the 8B shape (H200), FP8 60/7/10 1.529 -> 1.519 ms. (One bitonic ``tl.topk`` of the 4096
    int32 keys instead measured slower: 1.76 -> 1.95 ms; docs/fused_drafter.md, levers table, session 36.)"""
    MQ = tl.where(s == 0, B, B * K)
    offp = tl.arange(0, NPP)
    offkp = tl.arange(0, KP)
    for u in range(pid, MQ, NPROG):
        pok = offp < NPROG
        prow = tl.cast(u, tl.int64) * NPP + offp
        keys = tl.load(lm_key + prow[:, None] * KP + offkp[None, :], mask=pok[:, None], other=_MINKEY,
                       cache_modifier=".cg")
        pm = tl.load(lm_ms + prow * 2, mask=pok, other=-1.0e30, cache_modifier=".cg")
        ps = tl.load(lm_ms + prow * 2 + 1, mask=pok, other=0.0, cache_modifier=".cg")
        mx = tl.max(pm, axis=0)
        lse_s = tl.sum(ps * tl.exp(pm - mx), axis=0)
        _stamp(prof, 104, PROFILE)
        if RM32:
            best = _topk_flat(_cand_key(_unpack_value(keys), _unpack_index(keys), keys != _MINKEY, DT, True), K, KP,
                              -2147483648)
            v = _unpack16_value(best, DT)
            idx = _unpack16_index(best)
        else:
            best = _topk_flat(keys, K, KP)
            v = _unpack_value(best)
            idx = _unpack_index(best)
        _stamp(prof, 105, PROFILE)
        lp = _rnd((v - mx) - tl.log(lse_s), DT)
        tl.store(ch_lp + u * KP + offkp, lp)
        tl.store(ch_id + u * KP + offkp, idx)
        _stamp(prof, 106, PROFILE)


@triton.jit(noinline=True)
def _sel_phase(s, ch_lp, ch_id, d2t, cand_sc, cand_tok, par_list, tok_in, src, sc, fr, anc, B, pid,
               DT: tl.constexpr, HAS_D2T: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, D: tl.constexpr,
               NCP: tl.constexpr, CP: tl.constexpr, NPROG: tl.constexpr, TQ: tl.constexpr = False):
    """One sequence per unit: record the step's candidates (cumulative scores, tokens, parents); except after the
    last step, prune to the next frontier (top-``K`` by (score desc, index asc)) and advance its bookkeeping.
    The next step's input tokens (``tok_in``) are target-vocabulary ids, or with ``TQ`` draft-vocabulary indices
    (the rows of the q/k/v table)."""
    DP1: tl.constexpr = D + 1
    K16: tl.constexpr = ((DT == tl.bfloat16) or (DT == tl.float16)) and (KP * KP <= 65536)  # see _cand_key
    lvl = s - 1
    apar = (s + 1) % 2
    nanc = 1 - apar  # ancestor table written for the next step
    offc = tl.arange(0, KP)
    for b in range(pid, B, NPROG):
        kok = offc < K
        if s == 0:
            r_lp = tl.load(ch_lp + b * KP + offc, mask=kok, other=0.0, cache_modifier=".cg")
            r_cid = tl.load(ch_id + b * KP + offc, mask=kok, other=0, cache_modifier=".cg")
            r_tk = r_cid.to(tl.int64)
            if HAS_D2T:
                r_tk += tl.load(d2t + r_cid, mask=kok, other=0)
            tl.store(cand_sc + b * NCP + offc, r_lp, mask=kok)
            tl.store(cand_tok + b * NCP + offc, r_tk, mask=kok)
            tl.store(par_list + b * (1 + D * K) + offc, offc * 0, mask=offc == 0)
            tl.store(tok_in + b * K + offc, r_cid.to(tl.int64) if TQ else r_tk, mask=kok)
            tl.store(src + b * K + offc, offc * 0 + b, mask=kok)
            tl.store(sc + b * KP + offc, r_lp, mask=kok)
            tl.store(fr + b * KP + offc, offc, mask=kok)
            tl.store(anc + ((nanc * B + b) * KP + offc) * DP1, offc, mask=kok)
        else:
            # cumulative scores e_cu[e_kk, c] = child log-prob + parent score (model dtype)
            e_kk = offc[:, None]
            e_cc = offc[None, :]
            e_ok2 = (e_kk < K) & (e_cc < K)
            e_lp = tl.load(ch_lp + (b * K + e_kk) * KP + e_cc, mask=e_ok2, other=0.0, cache_modifier=".cg")
            e_cid = tl.load(ch_id + (b * K + e_kk) * KP + e_cc, mask=e_ok2, other=0, cache_modifier=".cg")
            e_psc = tl.load(sc + b * KP + offc, mask=kok, other=0.0, cache_modifier=".cg")
            e_cu = _rnd(e_lp + e_psc[:, None], DT)
            e_tk = e_cid.to(tl.int64)
            if HAS_D2T:
                e_tk += tl.load(d2t + e_cid, mask=e_ok2, other=0)
            e_gidx = K + lvl * K * K + e_kk * K + e_cc
            tl.store(cand_sc + b * NCP + e_gidx, e_cu, mask=e_ok2)
            tl.store(cand_tok + b * NCP + e_gidx, e_tk, mask=e_ok2)
            e_frp = tl.load(fr + b * KP + offc, mask=kok, other=0, cache_modifier=".cg")
            e_bias = 1 + K * K * tl.maximum(lvl - 1, 0) + tl.where(lvl > 0, K, 0)
            tl.store(par_list + b * (1 + D * K) + 1 + lvl * K + offc, e_frp + e_bias, mask=kok)
            if s < D:
                # the next frontier: top-K of the K*K cumulative scores by (score desc, index asc)
                e_cuc = tl.where(e_cu != e_cu, float("-inf"), e_cu)
                e_key = _cand_key(e_cuc, e_kk * K + e_cc, e_ok2, DT, K16)
                e_top = tl.topk(tl.reshape(e_key, [KP * KP]), KP)  # past the K-th: masked by kok below
                e_fidx = _cand_index(e_top, K16)
                e_fval = _cand_value(e_top, DT, K16)
                e_prow_ = e_fidx // K
                e_ccol = e_fidx % K
                e_cid_n = tl.load(ch_id + (b * K + e_prow_) * KP + e_ccol, mask=kok, other=0, cache_modifier=".cg")
                e_tk_n = e_cid_n.to(tl.int64)
                if HAS_D2T:
                    e_tk_n += tl.load(d2t + e_cid_n, mask=kok, other=0)
                e_ol = tl.arange(0, CP)[None, :]  # CP = pow2(D + 2) >= D + 1 levels
                e_a_old = tl.load(anc + ((apar * B + b) * KP + e_prow_[:, None]) * DP1 + e_ol,
                                  mask=kok[:, None] & (e_ol < s), other=0, cache_modifier=".cg")
                e_a_new = tl.where(e_ol == s, s * K + offc[:, None], e_a_old)
                tl.debug_barrier()
                tl.store(tok_in + b * K + offc, e_cid_n.to(tl.int64) if TQ else e_tk_n, mask=kok)
                tl.store(src + b * K + offc, b * K + e_prow_, mask=kok)
                tl.store(sc + b * KP + offc, e_fval, mask=kok)
                tl.store(fr + b * KP + offc, e_fidx, mask=kok)
                tl.store(anc + ((nanc * B + b) * KP + offc[:, None]) * DP1 + e_ol, e_a_new,
                         mask=kok[:, None] & (e_ol <= s))


@triton.jit(noinline=True)
def _tree_phase(ids, nnew, kvlen, cand_sc, cand_tok, par_list, o_tokens, o_retrieve, o_mask, o_pos, o_parents,
                o_nleaves, o_maxdepth, B, S, pid, prof, K: tl.constexpr, D: tl.constexpr, T: tl.constexpr,
                TP: tl.constexpr, NCP: tl.constexpr, CP: tl.constexpr, KP: tl.constexpr, DT: tl.constexpr,
                NPROG: tl.constexpr, PROFILE: tl.constexpr):
    """After the last step, per sequence: the final top-``T`` reranking and every tree buffer (EAGLE's
    draft_tokens, retrieve_indices, tree_mask, tree_position_ids, plus parents), and ``kv_len += num_new``.

    Everything after the three loads stays in registers: the top-``T`` is one bitonic ``tl.topk`` (the ``T``-th
    largest by ``T - 1`` maximum extractions took 19 us of the 36 us this phase took, H200), and the node -> candidate,
    parent and ancestor lookups are ``tl.gather`` where they were L2 round trips through scratch."""
    NC: tl.constexpr = K + D * K * K
    K16: tl.constexpr = ((DT == tl.bfloat16) or (DT == tl.float16)) and (NCP <= 65536)  # see _cand_key
    TS: tl.constexpr = TP if TP <= NCP else NCP  # a power of two > T (T <= NC <= NCP; TP = pow2(T + 1))
    for b in range(pid, B, NPROG):
        tl.debug_barrier()
        _stamp(prof, 110, PROFILE)
        f_offg = tl.arange(0, NCP)
        f_gok = f_offg < NC
        f_csc = tl.load(cand_sc + b * NCP + f_offg, mask=f_gok, other=0.0, cache_modifier=".cg")
        # token ids as int32 (a vocabulary is far below 2**31); par_list's 1 + D*K entries fit CP * KP >= (D + 2) * K
        f_ctok = tl.load(cand_tok + b * NCP + f_offg, mask=f_gok, other=0, cache_modifier=".cg").to(tl.int32)
        f_offl = tl.arange(0, CP * KP)
        f_plist = tl.load(par_list + b * (1 + D * K) + f_offl, mask=f_offl < 1 + D * K, other=0, cache_modifier=".cg")
        f_nb = tl.load(nnew + b)
        f_root_tok = tl.load(ids + b * S + f_nb - 1)
        f_csc = tl.where(f_csc != f_csc, float("-inf"), f_csc)
        # the T best candidates (keys are unique); node t >= 1 is the one with the t-th smallest index
        f_offs = tl.arange(0, TS)
        f_top_ok = f_offs < T
        f_key = _cand_key(f_csc, f_offg, f_gok, DT, K16)
        f_top = tl.topk(f_key, TS)
        f_tix = _cand_index(f_top, K16)
        f_thr = tl.sum(tl.where(f_offs == T - 1, f_top, 0), axis=0)  # the T-th largest key (f_top descends)
        # node of the i-th best = 1 + how many of the T best have a smaller index (a sort of 64 indices spilled)
        f_tnd = 1 + tl.sum((f_top_ok[None, :] & (f_tix[None, :] < f_tix[:, None])).to(tl.int32), axis=1)
        f_node = tl.cumsum((f_gok & (f_key >= f_thr)).to(tl.int32), axis=0)  # a candidate's node (if selected)
        _stamp(prof, 111, PROFILE)
        f_offt = tl.arange(0, TP)
        f_nok = (f_offt >= 1) & (f_offt <= T)
        f_gsel = tl.sum(tl.where(f_top_ok[None, :] & (f_tnd[None, :] == f_offt[:, None]), f_tix[None, :], 0), axis=1)
        f_tks = tl.where(f_offt == 0, f_root_tok, tl.gather(f_ctok, f_gsel, 0).to(tl.int64))
        tl.store(o_tokens + b * (T + 1) + f_offt, f_tks, mask=f_offt <= T)
        f_p = tl.where(f_nok, tl.gather(f_plist, f_gsel // K, 0), 0)
        f_pn = tl.gather(f_node, tl.maximum(f_p - 1, 0), 0)
        f_pn = tl.where(f_offt == 0, -1, tl.where(f_p > 0, f_pn, 0))
        tl.store(o_parents + b * (T + 1) + f_offt, f_pn.to(tl.int64), mask=f_offt <= T)
        _stamp(prof, 112, PROFILE)
        # ancestor-or-self matrix by pointer chasing (f_depth <= D + 1)
        f_ra = f_offt[:, None]
        f_ca = f_offt[None, :]
        f_aok = f_offt <= T
        f_m2 = (f_ca == f_ra) | (f_ca == 0)
        f_cur = f_pn
        for _c in range(0, D + 1):
            f_m2 = f_m2 | ((f_ca == f_cur[:, None]) & (f_cur[:, None] >= 0))
            f_cur = tl.where(f_cur >= 0, tl.gather(f_pn, tl.maximum(f_cur, 0), 0), f_cur)
        f_m2 = f_m2 & f_aok[:, None] & f_aok[None, :]
        f_depth = tl.sum(f_m2.to(tl.int32), axis=1) - 1
        _stamp(prof, 113, PROFILE)
        tl.store(o_pos + b * (T + 1) + f_offt, f_depth.to(tl.int64), mask=f_aok)
        f_mrow = (b * (T + 1) + f_ra).to(tl.int64) * (T + 1) + f_ca
        tl.store(o_mask + f_mrow, f_m2.to(tl.float32), mask=f_aok[:, None] & f_aok[None, :])
        # leaves (nodes nobody points to), ranked by node index
        f_is_par = tl.max(((f_pn[None, :] == f_ra) & (f_ca >= 1) & (f_ca <= T)).to(tl.int32), axis=1)
        f_leaf = (f_is_par == 0) & f_nok
        f_rank = tl.cumsum(f_leaf.to(tl.int32), axis=0) - 1
        f_offcc = tl.arange(0, CP)
        f_rr = (b * T + f_offt[:, None]).to(tl.int64) * (D + 2) + f_offcc[None, :]
        tl.store(o_retrieve + f_rr, tl.full([TP, CP], -1, tl.int64),
                 mask=(f_offt[:, None] < T) & (f_offcc[None, :] < D + 2))
        tl.debug_barrier()
        f_dst = (b * T + f_rank[:, None]).to(tl.int64) * (D + 2) + f_depth[None, :]
        tl.store(o_retrieve + f_dst, (f_ca + f_ra * 0).to(tl.int64), mask=f_leaf[:, None] & f_m2)
        tl.store(o_nleaves + b, tl.sum(f_leaf.to(tl.int64), axis=0))
        tl.store(o_maxdepth + b, tl.max(tl.where(f_aok, f_depth, 0), axis=0).to(tl.int64))
        tl.store(kvlen + b, tl.load(kvlen + b) + f_nb)
        _stamp(prof, 114, PROFILE)


@triton.jit
def _pf_tiles(w, pid, NPF, N: tl.constexpr, KDIM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SK: tl.constexpr,
              NPROG: tl.constexpr, w2=None, TWO: tl.constexpr = False):
    """:func:`_l2_prefetch` of the first ``NPF`` BK chunks this program streams of ``w`` ``[N, KDIM]`` (and of ``w2``,
    up's rows beside gate's) tiled as :func:`_linear_tiles`: its stream-K range with ``SK``, else its first tile.
    Inlined into the step loop, where the compiler hoists and spills its addresses; a ``noinline`` version (no
    spills) measured slower (docs/fused_drafter.md, "L2 prefetch and FP8 chunks at 128-row tiles")."""
    NC: tl.constexpr = (KDIM + BK - 1) // BK
    n_t: tl.constexpr = (N + BN - 1) // BN
    offn = tl.arange(0, BN)
    if SK:
        c_lo, c_hi, t0, n_seg = _streamk_span(pid, n_t, NC, True, NPROG)
        c_end = tl.minimum(c_hi, c_lo + NPF)
        for i in range(0, n_seg):  # segments past c_end ask for nothing
            t, s0, s1 = _streamk_segment(i, c_lo, c_end, t0, NC, True, pid, NPROG)
            cols = (t * BN + offn)[:, None]
            _l2_prefetch(w + cols.to(tl.int64) * KDIM, s0 * BK, s1 * BK, cols < N, KDIM)
            if TWO:
                _l2_prefetch(w2 + cols.to(tl.int64) * KDIM, s0 * BK, s1 * BK, cols < N, KDIM)
    else:
        cols = (pid * BN + offn)[:, None]
        _l2_prefetch(w + cols.to(tl.int64) * KDIM, 0, NPF * BK, cols < N, KDIM)
        if TWO:
            _l2_prefetch(w2 + cols.to(tl.int64) * KDIM, 0, NPF * BK, cols < N, KDIM)


@triton.jit
def _pf_qkv(wq, wk, wv, pid, NPF, split, H: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr,
            BN: tl.constexpr, BK: tl.constexpr, HQ_IN: tl.constexpr, NPROG: tl.constexpr, TQ: tl.constexpr = 0):
    """:func:`_l2_prefetch` of the first ``NPF`` chunks of a tree step's q/k/v (:func:`_qkv_phase`'s schedule: the
    embedding half only with ``HQ_IN``, the hidden half only with ``TQ``; both: nothing is streamed)."""
    NC: tl.constexpr = (2 - HQ_IN - TQ) * (H // BK)
    KB: tl.constexpr = TQ * H
    n_t = (NH * HD + BN - 1) // BN + 2 * ((NKV * HD + BN - 1) // BN)
    if NC > 0:
        c_lo, c_hi, t0, n_seg = _streamk_span(pid, n_t, NC, split, NPROG)
        c_end = tl.where(split, tl.minimum(c_hi, c_lo + NPF), c_hi)
        for i in range(0, tl.where(split, n_seg, tl.minimum(n_seg, 1))):
            t, s0, s1 = _streamk_segment(i, c_lo, c_end, t0, NC, split, pid, NPROG)
            s1 = tl.where(split, s1, tl.minimum(s1, NPF))
            which, rope, jj, f, fok, w_row = _qkv_tile_weights(t, wq, wk, wv, H, NH, NKV, HD, BN)
            _l2_prefetch(w_row, KB + s0 * BK, KB + s1 * BK, fok[:, None], 2 * H)


# ---------------------------------------------------------------------------------------------------------- kernel
# sizes that vary from call to call are not specialised (no recompilation when a step accepts 1 or 16 tokens)
@triton.jit(do_not_specialize=["S", "LMAX", "MCAP"])
def fused_drafter_kernel(
    # weights (emb_rstd: fp32 [vocab] RMSNorm statistics of the embedding rows, precomputed once; g_qkv: the input
    # and hidden RMSNorm weights concatenated; the embedding itself is addressed as hbuf + emb_off)
    fc_w, emb_rstd, g_qkv, wq, wk, wv, wo, g_post, wg, wu, wd, g_norm, wlm, d2t, cos_t, sin_t,
    # with W8: fp32 per-output-channel scales of every FP8 matrix, concatenated (fc, q, k, v, o, gate, up, down,
    # lm_head); with HAS_BIAS: the q, k, v and o_proj biases concatenated (model dtype; zeros where a head has none)
    wsc, wb,
    # with TQ: fp32 [VD, QW + 2 KVW], the embedding half of q/k/v for every draft token (host.token_qkv_table)
    tq_tab,
    # inputs: features [B, S, W], ids [B, S] (row j's token; the last valid one is the root), nnew [B]
    X, ids, nnew,
    # persistent state: draft KV [B, LMAX, NKV, HD] and rows held [B]
    kc, vc, kvlen,
    # scratch (hss / h1ss: per-tile sums of squares of hbuf / h1 rows; part / flag: stream-K partial sums and flags)
    hbuf, hss, qbuf, part, flag, hq_part, att_o, att_ml, attn, h1, h1ss, act, lm_key, lm_ms, lm_scr, ch_lp, ch_id,
    tok_in, src,
    sc, fr, anc, cand_sc, cand_tok, par_list,
    # outputs
    o_tokens, o_retrieve, o_mask, o_pos, o_parents, o_nleaves, o_maxdepth,
    # control (prof: [NPROG, PROF_SLOTS] int64 arrival times, written only when PROFILE)
    bar, status, prof,
    # runtime sizes; emb_off: elements from hbuf to the embedding table (one base pointer for both q/k/v inputs)
    B, S, LMAX, MCAP, emb_off, eps, sm_scale,
    # shapes
    H: tl.constexpr, W: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr,
    INTER: tl.constexpr, VD: tl.constexpr, HAS_D2T: tl.constexpr,
    K: tl.constexpr, KP: tl.constexpr, D: tl.constexpr, T: tl.constexpr, TP: tl.constexpr, NCP: tl.constexpr,
    CP: tl.constexpr,
    # launch / tiling: BN (fc, o, down), BNQ (q/k/v), BNG (gate/up), BNV (lm_head) output tiles; BKL / BKG / BK
    # reduction chunks of the BN-tiled products / gate-up / lm_head, BKQ (divides H) of q/k/v; NTH = H / BN tiles
    # of the H-wide outputs; NSEG >= programs sharing one stream-K q/k/v tile (a power of two); BMR, BKR, BNQR, BKQR:
    # the root step of a prompt longer than BM rows
    NPROG: tl.constexpr, NPP: tl.constexpr, NSPLIT: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BNQ: tl.constexpr, BNQR: tl.constexpr, BNG: tl.constexpr, BNV: tl.constexpr,
    BKL: tl.constexpr, BKG: tl.constexpr, BK: tl.constexpr, BKQ: tl.constexpr, BKV: tl.constexpr, BQ: tl.constexpr,
    NTH: tl.constexpr, NTHP: tl.constexpr,
    NSEG: tl.constexpr, BMR: tl.constexpr, BKR: tl.constexpr, BKQR: tl.constexpr,
    IEEE: tl.constexpr, STAGES: tl.constexpr, LMW: tl.constexpr, W8: tl.constexpr = False,
    HAS_BIAS: tl.constexpr = False, PROFILE: tl.constexpr = False,
    # HQ: the hidden half of each tree step's q/k/v is computed during the previous step's RM and SEL by programs
    # HQ_P0.. (which have no RM or SEL unit: HQ_P0 >= the row tile; 0 when one program runs everything); NSEGH >=
    # the programs sharing one of its tiles (a power of two)
    HQ: tl.constexpr = False, HQ_P0: tl.constexpr = 0, NSEGH: tl.constexpr = 1,
    # SKL: fc (of a prompt within one row tile), o, gate/up and down stream-K over (tile, chunk) as q/k/v, in part /
    # flag (a region per row tile; DrafterConfig.stream_k_linear); NSEGL >= the programs sharing one of their tiles
    SKL: tl.constexpr = False, NSEGL: tl.constexpr = 1,
    # PF: BK chunks of the next phase's weights each program asks L2 for while it waits at a barrier (0: none)
    PF: tl.constexpr = 0,
    # RM32: RM ranks int32 keys (a 16-bit model dtype, a draft vocabulary of at most 65536 rows)
    RM32: tl.constexpr = False,
    # TQ: tree steps read the embedding half of q/k/v from tq_tab (DrafterConfig.token_qkv_table)
    TQ: tl.constexpr = False,
    # BMT: rows of a tail row tile (0: none): a step's rows past its full BM-row tiles take a BMT-row tile when they
    # fit it (DrafterConfig.tail_row_tile); TP1: the products that take the tail in one pass with the last full tile
    # (DrafterConfig.tail_one_pass), a mask: 1 o, 2 gate/up, 4 down
    BMT: tl.constexpr = 0, TP1: tl.constexpr = 0,
):
    pid = tl.program_id(0)
    DT: tl.constexpr = hbuf.dtype.element_ty
    QW: tl.constexpr = NH * HD
    KVW: tl.constexpr = NKV * HD
    SC_G: tl.constexpr = 2 * H + QW + 2 * KVW  # offsets in wsc: gate's scales (up's follow), down's, lm_head's
    SC_D: tl.constexpr = SC_G + 2 * INTER
    SC_LM: tl.constexpr = SC_D + H
    bt = 0  # barrier target
    if PROFILE:
        tl.store(prof + pid * PROF_SLOTS, _now())
    # a prompt longer than one tree-row tile runs the root's fc and q/k/v on BMR-row tiles: the weights are
    # streamed once per BMR prompt rows instead of once per BM
    if B * S > BM:
        _fc_phase(X, fc_w, hbuf, hss, wsc, part, flag, B, S, pid, H, W, NTH, BMR, BN, BKR, IEEE, STAGES, NPROG, W8,
                  False, 1)
    else:
        _fc_phase(X, fc_w, hbuf, hss, wsc, part, flag, B, S, pid, H, W, NTH, BM, BN, BKL, IEEE, STAGES, NPROG, W8,
                  SKL, NSEGL)
    bt += NPROG
    _grid_sync(bar, bt, NPROG, prof, PROFILE)
    for s in range(0, D + 1):
        if (s == 0) & (B * S > BM):
            _qkv_phase(s, emb_off, emb_rstd, g_qkv, wq, wk, wv, cos_t, sin_t, ids, nnew, kvlen, kc, vc, hbuf, hss,
                       qbuf, part, flag, tok_in, src, status, wsc, wb, B, S, LMAX, MCAP, eps, pid, H, NH, NKV, HD,
                       K, NTH, NTHP, NSEG, BMR, BNQR, BKQR, IEEE, STAGES, NPROG, W8, HAS_BIAS)
        elif (HQ or TQ) and (s > 0):  # a tree step: the hidden half from the previous step's idle programs (HQ),
            # the embedding half from the table (TQ); the rest streamed here
            _qkv_phase(s, emb_off, emb_rstd, g_qkv, wq, wk, wv, cos_t, sin_t, ids, nnew, kvlen, kc, vc, hbuf, hss,
                       qbuf, part, flag, tok_in, src, status, wsc, wb, B, S, LMAX, MCAP, eps, pid, H, NH, NKV, HD,
                       K, NTH, NTHP, NSEG, BM, BNQ, BKQ, IEEE, STAGES, NPROG, W8, HAS_BIAS, HQ, hq_part, NSEGH,
                       NPROG - HQ_P0, TQ, tq_tab, BMT)
        else:
            _qkv_phase(s, emb_off, emb_rstd, g_qkv, wq, wk, wv, cos_t, sin_t, ids, nnew, kvlen, kc, vc, hbuf, hss,
                       qbuf, part, flag, tok_in, src, status, wsc, wb, B, S, LMAX, MCAP, eps, pid, H, NH, NKV, HD,
                       K, NTH, NTHP, NSEG, BM, BNQ, BKQ, IEEE, STAGES, NPROG, W8, HAS_BIAS, BMT=BMT)
        bt += NPROG
        _grid_sync(bar, bt, NPROG, prof, PROFILE)
        _att_phase(s, qbuf, kc, vc, anc, nnew, kvlen, att_o, att_ml, B, S, LMAX, sm_scale, pid, prof, NH, NKV, HD, K,
                   KP, D, NSPLIT, BKV, BQ, IEEE, NPROG, PROFILE)
        bt += NPROG
        _grid_sync(bar, bt, NPROG, prof, PROFILE)
        _comb_phase(s, att_o, att_ml, attn, B, pid, NH, HD, K, NSPLIT, NPROG)
        bt += NPROG
        _grid_arrive(bar, bt, NPROG, prof, PROFILE)
        if PF > 0:
            _pf_tiles(wo, pid, PF, H, QW, BN, BKL, SKL, NPROG)
        _grid_wait(bar, bt, NPROG)
        _o_phase(s, attn, wo, hbuf, src, nnew, h1, h1ss, wsc, wb, part, flag, B, S, MCAP, pid, H, QW, KVW, K, NTH,
                 BM, BN, BKL, IEEE, STAGES, NPROG, W8, HAS_BIAS, SKL, NSEGL, BMT, (TP1 & 1) != 0)
        bt += NPROG
        _grid_arrive(bar, bt, NPROG, prof, PROFILE)
        if PF > 0:
            _pf_tiles(wg, pid, PF, INTER, H, BNG, BKG, SKL, NPROG, wu, True)
        _grid_wait(bar, bt, NPROG)
        _gu_phase(s, h1, h1ss, g_post, wg, wu, act, wsc + SC_G, part, flag, B, eps, pid, H, INTER, K, NTH, NTHP,
                  BM, BNG, BKG, IEEE, STAGES, NPROG, W8, SKL, NSEGL, BMT, (TP1 & 2) != 0)
        bt += NPROG
        _grid_arrive(bar, bt, NPROG, prof, PROFILE)
        if PF > 0:
            _pf_tiles(wd, pid, PF, H, INTER, BN, BKL, SKL, NPROG)
        _grid_wait(bar, bt, NPROG)
        _down_phase(s, act, wd, h1, hbuf, hss, wsc + SC_D, part, flag, B, MCAP, pid, H, INTER, K, NTH, BM, BN, BKL,
                    IEEE, STAGES, NPROG, W8, SKL, NSEGL, BMT, (TP1 & 4) != 0)
        bt += NPROG
        _grid_arrive(bar, bt, NPROG, prof, PROFILE)
        if PF > 0:
            _pf_tiles(wlm, pid, PF, VD, H, BNV, BK, False, NPROG)
        _grid_wait(bar, bt, NPROG)
        _lm_phase(s, hbuf, hss, g_norm, wlm, lm_key, lm_ms, lm_scr, wsc + SC_LM, B, MCAP, eps, pid, H, VD, K, KP,
                  NPP, NTH, NTHP, BM, BNV, BK, IEEE, STAGES, NPROG, LMW, W8, BMT)
        bt += NPROG
        _grid_sync(bar, bt, NPROG, prof, PROFILE)
        hq_step = HQ and (s < D)  # this step's rows are the next step's parents
        if hq_step and (HQ_P0 > 0) and (pid >= HQ_P0):  # no RM or SEL unit here: the next q/k/v's hidden half
            bt += NPROG
            _grid_arrive(bar, bt, NPROG, prof, PROFILE)
            _hq_phase(s, hbuf, hss, g_qkv, wq, wk, wv, hq_part, B, MCAP, eps, pid - HQ_P0, H, NH, NKV, HD, K, NTH,
                      NTHP, NSEGH, BM, BNQ, BKQ, IEEE, STAGES, NPROG - HQ_P0)
        else:
            _rm_phase(s, lm_key, lm_ms, ch_lp, ch_id, B, pid, prof, DT, K, KP, NPP, NPROG, PROFILE, RM32)
            bt += NPROG
            _grid_sync(bar, bt, NPROG, prof, PROFILE)
            _sel_phase(s, ch_lp, ch_id, d2t, cand_sc, cand_tok, par_list, tok_in, src, sc, fr, anc, B, pid, DT,
                       HAS_D2T, K, KP, D, NCP, CP, NPROG, TQ)
            if hq_step and (pid >= HQ_P0):  # HQ_P0 == 0: one program does every phase in turn
                _hq_phase(s, hbuf, hss, g_qkv, wq, wk, wv, hq_part, B, MCAP, eps, pid - HQ_P0, H, NH, NKV, HD, K,
                          NTH, NTHP, NSEGH, BM, BNQ, BKQ, IEEE, STAGES, NPROG - HQ_P0)
        if s < D:
            bt += NPROG
            _grid_arrive(bar, bt, NPROG, prof, PROFILE)
            if PF > 0:  # the next tree step's q/k/v
                _pf_qkv(wq, wk, wv, pid, PF, B * K <= BM, H, NH, NKV, HD, BNQ, BKQ, HQ, NPROG, TQ)
            _grid_wait(bar, bt, NPROG)
    # the final reranking reads only this sequence's SEL output (same program): no barrier
    _tree_phase(ids, nnew, kvlen, cand_sc, cand_tok, par_list, o_tokens, o_retrieve, o_mask, o_pos, o_parents,
                o_nleaves, o_maxdepth, B, S, pid, prof, K, D, T, TP, NCP, CP, KP, DT, NPROG, PROFILE)
    if PROFILE:
        tl.store(prof + pid * PROF_SLOTS + PROF_SLOTS - 1, _now())
    # Reset the barrier counter for the next launch: the last program to get here knows every program has
    # passed every barrier of this launch.
    if NPROG > 1:
        done = tl.atomic_add(bar + 1, 1, sem="acq_rel")
        if done == NPROG - 1:
            tl.atomic_xchg(bar, 0, sem="relaxed")
            tl.atomic_xchg(bar + 1, 0, sem="relaxed")
