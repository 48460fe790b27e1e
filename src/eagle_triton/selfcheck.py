"""Integration check (``eagle-triton check``): every piece against its reference, end to end.

Run it as ``eagle-triton check``. Without a GPU the kernels run under Triton's interpreter, which must be switched
on before any kernel is defined, so the CLI re-runs this module in a subprocess with ``TRITON_INTERPRET=1``.
Shapes are tiny on the CPU and realistic on a GPU.
"""

from __future__ import annotations

import json
import time
import traceback


def _checks(gpu: bool):
    import torch

    from . import ops
    from .config import TreeConfig
    from .drafter import TreeDrafter, available_draft_backends
    from .testing import random_eagle3_head

    dev = "cuda" if gpu else "cpu"

    def close(a, b, tol=1e-4):
        err = (a.float() - b.float()).abs().max().item()
        assert err <= tol * (1 + b.float().abs().max().item()), f"max error {err:.3g}"

    def tree_attention():
        B, T, Hq, Hkv, D, L = 2, 5, 4, 2, 32, 40 if not gpu else 1024
        k = torch.randn(B, L + T, Hkv, D, device=dev)
        v = torch.randn_like(k)
        q = torch.randn(B, T, Hq, D, device=dev)
        lens = torch.tensor([L - 3, L], dtype=torch.int32, device=dev)
        mask = torch.rand(B, T, T, device=dev) > 0.5
        mask |= torch.eye(T, dtype=torch.bool, device=dev)
        close(ops.tree_attention(q, k, v, lens, mask), ops.tree_attention_ref(q, k, v, lens, mask))

    def lm_head_topk():
        x = torch.randn(3, 64, device=dev)
        w = torch.randn(96 if not gpu else 32000, 64, device=dev)
        a, b = ops.lm_head_topk(x, w, 4), ops.lm_head_topk_ref(x, w, 4)
        close(a[0], b[0])
        assert torch.equal(a[1], b[1])

    def kv_compaction():
        NL, B, L, H, D = 2, 2, 24, 2, 16
        k, v = torch.randn(NL, B, L, H, D, device=dev), torch.randn(NL, B, L, H, D, device=dev)
        lens = torch.tensor([3, 5], dtype=torch.int32, device=dev)
        idx = torch.tensor([[0, 2, 5, -1], [0, 1, 4, 7]], device=dev)
        n = torch.tensor([3, 4], dtype=torch.int32, device=dev)
        k2, v2 = k.clone(), v.clone()
        ops.compact_kv_cache(k, v, lens, idx, n)
        ops.compact_kv_cache_ref(k2, v2, lens, idx, n)
        assert torch.equal(k, k2) and torch.equal(v, v2)

    def drafter_backends():
        head = random_eagle3_head(seed=0).to(dev)
        cfg = TreeConfig(20, 3, 4)
        ids = torch.randint(0, 256, (1, 9), device=dev)
        feats = torch.randn(1, 8, head.feature_width, device=dev)
        ref = TreeDrafter(head, cfg).draft(feats, ids)
        for backend in available_draft_backends():
            if backend in ("torch", "stub") or (backend == "triton" and not gpu and not _interp()):
                continue
            tree = TreeDrafter(head, cfg, backend=backend).draft(feats, ids)
            assert torch.equal(tree.draft_tokens, ref.draft_tokens), f"{backend} differs from the reference"

    def engine_lossless():
        import transformers as tf

        from .engine import EagleEngine, LlamaTarget

        cfg = tf.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0, 0.15)
        head = random_eagle3_head(vocab_size=128, draft_vocab_size=48, seed=1)
        eng = EagleEngine(LlamaTarget.from_hf(model), head, TreeConfig(16, 3, 4), max_length=128)
        ids = torch.randint(0, 128, (7,)).tolist()
        spec, _ = eng.generate(input_ids=ids, max_new_tokens=16)
        plain, _ = eng.generate(input_ids=ids, max_new_tokens=16, speculative=False)
        hf = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=0,
                            attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):].tolist()
        assert spec == plain == hf, "speculative output differs from plain greedy decoding"

    return [("tree_attention vs reference", tree_attention), ("lm_head_topk vs reference", lm_head_topk),
            ("compact_kv_cache vs reference", kv_compaction), ("drafter back ends vs reference", drafter_backends),
            ("engine: speculative == plain == transformers", engine_lossless)]


def _interp() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def run_checks() -> list[dict]:
    import torch

    gpu = torch.cuda.is_available()
    results = []
    for name, fn in _checks(gpu):
        t0 = time.perf_counter()
        try:
            fn()
            results.append({"check": name, "ok": True, "seconds": round(time.perf_counter() - t0, 2)})
        except Exception as e:  # report every failure, keep going
            results.append({"check": name, "ok": False, "seconds": round(time.perf_counter() - t0, 2),
                            "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(limit=3)})
    return results


if __name__ == "__main__":
    print(json.dumps(run_checks()))
