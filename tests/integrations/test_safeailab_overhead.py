"""What the drafter-only SafeAILab patch costs per ``topK_genrate`` call beyond the fused kernel itself.

On the GPU every tensor op of the patched call is a kernel launch, an allocation or a copy around the drafter's one
launch; here the fused kernel runs under Triton's interpreter and the ops around it are counted with a dispatch mode
(the interpreter's own work is left out of the count). The outputs stay exactly those of SafeAILab's
``topK_genrate`` (the transcription in ``spec_topk_genrate``).
"""

import collections

import pytest
import torch
from spec_topk_genrate import spec_standin
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

import eagle_triton.fused.host as fused_host
import eagle_triton.fused.kernel as fused_kernel
from eagle_triton import TreeConfig, TreeDrafter
from eagle_triton.fused import DrafterConfig
from eagle_triton.integrations.safeailab import EaLayerDrafter, patch_ea_model_with_triton_drafter
from eagle_triton.testing import random_eagle3_head

aten = torch.ops.aten
# ops that create no data: views, and the host's reads of a value (of the copied host buffer, see
# test_safeailab_generate.py::test_patched_topk_genrate_reads_the_device_once_per_call)
_NO_DATA = {aten.view, aten.slice, aten.select, aten.permute, aten.unsqueeze, aten.squeeze, aten.expand, aten.alias,
            aten.as_strided, aten.t, aten.transpose, aten.detach, aten._local_scalar_dense}


class _AtenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket] += 1
        return func(*args, **(kwargs or {}))

    def data_ops(self) -> collections.Counter:
        """Ops that allocate, compute or copy (a kernel, an allocation or a transfer on the GPU)."""
        return collections.Counter({op: n for op, n in self.ops.items() if op not in _NO_DATA})


@pytest.fixture
def launches(monkeypatch):
    """Counts launches of the fused kernel; the interpreter's work inside a launch is not dispatched to the
    counting mode."""
    real = fused_kernel.fused_drafter_kernel
    count = [0]

    class Counted:
        def __getattr__(self, name):
            return getattr(real, name)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                count[0] += 1
                with _disable_current_modes():
                    return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(fused_kernel, "fused_drafter_kernel", Counted())
    return count


class _ReplayedLaunch:
    """A CUDA graph's stand-in on the CPU: ``replay()`` runs the captured launch again (it writes the same buffers,
    as a graph's replay does), outside the op count. The capture ran the launch once already, which stands for the
    graph's first replay (a real capture runs nothing)."""

    def __init__(self, launch):
        self.launch, self.pending, self.replays = launch, True, 0

    def replay(self):
        self.replays += 1
        if self.pending:
            self.pending = False
            return
        with _disable_current_modes():
            self.launch()


@pytest.fixture
def graphs(monkeypatch):
    """Captures of the padded launches, as :class:`_ReplayedLaunch` stand-ins (run outside the op count)."""
    made = []

    def capture(launch):
        with _disable_current_modes():
            out = launch()
        made.append(_ReplayedLaunch(launch))
        return made[-1], out

    monkeypatch.setattr(fused_host, "_capture_graph", capture)
    return made


V = 128


def _head(seed):
    """A small EAGLE-3 head (vocabulary V, 2 query heads of dimension 16, GQA): what is counted here is the work
    around the fused launch, whatever the head's size (its shapes are tests/fused/'s); a launch under the
    interpreter costs about a third of the default random head's. Peaked (``lm_head_scale``): no near-ties
    between the fused drafter and SafeAILab's transcription."""
    return random_eagle3_head(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                              vocab_size=V, draft_vocab_size=48, seed=seed, lm_head_scale=6.0)


