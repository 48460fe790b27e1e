"""The engine's device-paced steps (engine/step.py): queued ahead of the host's read, one device read per step,
and the same tokens as the host-paced steps and as plain decoding."""

from __future__ import annotations

import pytest
import torch
from engine_testlib import hf_greedy, tiny_llama

from eagle_triton import TreeConfig, TreeDrafter
from eagle_triton.engine import EagleEngine, LlamaTarget
from eagle_triton.engine.sampling import DeviceRNG
from eagle_triton.testing import random_eagle3_head

V = 128


@pytest.fixture(scope="module")
def target(tiny_model):
    return LlamaTarget.from_hf(tiny_model)


def _head(seed=1):
    return random_eagle3_head(hidden_size=64, vocab_size=V, draft_vocab_size=48, seed=seed)


def _prompt(seed, n):
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class _ReadCounter:
    """Counts every host read of a tensor's values (``item``, ``tolist``, ``bool``/``int``/``float``, ``numpy``)."""

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.NAMES:
            orig = getattr(torch.Tensor, name)

            def wrapped(t, *a, _orig=orig, **k):
                self.count += 1
                return _orig(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, wrapped)


@pytest.mark.parametrize("speculative", [True, False])
def test_one_device_read_per_step(monkeypatch, speculative):
    """With the Triton ops (interpreter) every kernel takes its lengths from tensors, so the only host read of a
    step is the engine's own (the PyTorch ops' KV compaction reference reads on the host)."""
    small = tiny_llama(vocab=V, hidden=32, layers=2, heads=2, kv_heads=1, seed=3)
    target = LlamaTarget.from_hf(small, ops="triton")
    eng = EagleEngine(target, drafter=TreeDrafter(_head(), TreeConfig(6, 2, 2), backend="stub"), max_length=64)
    assert eng._runner(speculative).device_paced
    prompt = _prompt(3, 5)
    counter = _ReadCounter(monkeypatch)
    out, stats = eng.generate(input_ids=prompt, max_new_tokens=9, seed=0, speculative=speculative)
    # one read per step, plus the first token's; a step queued ahead and dropped at the stop is never read
    assert stats.steps >= 3 and counter.count == stats.steps + 1, (counter.count, stats.steps)
    assert out == hf_greedy(small, prompt, 9)


def test_stub_drafter_steps_equal_plain_decoding(tiny_model, target):
    """The stub drafter's trees are mostly wrong: every kind of accept length and a -1 padded tail, queued ahead."""
    prompt = _prompt(5, 9)
    ref = hf_greedy(tiny_model, prompt, 40)
    for tree in (TreeConfig(10, 3, 3), TreeConfig(4, 3, 1)):
        eng = EagleEngine(target, drafter=TreeDrafter(_head(), tree, backend="stub"), max_length=128)
        for cap in (1, 2, 7, 40):
            out, stats = eng.generate(input_ids=prompt, max_new_tokens=cap)
            assert out == ref[:cap] and stats.new_tokens == cap
        plain, _ = eng.generate(input_ids=prompt, max_new_tokens=40, speculative=False)
        assert plain == ref


def test_fused_drafter_device_paced_equals_reference_host_paced(tiny_model, target):
    """The fused kernel (Triton interpreter) in device-paced steps vs the reference drafter in host-paced steps:
    same tokens, same accepted lengths step by step (fp32), and both equal to plain greedy decoding."""
    tree = TreeConfig(8, 2, 3)
    head = _head(seed=4)
    fused = EagleEngine(target, head, tree, max_length=96, drafter_backend="triton")
    ref = EagleEngine(target, head, tree, max_length=96, drafter_backend="torch")
    assert fused._runner(True).device_paced and not ref._runner(True).device_paced
    prompt = _prompt(8, 11)
    a, sa = fused.generate(input_ids=prompt, max_new_tokens=14)
    b, sb = ref.generate(input_ids=prompt, max_new_tokens=14)
    assert a == b == hf_greedy(tiny_model, prompt, 14)
    assert sa.accept_length_histogram == sb.accept_length_histogram and sa.steps == sb.steps


