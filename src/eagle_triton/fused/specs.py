"""Compile-only specs of the fused drafter kernel: ``(kernel, signature, constexprs)`` for an sm_90 build."""

from __future__ import annotations

import inspect

from .kernel import fused_drafter_kernel

__all__ = ["AOT_SPECS", "constexpr_names", "kernel_signature"]

_I64 = {"d2t", "ids", "tok_in", "cand_tok", "o_tokens", "o_retrieve", "o_pos", "o_parents", "o_nleaves",
        "o_maxdepth", "lm_key", "prof"}
_I32 = {"nnew", "kvlen", "ch_id", "src", "fr", "anc", "par_list", "bar",
        "status", "flag"}
_F32 = {"cos_t", "sin_t", "att_o", "att_ml", "lm_ms", "ch_lp", "sc", "cand_sc", "o_mask", "emb_rstd", "hss", "h1ss",
        "part", "hq_part", "wsc", "tq_tab"}
_MATRICES = {"fc_w", "wq", "wk", "wv", "wo", "wg", "wu", "wd", "wlm"}  # fp8e4nv when the constexpr W8 is set
_SCALARS = {"B": "i32", "S": "i32", "LMAX": "i32", "MCAP": "i32", "emb_off": "i64", "eps": "fp32", "sm_scale": "fp32"}


def constexpr_names() -> list[str]:
    """The kernel's ``tl.constexpr`` parameters, read from its Python function (the interpreter's wrapper too)."""
    fn = fused_drafter_kernel
    while hasattr(fn, "fn"):
        fn = fn.fn
    return [n for n, p in inspect.signature(fn).parameters.items() if "constexpr" in str(p.annotation)]


def kernel_signature(dtype: str, constexprs: dict) -> dict:
    """Triton signature of :func:`fused_drafter_kernel` for model dtype ``dtype`` ("bf16", "fp16", "fp32"); the
    weight matrices are ``fp8e4nv`` when ``constexprs["W8"]``. Every constexpr parameter must be given: one left
    out would be typed as a pointer argument here and fail to compile far from the cause."""
    missing = [name for name in constexpr_names() if name not in constexprs]
    if missing:
        raise ValueError(f"constexprs of fused_drafter_kernel not given: {', '.join(missing)}")
    sig = {}
    for name in fused_drafter_kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in _SCALARS:
            sig[name] = _SCALARS[name]
        elif name == "lm_scr":  # keys of the lm_head tiles: int32 for 16-bit model dtypes when ranked by warps
            sig[name] = "*i32" if constexprs["LMW"] and dtype != "fp32" else "*i64"
        elif name in _MATRICES and constexprs.get("W8"):
            sig[name] = "*fp8e4nv"
        elif name in _I64:
            sig[name] = "*i64"
        elif name in _I32:
            sig[name] = "*i32"
        elif name in _F32:
            sig[name] = "*fp32"
        else:
            sig[name] = f"*{dtype}"
    return sig


def _gpu_spec(dtype: str, nprog: int, batch: int, fp8: bool = False, bias: bool = False, hidden=4096, heads=32,
              kv_heads=8, inter=14336, vocab=128256, draft_vocab=32000, table: bool | None = None) -> tuple:
    """The launch of :func:`launch_drafter` on an H100 (``nprog`` programs) for a Llama-class head, 60/7/10 tree,
    ``batch`` sequences of 4 new rows: the constexprs are :meth:`DrafterConfig.launch_params`' own. The 8B shape by
    default; ``table``: ``DrafterConfig.token_qkv_table`` (``None``: its default)."""
    import torch

    from .host import DrafterConfig

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    cfg = DrafterConfig(hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads,
                        intermediate_size=inter, draft_vocab=draft_vocab, feature_width=3 * hidden, vocab_size=vocab,
                        rms_eps=1e-5, has_d2t=True, max_batch=batch, dtype=tdt, nprog=nprog,
                        weight_dtype=torch.float8_e4m3fn if fp8 else None, attention_bias=bias,
                        token_qkv_table=table)
    const = cfg.launch_params(torch.device("cuda"), batch, 4)
    opts = dict(num_warps=const.pop("num_warps"), num_stages=4, div16=["emb_off"])
    const["PROFILE"] = False
    # emb_off is a multiple of 16 at run time (both tensors come from the 512-byte aligned CUDA allocator)
    return fused_drafter_kernel, kernel_signature(dtype, const), const, opts


def _tiny(dtype: str) -> tuple:
    const = dict(H=64, W=192, NH=4, NKV=2, HD=16, INTER=96, VD=96, HAS_D2T=True, K=4, KP=4, D=3, T=19, TP=32,
                 NCP=64, CP=8, NPROG=1, NPP=1, NSPLIT=2, BM=16, BN=16, BNQ=16, BNQR=16, BNG=16, BNV=16, BKL=32,
                 BKG=32, BK=32, BKV=16,
                 BQ=16, NTH=4, NTHP=4, BKQ=32, NSEG=1, BMR=32, BKR=32, BKQR=32, STAGES=1,
                 IEEE=dtype == "fp32", LMW=True, W8=False, HAS_BIAS=False, PROFILE=False, HQ=False,
                 HQ_P0=0, NSEGH=1, SKL=True, NSEGL=1, PF=0, TQ=False, RM32=False, BMT=0, TP1=0)
    return (fused_drafter_kernel, kernel_signature(dtype, const), const)


#: Built by the compile-only gate (H100, 132 SMs): the Llama-3.1-8B EAGLE-3 shape in bf16 and with FP8 weights, a
#: Llama-3.2-1B-class head (head_dim 64, FP8, attention biases, batch 16: a 128-row tile and a 32-row tail tile),
#: the Llama-3.3-70B shape (GQA 8: 128-row attention query blocks), the 8B shape at batch 16 without the q/k/v table
#: (its tree steps stream both halves; bf16's 32-row tail taken in one pass with the 128-row tile in o, gate/up and
#: down) and a tiny fp32 shape. The other big shapes read the q/k/v table at tree steps (the default there), the
#: batch-1 ones with the hidden half early (nothing left to stream in their q/k/v); the FP8 batch-16 one streams
#: the hidden half.
AOT_SPECS = [_gpu_spec("bf16", 132, 1), _gpu_spec("bf16", 132, 1, fp8=True),
             _gpu_spec("bf16", 132, 16, fp8=True, bias=True, hidden=2048, inter=8192),
             _gpu_spec("bf16", 132, 1, hidden=8192, heads=64, inter=28672), _gpu_spec("bf16", 132, 16, table=False),
             _tiny("fp32")]