def _same_outputs(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.device == y.device and x.dtype == y.dtype and torch.equal(x, y)


def test_patched_call_does_one_copy_around_the_launch(launches, monkeypatch):
    """The default path on the CPU (plain launches, no padded rows): in the steady state a patched call launches
    the kernel once and adds one copy (the device->host transfer of the outputs SafeAILab reads on the CPU, whose
    CPU outputs are views of the host buffer): no clone of the drafter's outputs, no allocation, no packing, no
    host read through torch, no launch parameters recomputed; a sampling tree's reordered rows go back into the
    drafter's buffer, so it is not packed either. (Before: 35 ops, 13 of them data ops: a num_new fill, 7 output
    clones, 2 packing kernels, the copy, 2 host tensors; then 3 data ops: the copy and 2 host tensors.)"""
    head = random_eagle3_head(seed=3, lm_head_scale=6.0)  # peaked: no near-ties between the two drafters
    tc = TreeConfig(20, 3, 4)
    orig, patched = spec_standin(head, tc), spec_standin(head, tc)
    patch_ea_model_with_triton_drafter(patched, backend="triton")
    drafter = patched.ea_layer.topK_genrate
    assert isinstance(drafter, EaLayerDrafter) and drafter.drafter._impl.fallback_reason == ""
    params = collections.Counter()
    launch_params = DrafterConfig.launch_params
    monkeypatch.setattr(DrafterConfig, "launch_params",
                        lambda self, *a: params.update(["calls"]) or launch_params(self, *a))
    g = torch.Generator().manual_seed(0)
    W = head.feature_width
    ids = torch.randint(0, 256, (1, 8), generator=g)
    feats = torch.randn(1, 7, W, generator=g)
    for model in (orig, patched):
        model.ea_layer.reset_kv()
    for step in range(4):
        sampling = object() if step == 1 else None  # a sampling tree (rows reordered)
        want = orig.ea_layer.topK_genrate(feats, ids, None, sampling)
        before, params["calls"] = launches[0], 0
        with _AtenOps() as rec:
            got = patched.ea_layer.topK_genrate(feats, ids, None, sampling)
        _same_outputs(want, got)
        assert got[1].device.type == "cpu" and got[2].device.type == "cpu"
        for (k, v), (k2, v2) in zip(orig.ea_layer.stable_kv, patched.ea_layer.stable_kv, strict=True):
            torch.testing.assert_close(k2, k, rtol=0, atol=1e-5)
            torch.testing.assert_close(v2, v, rtol=0, atol=1e-5)
        assert launches[0] == before + 1
        print("OPS", step, dict(rec.ops))
        if step >= 2:  # steady state, greedy: buffers, launch plan and copy plan exist
            data = rec.data_ops()
            assert data == {aten.copy_: 1}, data  # one span copied: nothing packed, cloned or read by torch
            assert sum(rec.ops.values()) <= 7, rec.ops  # views included (35 before, 22 with the host tensors)
            assert params["calls"] == 0
        row = want[1][0]
        acc = want[0][0, row[row >= 0][1:3]]
        ids = torch.cat([ids, acc[None], torch.randint(0, 256, (1, 1), generator=g)], 1)
        feats = torch.randn(1, acc.numel() + 1, W, generator=g)


def test_replayed_call_does_three_copies_around_the_replay(launches, graphs):
    """The CUDA steady state, on the CPU: the padded rows (as on CUDA) and a graph per row count (a stand-in that
    re-runs the launch). Once a row count's graph exists, a patched call does 3 copies (the new rows' features and
    ids into the static rows, the outputs to the host) and 3 views (the new ids, the two draft-KV views mirrored
    into ``stable_kv``; two more the first time a retrieve shape is seen) around the replay, greedy or sampling:
    no fill, no allocation, no packing, no host read through torch. (Before: 22 ops on this path: 6 data ops (3
    copies, a count fill, the exact retrieve indices cloned, the mask converted), 2 host reads and 14 views.)
    Outputs and draft KV equal SafeAILab's (the transcription)."""
    head = _head(3)  # peaked: no near-ties between the two drafters
    tc = TreeConfig(20, 3, 4)
    orig, patched = spec_standin(head, tc), spec_standin(head, tc)
    patch_ea_model_with_triton_drafter(patched, backend="triton")
    impl = patched.ea_layer.topK_genrate.drafter._impl
    assert impl.fallback_reason == ""
    impl.replay_padded = True
    g = torch.Generator().manual_seed(0)
    W = head.feature_width
    ids = torch.randint(0, V, (1, 8), generator=g)
    feats = torch.randn(1, 7, W, generator=g)  # the prompt: the plain launch
    for model in (orig, patched):
        model.ea_layer.reset_kv()
    # (rows, sampling, what the call does): eager launches first, then a capture per row count, then replays
    plan = [(3, False, "eager"), (3, False, "eager"), (3, False, "capture"), (3, False, "replay"),
            (2, False, "capture"), (3, True, "eager"), (3, True, "eager"), (3, True, "capture"), (3, True, "replay"),
            (2, False, "replay"), (3, False, "replay")]
    for step, (rows, sampling, does) in enumerate([(7, False, "prompt"), *plan]):
        if step:
            ids = torch.cat([ids, torch.randint(0, V, (1, rows), generator=g)], 1)
            feats = torch.randn(1, rows, W, generator=g)
        if step == 2:  # the padded rows exist since step 1: from here on they are captured, as on CUDA
            impl._replay.cuda = True
        lp = object() if sampling else None
        want = orig.ea_layer.topK_genrate(feats, ids, None, lp)
        before, captured = launches[0], len(graphs)
        replays = sum(gr.replays for gr in graphs)
        outputs = patched.ea_layer.topK_genrate._outputs
        pairs = len(outputs._plan.exact) if outputs._plan is not None else 0
        with _AtenOps() as rec:
            got = patched.ea_layer.topK_genrate(feats, ids, None, lp)
        _same_outputs(want, got)
        for (k, v), (k2, v2) in zip(orig.ea_layer.stable_kv, patched.ea_layer.stable_kv, strict=True):
            torch.testing.assert_close(k2, k, rtol=0, atol=1e-5)
            torch.testing.assert_close(v2, v, rtol=0, atol=1e-5)
        assert launches[0] == before + 1, step
        assert len(graphs) - captured == (does == "capture"), step
        assert sum(gr.replays for gr in graphs) - replays == (does in ("capture", "replay")), step
        if does == "replay":
            data = rec.data_ops()
            assert data == {aten.copy_: 3}, (step, rec.ops)
            # a retrieve shape (R, C) not seen before costs its view once (two slices), then it is cached
            new_pairs = len(outputs._plan.exact) - pairs
            assert new_pairs in (0, 1), step
            assert rec.ops == {aten.copy_: 3, aten.as_strided: 2, aten.slice: 1 + 2 * new_pairs}, (step, rec.ops)


def test_fused_draft_copies_its_outputs_unless_asked_not_to():
    """``FusedDraftBackend.draft`` returns trees that stay valid across calls; ``copy_outputs=False`` returns the
    drafter's buffers themselves (what the SafeAILab patch uses), with the same values."""
    head = _head(4)
    tc = TreeConfig(12, 2, 3)
    fused, ref = TreeDrafter(head, tc, backend="triton"), TreeDrafter(head, tc, backend="torch")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (1, 6), generator=g)
    feats = torch.randn(1, 5, head.feature_width, generator=g)
    kept = fused.draft(feats, ids)
    first = [getattr(kept, name).clone() for name in _TREE_FIELDS]
    ref.draft(feats, ids)
    ids = torch.cat([ids, torch.tensor([[7, 100]])], 1)  # a new root token: the second tree differs
    feats = torch.randn(1, 2, head.feature_width, generator=g)
    views = fused._impl.draft(feats, ids, copy_outputs=False)
    want = ref.draft(feats, ids)
    bufs = fused._impl.bufs
    for name, buf in zip(_TREE_FIELDS, (bufs.draft_tokens, bufs.retrieve, bufs.tree_mask, bufs.positions,
                                        bufs.parents, bufs.num_leaves, bufs.max_depth), strict=True):
        assert getattr(views, name) is buf and torch.equal(buf, getattr(want, name)), name
    # the first tree is a copy: the second draft, which rewrote the buffers, left it as it was
    assert not torch.equal(first[0], views.draft_tokens)
    for name, was in zip(_TREE_FIELDS, first, strict=True):
        assert torch.equal(getattr(kept, name), was), name