def test_drafter_options_reach_the_fused_drafter(tiny_model, target):
    """``drafter_options`` go to every drafter the engine builds: the fused drafter with ``hidden_half_early``
    (one program under the interpreter) gives the reference drafter's tokens and accepted lengths, as it does with
    ``token_qkv_table=False`` (then without a table); options without a head, and options the back end does not
    take, are refused."""
    tree = TreeConfig(8, 2, 3)
    head = _head(seed=4)
    fused = EagleEngine(target, head, tree, max_length=96, drafter_backend="triton",
                        drafter_options={"hidden_half_early": True})
    assert fused.drafter._impl._tuning["hidden_half_early"] is True
    ref = EagleEngine(target, head, tree, max_length=96, drafter_backend="torch")
    prompt = _prompt(8, 11)
    a, sa = fused.generate(input_ids=prompt, max_new_tokens=14)
    b, sb = ref.generate(input_ids=prompt, max_new_tokens=14)
    assert a == b and sa.accept_length_histogram == sb.accept_length_histogram
    impl = fused.drafter._impl  # the q/k/v table by default here (no larger than the head), built with the buffers
    assert impl._cfg.uses_token_table() and impl.weights.qkv_table is not None
    # without it (the memory-saving option): the same tokens, no table
    off = EagleEngine(target, head, tree, max_length=96, drafter_backend="triton",
                      drafter_options={"token_qkv_table": False})
    c, _ = off.generate(input_ids=prompt, max_new_tokens=14)
    assert c == b and off.drafter._impl.weights.qkv_table is None
    with pytest.raises(ValueError, match="drafter_options configure the drafter built from a draft head"):
        EagleEngine(target, drafter=TreeDrafter(_head(), tree, backend="stub"), drafter_options={"nprog": 1})
    with pytest.raises(TypeError, match="hidden_half_early"):
        EagleEngine(target, head, tree, drafter_backend="torch", drafter_options={"hidden_half_early": True})


def test_device_rng_stream_is_counter_based():
    rng = DeviceRNG("cpu", seed=7)
    u1 = rng.uniform(3, 5)
    u2 = rng.uniform(4)
    assert u1.shape == (3, 5) and u1.dtype == torch.float32 and bool(((u1 >= 0) & (u1 < 1)).all())
    again = DeviceRNG("cpu", seed=7).uniform(19)
    assert torch.equal(torch.cat([u1.flatten(), u2]), again)  # draws continue one counter stream
    assert not torch.equal(DeviceRNG("cpu", seed=8).uniform(19), again)


def test_graph_bookkeeping_captures_after_two_eager_runs_and_again_after_a_reallocation(monkeypatch, target):
    """``StepRunner._run`` (CUDA-graph bookkeeping, with a stand-in graph on the CPU): two eager runs, a capture on
    the third call, replays after it, and a fresh capture when a buffer it points into was reallocated."""
    import contextlib

    from eagle_triton.engine.step import StepRunner

    log = []

    class FakeGraph:
        def replay(self):
            log.append("replay")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    eng = EagleEngine(target, max_length=64)
    run = StepRunner(target, None, 3)
    run.use_graphs = True

    def work():
        log.append("run")
        return "out"

    for _ in range(4):
        assert run._run(("plain", 0), work) == "out"
    assert log == ["run", "run", "run", "replay", "replay"]  # eager, eager, capture (+ replay), replay
    log.clear()
    for _ in range(3):  # one eager run asked for (the sequence-start chunks): the second call captures
        assert run._run(("start", 0), work, eager_runs=1) == "out"
    assert log == ["run", "run", "replay", "replay"]
    log.clear()
    target.setup(target.capacity + 64, None)  # a new cache: the graph points into freed memory
    assert run._run(("plain", 0), work) == "out"
    assert log == ["run"] and eng is not None  # eager again, then a new capture


def test_draft_rows_needs_a_back_end_that_drafts_rows():
    drafter = TreeDrafter(_head(), TreeConfig(6, 2, 2), backend="torch")
    assert not drafter.drafts_rows
    with pytest.raises(ValueError, match="drafts from host-known lengths only"):
        drafter.draft_rows(torch.zeros(1, 1, 192), torch.zeros(1, 1, dtype=torch.long))


