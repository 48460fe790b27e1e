"""Host (CPU) cost of one patched SafeAILab ``topK_genrate`` call, with the drafter's launch replaced by a no-op.

SafeAILab synchronises after every ``topK_genrate`` call, so every microsecond of Python between entering the
patched call and the kernel's launch, and between the kernel's end and the return, is GPU idle time. This probe
measures that Python on the CPU: a tiny EAGLE-3 head in SafeAILab's layout (the stand-in the tests use), patched
with the fused drafter's path (``draft_replayed`` with the padded static rows, as on CUDA), drafted for real a few
times (under Triton's interpreter: the outputs exist), then the CUDA graph's replay is replaced by a no-op that
leaves the last tree in the buffers. What remains per call is exactly the CUDA steady state's host work, except
that the device->host transfer is a plain CPU copy and the synchronisation is absent.

    TRITON_INTERPRET=1 python bench/probes/safeailab_host_cost.py [--calls 3000] [--tree 60,7,10] [--sampling]
        [--profile] [--json out.json]

Prints the median and minimum microseconds per call (CPU, one torch thread), the torch ops of one call (counted
with a dispatch mode) and, with ``--profile``, the top functions of cProfile by own time. Figures are CPU host
time of this machine, not GPU figures. The code before commit fed60fa is measured by running this file with
``PYTHONPATH`` pointing at that commit's ``src`` (``git archive f884a68 src | tar -x -C /tmp/before``).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import os
import pstats
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before eagle_triton is imported: the warm-up drafts run

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


class _NoopGraph:
    """Stands in for a captured CUDA graph: replaying it leaves the last tree in the drafter's buffers."""

    def replay(self) -> None:
        pass


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


def build(tree: tuple[int, int, int], rows: int, lp=None):
    """A patched stand-in in the CUDA steady state (graph 'captured'), the ``(feats, ids)`` of its calls, and a
    function that rewinds the draft KV's host length (the no-op replay drafts nothing, so the calls can go on)."""
    from eagle_triton import TreeConfig
    from eagle_triton.fused.host import FusedDraftBackend
    from eagle_triton.integrations.safeailab import patch_ea_model_with_triton_drafter
    from eagle_triton.testing import SafeAILabStandIn, random_eagle3_head

    head = random_eagle3_head(seed=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    model = SafeAILabStandIn(head, TreeConfig(*tree))
    patch_ea_model_with_triton_drafter(model, backend="triton")
    ea = model.ea_layer
    impl = ea.topK_genrate.drafter._impl
    assert isinstance(impl, FusedDraftBackend) and not impl.fallback_reason, impl.fallback_reason
    if hasattr(impl, "replay_padded"):
        impl.replay_padded = True  # the padded static rows, as on CUDA
    else:  # the code before commit fed60fa (the "before" figure): the padded rows through the argument
        import functools

        impl.draft_replayed = functools.partial(impl.draft_replayed, padded=True)
    W = head.feature_width
    g = torch.Generator().manual_seed(0)
    prompt = 8
    total = prompt + 1 + rows * 4 + rows * 200
    ids = torch.randint(0, head.config.vocab_size, (1, total), generator=g)
    feats0 = torch.randn(1, prompt, W, generator=g)
    feats = torch.randn(1, rows, W, generator=g)
    ea.reset_kv()
    ea.topK_genrate(feats0, ids[:, :prompt + 1], None, lp)  # the prompt: plain launch
    L = prompt
    for _ in range(3):  # steps through the padded rows (real interpreted launches)
        ea.topK_genrate(feats, ids[:, :L + rows + 1], None, lp)
        L += rows
    _install_noop_replay(impl, lp is not None)
    base = L
    views = [ids[:, :base + rows * (i + 1) + 1] for i in range(200)]

    def rewind():
        impl._kv_len = base

    return ea, feats, views, rewind


def _install_noop_replay(impl, sampling: bool) -> None:
    """Every padded entry 'captured': its replay leaves the tree of its last (real) launch in the buffers."""
    if isinstance(impl._replay, dict):  # before commit fed60fa: one graph per sampling mode, (graph, tree)
        from eagle_triton.tree import DraftTree

        b = impl.bufs
        tree = DraftTree(draft_tokens=b.draft_tokens, tree_mask=b.tree_mask, positions=b.positions, parents=b.parents,
                         retrieve_indices_padded=b.retrieve, num_leaves=b.num_leaves, max_depth=b.max_depth)
        impl._replay["graphs"][sampling] = (_NoopGraph(), tree.in_sampling_order() if sampling else tree)
        return
    for entry in impl._replay.entries.values():
        assert entry.tree is not None
        entry.graph = _NoopGraph()


def measure(ea, feats, views, rewind, calls: int, lp=None) -> list[float]:
    times = []
    call = ea.topK_genrate
    n = len(views)
    with torch.no_grad():
        for start in range(0, calls, n):
            rewind()
            for ids in views[:min(n, calls - start)]:
                t0 = time.perf_counter_ns()
                call(feats, ids, None, lp)
                times.append((time.perf_counter_ns() - t0) / 1e3)
    return times


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--tree", default="60,7,10", help="total_tokens,depth,top_k")
    p.add_argument("--rows", type=int, default=4, help="new rows per call (accepted tokens)")
    p.add_argument("--sampling", action="store_true", help="calls with a logits processor (a sampling tree)")
    p.add_argument("--profile", action="store_true", help="cProfile the calls, top 25 functions by own time")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    tree = tuple(int(x) for x in args.tree.split(","))
    lp = object() if args.sampling else None  # SafeAILab only tests the logits processor against None
    ea, feats, views, rewind = build(tree, args.rows, lp)
    measure(ea, feats, views, rewind, 500, lp)  # warm
    times = measure(ea, feats, views, rewind, args.calls, lp)
    rewind()
    with _Ops() as rec:
        ea.topK_genrate(feats, views[0], None, lp)
    res = dict(what="CPU host time per patched topK_genrate call, kernel launch/graph replay replaced by a no-op",
               tree=tree, rows=args.rows, sampling=args.sampling, calls=len(times),
               median_us=statistics.median(times), min_us=min(times),
               p10_us=sorted(times)[len(times) // 10], torch_ops=sum(rec.ops.values()), ops=dict(rec.ops))
    print(f"host us per call (CPU): median {res['median_us']:.1f}, p10 {res['p10_us']:.1f}, min {res['min_us']:.1f} "
          f"over {res['calls']} calls")
    print(f"torch ops per call: {res['torch_ops']} {dict(rec.ops.most_common())}")
    if args.profile:
        prof = cProfile.Profile()
        rewind()
        prof.enable()
        measure(ea, feats, views, rewind, args.calls, lp)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
