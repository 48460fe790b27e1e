"""Where the engine's step time goes at the Llama-3.1-8B shape (GPU probe, random weights, bf16, batch 1).

Times, in one run: the target's own decode and verify graphs (``LlamaTarget._run`` / ``verify``), the engine's
captured plain and speculative step graphs replayed back to back, the same steps through ``generate`` (lagged
read), and the speculative step graph without its draft (the tree of the last draft reused) so that the draft's
share of the step is the difference. Norm modes are compared with ``--norm-modes``.

    python bench/probes/step_probe.py --out step_probe.json [--norm-modes partials,kernel] [--trees 60/7/10]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--norm-modes", default="partials")
    p.add_argument("--trees", default="60/7/10")
    p.add_argument("--new-tokens", type=int, default=96)
    args = p.parse_args(argv)
    import bench_fused_drafter as bfd
    import bench_target as bt

    from eagle_triton import TreeConfig
    from eagle_triton.engine import EagleEngine, LlamaTarget
    from eagle_triton.engine.sampling import SamplingParams

    bw = bt.copy_bandwidth()
    model = bt.build_8b()
    floor = sum(q.numel() * q.element_size() for q in model.parameters()) / bw * 1e3
    head = bfd.make_head("llama31-8b", False)
    ids = torch.randint(0, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    res = {"floor_ms": floor, "copy_bandwidth": bw, "runs": []}
    greedy = SamplingParams()
    for mode in args.norm_modes.split(","):
        target = LlamaTarget.from_hf(model, norm_mode=mode)
        r = {"norm_mode": mode}
        r.update(bt.time_steps(target, 64, 60, 8))
        for tree in args.trees.split(","):
            tc = TreeConfig(*map(int, tree.split("/")))
            eng = EagleEngine(target, head, tc, max_length=512)
            for spec in (False, True):
                name = f"{'spec_' + tree if spec else 'plain'}"
                eng.generate(input_ids=ids, max_new_tokens=8, eos_token_id=None, speculative=spec)
                t0 = time.perf_counter()
                _, st = eng.generate(input_ids=ids, max_new_tokens=args.new_tokens, eos_token_id=None,
                                     speculative=spec)
                wall = time.perf_counter() - t0 - st.prefill_s
                r[name + "_generate_ms_per_step"] = 1e3 * st.step_s / st.steps
                r[name + "_wall_ms_per_step"] = 1e3 * wall / st.steps
                run = eng._runners[spec]
                graphs = list(run._graphs.values())
                if graphs:
                    r[name + "_graph_replay_ms"] = bt.median_ms(graphs[0].replay)
                if spec:  # the step without its draft: verify + accept + commit + next inputs on the last tree
                    d = eng.drafter

                    class Reuse:
                        def __init__(self, inner):
                            self.inner, self.tree = inner, None

                        def draft_rows(self, *a, **k):
                            if self.tree is None:
                                self.tree = self.inner.draft_rows(*a, **k)
                            return self.tree

                    reuse = Reuse(d)
                    run.drafter = reuse
                    reuse.draft_rows(run.feats, run.ids, run.num_new, sampling=False)
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        run._speculative_body(greedy, run.feats, run.ids, run.num_new, None)
                    r[name + "_graph_without_draft_ms"] = bt.median_ms(g.replay)
                    r[name + "_draft_in_step_ms"] = r[name + "_graph_replay_ms"] - r[name + "_graph_without_draft_ms"]
                    run.drafter = d
                    del g
            del eng
        print(json.dumps(r, indent=1), flush=True)
        res["runs"].append(r)
        del target
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