def test_stub_draft_rows_writes_its_own_buffers():
    """The step graphs read a tree from the drafter's buffers, including a tree drafted outside them (a
    generation's eager first draft): the stub, like the fused back end, returns the same tensors on every call
    (per batch size and sampling mode), holding the latest tree."""
    drafter = TreeDrafter(_head(), TreeConfig(6, 2, 2), backend="stub")
    feats = torch.zeros(1, 3, 192)
    first = drafter.draft_rows(feats, torch.tensor([[5, 6, 7]]), torch.tensor([3], dtype=torch.int32))
    kept = first.draft_tokens.clone()
    second = drafter.draft_rows(feats, torch.tensor([[9, 0, 0]]), torch.tensor([1], dtype=torch.int32))
    assert second.draft_tokens is first.draft_tokens and second.retrieve_indices_padded is first.retrieve_indices_padded
    assert second.draft_tokens[0, 0] == 9 and kept[0, 0] == 7  # the buffers hold the latest tree
    other = drafter.draft_rows(feats, torch.tensor([[9, 0, 0]]), torch.tensor([1], dtype=torch.int32), sampling=True)
    assert other.draft_tokens is not first.draft_tokens


def test_a_tree_outside_the_drafters_buffers_is_refused_under_graphs(target):
    """Under CUDA graphs (flag set on the CPU: the check is host pointer compares) a step's tree must live where the
    drafter's previous trees did (the rest graph reads it there): the same buffers pass, a copy elsewhere is an
    error, and after a reallocation of a buffer the graphs point into, the new addresses are taken."""
    from eagle_triton.engine.step import StepRunner

    EagleEngine(target, max_length=64)
    drafter = TreeDrafter(_head(), TreeConfig(6, 2, 2), backend="stub")
    run = StepRunner(target, drafter, 4)
    run.use_graphs = True
    feats = torch.zeros(1, 3, 192)
    tree = drafter.draft_rows(feats, torch.tensor([[5, 6, 7]]), torch.tensor([3], dtype=torch.int32))
    assert run._check_tree(tree) is tree
    assert run._check_tree(drafter.draft_rows(feats, torch.tensor([[1, 2, 3]]))) is not None
    moved = type(tree)(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in vars(tree).items()})
    with pytest.raises(RuntimeError, match="outside the buffers"):
        run._check_tree(moved)
    target.setup(target.capacity + 64, None)  # the graphs' buffers reallocated: new addresses are taken
    assert run._check_tree(moved) is moved


def test_steps_are_planned_with_the_targets_attention_bucket(monkeypatch):
    """A step runs with the engine's bound on the rows it reads: eager steps with the bound itself, steps under
    CUDA graphs with the target's bucket of it (one attention split, or None for any length), which is part of the
    step's graph key; every step of a generation crossing the split gets a bound it respects."""
    import contextlib

    from eagle_triton.engine.step import StepRunner

    small = tiny_llama(vocab=V, hidden=32, layers=2, heads=2, kv_heads=1, seed=5)
    target = LlamaTarget.from_hf(small, ops="triton")
    eng = EagleEngine(target, max_length=96)
    split = target._attention_split
    assert split == 32  # the interpreter's attention tiles
    run = StepRunner(target, None, 3)
    assert run._step_bound(20) == 20 and run._step_bound(None) is None  # eager: the bound itself
    run.use_graphs = True
    assert run._step_bound(20) == split and run._step_bound(split) == split and run._step_bound(split + 1) is None
    assert LlamaTarget.from_hf(small, ops="torch").attention_bucket(3) is None  # no fused forward: no plan

    # a whole generation (graphs stood in by eager runs) crossing the split: the keys name both buckets, and every
    # step's bound covers the rows the step reads
    class FakeGraph:
        def replay(self):
            pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    seen = []
    real = target.decode_rows

    def decode_rows(tokens, kv_limit=None, **kw):
        seen.append((int(target.cache.seqlens[0]) + 1, kv_limit))
        return real(tokens, kv_limit, **kw)

    monkeypatch.setattr(target, "decode_rows", decode_rows)
    plain = eng._runner(False)
    plain.use_graphs = True
    out, _ = eng.generate(input_ids=_prompt(4, 25), max_new_tokens=12, speculative=False, eos_token_id=None)
    assert len(out) == 12
    assert {k[2] for k in plain._graphs} == {split, None}
    assert all(limit is None or rows <= limit for rows, limit in seen), seen
    assert any(limit == split for _, limit in seen) and any(limit is None for _, limit in seen)