_TREE_FIELDS = ("draft_tokens", "retrieve_indices_padded", "tree_mask", "positions", "parents", "num_leaves",
                "max_depth")


@pytest.mark.parametrize("sampling", [False, True])
def test_padded_rows_draft_the_same_trees(sampling):
    """``draft_replayed`` (what the patch calls; on CUDA its launch is replayed from a graph): a prompt takes the
    plain launch, then steps of 1 to depth + 2 rows go through padded static buffers with the count on the device;
    every tree equals the plain launch's, and the draft KV's host length follows."""
    head = _head(5)
    tc = TreeConfig(12, 2, 3)
    fused, plain = TreeDrafter(head, tc, backend="triton"), TreeDrafter(head, tc, backend="triton")
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, V, (1, 7), generator=g)
    feats = torch.randn(1, 6, head.feature_width, generator=g)
    # the prompt, then steps; depth + 2 = 4 rows at most; repeated counts take the steady-state path
    for step, rows in enumerate((6, 1, 4, 2, 4)):
        if step:
            ids = torch.cat([ids, torch.randint(0, V, (1, rows), generator=g)], 1)
            feats = torch.randn(1, rows, head.feature_width, generator=g)
        got = fused._impl.draft_replayed(feats, ids, sampling=sampling, max_len=64, padded=True)
        want = plain._impl.draft(feats, ids, sampling=sampling)
        for name in _TREE_FIELDS:
            assert torch.equal(getattr(got, name), getattr(want, name)), (step, name)
        assert fused.kv_len == plain.kv_len == ids.shape[1] - 1
    st = fused._impl._replay
    assert st.feats.shape[1] == tc.depth + 2  # the steps went through the padded buffers, one entry per count
    assert sorted(e.rows for e in st.entries.values()) == [1, 2, 4] and all(e.num.item() == e.rows
                                                                              for e in st.entries.values())
    # a known row count whose ids disagree with the draft KV, or features of another dtype, are refused as before
    feats = torch.randn(1, 4, head.feature_width, generator=g)
    ids = torch.cat([ids, torch.randint(0, V, (1, 4), generator=g)], 1)
    with pytest.raises(ValueError, match="expected 3 new rows"):
        fused._impl.draft_replayed(feats, ids[:, :-1], sampling=sampling, max_len=64, padded=True)
    with pytest.raises(TypeError, match="dtype"):
        fused._impl.draft_replayed(feats.double(), ids, sampling=sampling, max_len=64, padded=True)
    assert fused.kv_len == ids.shape[1] - 5


