"""An L2 prefetch hint for kernels launched with programmatic dependent launch (PDL).

A PDL kernel may start while the previous kernel in the stream finishes; before ``gdc_wait`` it may only read
what that kernel does not write. Loading weights into registers there costs registers or a pipeline stage (slower
at the Llama-8B tiles, ``bench/results/pdl_2026-11-25/chain_8b.json``); asking L2 for them costs neither: the HBM
reads start during the previous kernel's tail and the first loads after the wait find their lines in L2.

A prefetch never changes a value. L2 is the GPU's point of coherence for global memory, so a line prefetched before
another kernel writes it is updated by that write, and the loads after ``gdc_wait`` read the written bytes.
Pointers must lie inside an allocation (callers clamp their indices). sm_90 PTX (``prefetch.global.L2``): the
callers use it only on the PDL path, which the interpreter never takes.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def l2_prefetch_rows(rows, n_cols, SPAN: tl.constexpr, LINE: tl.constexpr):
    """Ask L2 for the first ``SPAN`` elements (clamped to the row's ``n_cols``) of each row at ``rows`` (``[R, 1]``
    pointers): one hint per ``LINE`` elements (a 128-byte line: 64 for 16-bit elements); ``SPAN`` and ``LINE``
    powers of 2."""
    NL: tl.constexpr = (SPAN + LINE - 1) // LINE
    cols = tl.minimum(tl.arange(0, NL) * LINE, n_cols - 1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [rows + cols[None, :]], dtype=tl.int32,
                              is_pure=False, pack=1)