class _TorchLaunches:
    """Records the PyTorch ops a step runs that launch a kernel on a GPU, by name (``add.Tensor`` ...): views and
    allocations launch nothing and are left out, and so is the Triton interpreter's own tensor work inside a
    kernel launch (the Triton kernels are what a step is made of; this counts what runs beside them)."""

    FREE = {"view", "_unsafe_view", "slice", "select", "expand", "unsqueeze", "squeeze", "alias", "detach", "t",
            "transpose", "permute", "as_strided", "empty", "empty_strided", "empty_like", "new_empty", "set_",
            "lift_fresh"}

    def __init__(self, monkeypatch):
        from collections import Counter

        import triton.runtime.interpreter as interp
        from torch.utils._python_dispatch import TorchDispatchMode

        self.inside = 0
        self.runs: list[Counter] = []
        recorder = self
        run = interp.InterpretedFunction.run

        def launch(fn, *args, **kwargs):  # a Triton kernel: its interpreter's tensor work is not the step's
            recorder.inside += 1
            try:
                return run(fn, *args, **kwargs)
            finally:
                recorder.inside -= 1

        monkeypatch.setattr(interp.InterpretedFunction, "run", launch)

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not recorder.inside and func.overloadpacket.__name__ not in _TorchLaunches.FREE:
                    recorder.runs[-1][str(func).removeprefix("aten.")] += 1
                return func(*args, **(kwargs or {}))

        self.mode = Mode

    def wrap(self, monkeypatch, cls, name):
        """Record each call of ``cls.name`` (a step body the step graph captures) as one entry of :attr:`runs`."""
        from collections import Counter

        body = getattr(cls, name)

        def recorded(runner, *args, **kwargs):
            self.runs.append(Counter())
            with self.mode():
                return body(runner, *args, **kwargs)

        monkeypatch.setattr(cls, name, recorded)


def test_captured_step_launches_no_mask_conversion_add_or_concatenation(monkeypatch):
    """The verify/accept/commit body a speculative step captures (single and batched, greedy, the fused target
    forward with EAGLE-3 taps of three distinct layers) launches only its Triton kernels plus: the verify
    positions' add and the commit's length advance (batched: also the idle slots' length mask and the first
    tokens' copy). The drafter's float tree mask is read by the attention as it is (no ``> 0.5`` conversion), the
    compaction reads the accept kernel's rows-kept count (no ``accept_len + 1``), and the tapped layers' inputs are
    written into the features buffer by the products that make them (no concatenation). Sampled steps convert no
    mask (``mask > 0.5``) either."""
    from eagle_triton.engine.batch import BatchStepRunner
    from eagle_triton.engine.step import StepRunner

    small = tiny_llama(vocab=V, hidden=32, layers=7, heads=2, kv_heads=1, seed=6)
    target = LlamaTarget.from_hf(small, ops="triton")
    assert target.fused_forward
    head = random_eagle3_head(hidden_size=32, vocab_size=V, draft_vocab_size=48, seed=2)
    eng = EagleEngine(target, head, TreeConfig(6, 2, 2), max_length=64, drafter_backend="stub")
    assert eng.feature_mode == "eagle3" and len(set(target.taps)) == 3
    rec = _TorchLaunches(monkeypatch)
    rec.wrap(monkeypatch, StepRunner, "_verify_accept")
    rec.wrap(monkeypatch, BatchStepRunner, "_verify_accept")
    prompt = _prompt(11, 6)
    out, stats = eng.generate(input_ids=prompt, max_new_tokens=5)
    assert out == hf_greedy(small, prompt, 5) and len(rec.runs) == stats.steps >= 2
    for ops in rec.runs:
        # positions = depths + seqlens; seqlens += rows kept
        assert dict(ops) == {"add.Tensor": 1, "add_.Tensor": 1}, dict(ops)
    rec.runs.clear()
    results = eng.generate_batch(input_ids=[prompt, prompt[:4]], max_new_tokens=[5, 3], batch_size=2)
    assert results[0][0] == out and rec.runs
    for ops in rec.runs:  # + seqlens *= active (idle slots) and out[:, 1] = first tokens
        assert dict(ops) == {"add.Tensor": 1, "add_.Tensor": 1, "mul_.Tensor": 1, "copy_.default": 1}, dict(ops)
    rec.runs.clear()
    eng.generate(input_ids=prompt, max_new_tokens=4, temperature=0.8, seed=1)
    assert rec.runs and all("gt.Scalar" not in ops for ops in rec.runs), rec.runs  # (the sampling rule's own ops
    # vary with the parameters: only the mask conversion is checked)