@pytest.mark.gpu
@pytest.mark.parametrize("sampling", [False, True])
def test_gpu_replayed_drafts_equal_plain_launches(sampling):
    """On CUDA, ``draft_replayed`` captures one graph per row count after two eager launches and replays it; every
    tree equals a plain launch's, and the patch's outputs (one blocking copy into pinned memory, views of it) equal
    the tree's exact retrieve indices and mask. In fp32: the padded launch ingests ``depth + 2`` row slots where the
    plain one ingests the new rows only, and the fused kernel's reductions over its row tile are not row-count
    invariant, so in bf16 a near tie between two candidates may break the other way (both trees are valid drafts;
    on the H100 one did at the third call)."""
    from eagle_triton.integrations.safeailab import SafeAILabOutputs

    head = random_eagle3_head(seed=5, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                              num_key_value_heads=2, vocab_size=1024, draft_vocab_size=512,
                              lm_head_scale=6.0).cuda().float()
    tc = TreeConfig(20, 3, 5)
    fused, plain = TreeDrafter(head, tc, backend="triton"), TreeDrafter(head, tc, backend="triton")
    outputs = SafeAILabOutputs()
    g = torch.Generator(device="cuda").manual_seed(2)
    W = head.feature_width
    ids = torch.randint(0, 1024, (1, 9), generator=g, device="cuda")
    feats = torch.randn(1, 8, W, generator=g, device="cuda", dtype=torch.float32)
    for step, rows in enumerate((8, 3, 3, 3, 3, 1, 5, 1, 3, 5, 2, 3)):  # depth + 2 = 5 rows at most
        if step:
            ids = torch.cat([ids, torch.randint(0, 1024, (1, rows), generator=g, device="cuda")], 1)
            feats = torch.randn(1, rows, W, generator=g, device="cuda", dtype=torch.float32)
        got = fused._impl.draft_replayed(feats, ids, sampling=sampling)
        want = plain._impl.draft(feats, ids, sampling=sampling)
        for name in _TREE_FIELDS:
            assert torch.equal(getattr(got, name), getattr(want, name)), (step, name)
        tokens, retrieve, mask, positions = outputs(got)
        assert retrieve.device.type == "cpu" and torch.equal(retrieve, want.retrieve_indices.cpu()), step
        assert mask.device.type == "cpu" and torch.equal(mask, want.tree_mask[:1].cpu()), step
        assert tokens is got.draft_tokens and torch.equal(positions, want.positions[0]), step
        assert fused.kv_len == plain.kv_len == ids.shape[1] - 1
    entries = fused._impl._replay.entries.values()
    assert sorted(e.rows for e in entries) == [1, 2, 3, 5] and all(e.graph is not None for e in entries)
