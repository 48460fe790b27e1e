"""Compile-only specs of the fused drafter kernel: ``(kernel, signature, constexprs)`` for an sm_90 build."""

from __future__ import annotations

from .kernel import fused_drafter_kernel

__all__ = ["AOT_SPECS", "kernel_signature"]

_I64 = {"d2t", "ids", "tok_in", "cand_tok", "o_tokens", "o_retrieve", "o_pos", "o_parents", "o_nleaves",
        "o_maxdepth", "lm_key", "prof"}
_I32 = {"nnew", "kvlen", "ch_id", "src", "fr", "anc", "par_list", "node_of", "selg", "pnode", "posb", "bar",
        "status", "flag"}
_F32 = {"cos_t", "sin_t", "att_o", "att_ml", "lm_ms", "ch_lp", "sc", "cand_sc", "o_mask", "emb_rstd", "hss", "h1ss",
        "part"}
_SCALARS = {"B": "i32", "S": "i32", "LMAX": "i32", "MCAP": "i32", "emb_off": "i64", "eps": "fp32", "sm_scale": "fp32"}


def kernel_signature(dtype: str, constexprs: dict) -> dict:
    """Triton signature of :func:`fused_drafter_kernel` for model dtype ``dtype`` ("bf16", "fp16", "fp32")."""
    sig = {}
    for name in fused_drafter_kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in _SCALARS:
            sig[name] = _SCALARS[name]
        elif name == "lm_scr":  # keys of the lm_head tiles: int32 for 16-bit model dtypes when ranked by warps
            sig[name] = "*i32" if constexprs["LMW"] and dtype != "fp32" else "*i64"
        elif name in _I64:
            sig[name] = "*i64"
        elif name in _I32:
            sig[name] = "*i32"
        elif name in _F32:
            sig[name] = "*fp32"
        else:
            sig[name] = f"*{dtype}"
    return sig


def _llama8b(dtype: str, nprog: int, batch: int) -> tuple:
    K, D, T = 10, 7, 59
    const = dict(H=4096, W=12288, NH=32, NKV=8, HD=128, INTER=14336, VD=32000, HAS_D2T=True, K=K, KP=16, D=D, T=T,
                 TP=64, NCP=1024, CP=16, NPROG=nprog, NPP=256 if nprog > 128 else 128, NSPLIT=16,
                 BM=16 if batch == 1 else 64, BN=64, BNQ=128 if batch == 1 else 64, BNQR=64, BNG=64, BNV=128,
                 BKL=256, BKG=128, BK=128, BKV=64, BQ=64,
                 NTH=64, NTHP=64, BKQ=128, NSEG=4, BMR=128, BKR=64,
                 BKQR=64, IEEE=dtype == "fp32", STAGES=4, LMW=batch == 1, PROFILE=False)
    # emb_off is a multiple of 16 at run time (both tensors come from the 512-byte aligned CUDA allocator)
    return (fused_drafter_kernel, kernel_signature(dtype, const), const,
            dict(num_warps=8, num_stages=4, div16=["emb_off"]))


def _tiny(dtype: str) -> tuple:
    const = dict(H=64, W=192, NH=4, NKV=2, HD=16, INTER=96, VD=96, HAS_D2T=True, K=4, KP=4, D=3, T=19, TP=32,
                 NCP=64, CP=8, NPROG=1, NPP=1, NSPLIT=2, BM=16, BN=16, BNQ=16, BNQR=16, BNG=16, BNV=16, BKL=32,
                 BKG=32, BK=32, BKV=16,
                 BQ=16, NTH=4, NTHP=4, BKQ=32, NSEG=1, BMR=32, BKR=32, BKQR=32, IEEE=dtype == "fp32", STAGES=1,
                 LMW=True, PROFILE=False)
    return (fused_drafter_kernel, kernel_signature(dtype, const), const)


#: Built by the compile-only gate: the Llama-3.1-8B EAGLE-3 shape on an H100 (132 SMs) and a tiny fp32 shape.
AOT_SPECS = [_llama8b("bf16", 132, 1), _tiny("fp32")]