def test_a_generations_first_draft_is_a_steps_draft(target, monkeypatch):
    """A device-paced generation puts its prompt's rows but the last into the draft KV (``start_rows``, once) and
    every draft, the first included, ingests the static step rows (``[1, C]``: the one shape the step's draft graph
    is captured with), never the whole prompt."""
    drafter = TreeDrafter(_head(), TreeConfig(6, 2, 2), backend="stub")
    eng = EagleEngine(target, drafter=drafter, max_length=64)
    run = eng._runner(True)
    assert run.device_paced
    starts, shapes = [], []
    real_start, real_draft = drafter.start_rows, drafter.draft_rows
    monkeypatch.setattr(drafter, "start_rows", lambda slot, f, ids: starts.append((slot, ids.tolist()))
                        or real_start(slot, f, ids))
    monkeypatch.setattr(drafter, "draft_rows", lambda f, ids, n=None, sampling=False: shapes.append(
        (tuple(ids.shape), n.tolist() if n is not None else None)) or real_draft(f, ids, n, sampling=sampling))
    prompt = _prompt(4, 9)
    out, stats = eng.generate(input_ids=prompt, max_new_tokens=6, eos_token_id=None)
    assert starts == [(0, prompt[1:9])]  # rows 0..7, each paired with the token after it
    assert shapes and all(ids_shape == (1, run.C) for ids_shape, _ in shapes), shapes
    assert shapes[0][1] == [1]  # the first draft ingests the last prompt row (paired with the first token)
    assert out == eng.generate(input_ids=prompt, max_new_tokens=6, eos_token_id=None, speculative=False)[0]


def test_a_fused_drafters_sequence_start_runs_in_static_chunks(tiny_model, target, monkeypatch):
    """With the fused drafter, a generation's prompt rows go into the draft KV as ``START_CHUNK``-row chunks
    (``start_rows_chunk`` on static buffers: the shapes a CUDA graph replays), never one ``start_rows`` of the
    prompt's own length: 10 rows in chunks of 4 are (0, 4), (4, 4), (8, 2); the tokens and the accepted lengths
    step by step equal the reference drafter's host-paced run and plain greedy decoding. A one-token prompt is
    one empty chunk."""
    from eagle_triton.engine.step import DeviceSteps

    monkeypatch.setattr(DeviceSteps, "START_CHUNK", 4)
    tree = TreeConfig(8, 2, 3)
    head = _head(seed=6)
    eng = EagleEngine(target, head, tree, max_length=96, drafter_backend="triton")
    ref = EagleEngine(target, head, tree, max_length=96, drafter_backend="torch")
    drafter = eng.drafter
    chunks, shapes = [], set()
    real_chunk = drafter.start_rows_chunk
    monkeypatch.setattr(drafter, "start_rows", lambda *a: pytest.fail("start_rows of the whole prompt"))

    def chunk(meta, f, ids):
        chunks.append(tuple(meta.tolist()))
        shapes.add((tuple(f.shape), tuple(ids.shape)))
        return real_chunk(meta, f, ids)

    monkeypatch.setattr(drafter, "start_rows_chunk", chunk)
    prompt = _prompt(12, 11)
    a, sa = eng.generate(input_ids=prompt, max_new_tokens=12)
    b, sb = ref.generate(input_ids=prompt, max_new_tokens=12)
    assert chunks == [(0, 0, 4), (0, 4, 4), (0, 8, 2)]
    assert shapes == {((4, head.feature_width), (4,))}
    assert a == b == hf_greedy(tiny_model, prompt, 12)
    assert sa.accept_length_histogram == sb.accept_length_histogram and sa.steps == sb.steps
    chunks.clear()
    one = eng.generate(input_ids=prompt[:1], max_new_tokens=5)[0]
    assert chunks == [(0, 0, 0)] and one == hf_greedy(tiny_model, prompt[:1], 5)
