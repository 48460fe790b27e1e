"""``EagleEngine.generate_batch``: continuous batching over a fixed number of slots. Each sequence's result must
be what ``generate`` gives it alone: the same greedy tokens, and with the same seed the same sampled tokens
(per-sequence Philox streams); sampled tokens follow the target distribution per sequence; bad input is refused
naming the problem."""

from __future__ import annotations

import random

import pytest
import torch
from engine_testlib import OracleDrafter, hf_greedy, tiny_llama
from scipy.stats import chi2

from eagle_triton import TreeConfig, TreeDrafter
from eagle_triton.engine import EagleEngine, LlamaTarget
from eagle_triton.engine.batch import BATCH_BUCKETS, SPECULATIVE_BUCKETS, batch_bucket
from eagle_triton.engine.sampling import SamplingParams, probs_from_logits
from eagle_triton.testing import random_eagle3_head

V = 128


@pytest.fixture(scope="module")
def target(tiny_model):
    return LlamaTarget.from_hf(tiny_model)


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g).tolist() for n in lengths]


class BatchOracleDrafter:
    """:class:`OracleDrafter` for every slot of a batch, device-paced (``draft_rows``): each slot rebuilds its
    sequence from the rows it is handed (forgotten with :meth:`forget_rows` when the slot is freed), finds which
    reference continuation it is, and proposes a tree whose chain is right for a random number of tokens. So
    steps accept anything from 0 to depth + 1 drafts, differently in every slot. Idle slots get junk trees."""

    feature_mode = None
    drafts_rows = True
    backend = "oracle"

    def __init__(self, sequences: list[list[int]], tree_config: TreeConfig, seed: int = 0):
        self.sequences = sequences
        self.tree_config = tree_config
        self.oracles = [OracleDrafter(s, tree_config, V, seed=seed + i) for i, s in enumerate(sequences)]
        self.rng = random.Random(seed)
        self.hist: list[list[int]] = []

    def reset(self) -> None:
        self.hist = []

    def reserve(self, max_len: int, max_new_rows: int, batch: int = 1) -> None:
        self.hist = [[] for _ in range(batch)]

    def forget_rows(self, keep: torch.Tensor) -> None:
        for b, k in enumerate(keep.tolist()):
            if not k:
                self.hist[b] = []

    def keep_rows(self, rows: list[int], batch: int) -> None:
        self.hist = [self.hist[r] for r in rows] + [[] for _ in range(batch - len(rows))]

    def start_rows(self, slot: int, features, new_ids: torch.Tensor) -> None:
        self.hist[slot] = new_ids.tolist()

    def draft_rows(self, features, new_ids, num_new=None, sampling: bool = False):
        trees = []
        for b in range(new_ids.shape[0]):
            n = new_ids.shape[1] if num_new is None else int(num_new[b])
            self.hist[b] += new_ids[b, :n].tolist()
            h = self.hist[b]  # the sequence without its first prompt token
            match = [i for i, s in enumerate(self.sequences) if s[1:len(h) + 1] == h]
            if match:
                seq = self.sequences[match[0]][:len(h) + 1]
                trees.append(self.oracles[match[0]].draft(None, torch.tensor([seq])))
            else:  # an idle slot: any tree of the right shape
                junk = [self.rng.randrange(V)]
                o = OracleDrafter(junk + [0] * 64, self.tree_config, V, seed=b)
                trees.append(o.draft(None, torch.tensor([junk])))
        first = trees[0]
        return type(first)(**{f: torch.cat([getattr(t, f) for t in trees])
                              for f in ("draft_tokens", "tree_mask", "positions", "parents",
                                        "retrieve_indices_padded", "num_leaves", "max_depth")}, sampling=sampling)


# -- greedy: equal to generate, for a mix of lengths, caps, an EOS and slot refills ------------------------------
@pytest.mark.parametrize("speculative", [True, False])
def test_batched_greedy_equals_generate_with_refills(tiny_model, target, speculative):
    prompts = _prompts((4, 11, 1, 7, 15, 3, 9))
    caps = [20, 3, 25, 1, 12, 30, 8]
    refs = [hf_greedy(tiny_model, p, 40) for p in prompts]
    # sequence 5 stops at an EOS inside its continuation: its first new occurrence after 6 tokens
    j = next(i for i in range(6, 30) if refs[5][i] not in refs[5][:i])
    eos = refs[5][j]
    tree = TreeConfig(12, 4, 3)
    drafter = BatchOracleDrafter([p + r for p, r in zip(prompts, refs, strict=True)], tree)
    eng = EagleEngine(target, drafter=drafter, max_length=64)
    finished = []
    out = eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=3, speculative=speculative,
                             eos_token_id=eos, on_result=lambda i, toks, st: finished.append((i, toks)))
    for i, (toks, stats) in enumerate(out):
        want = refs[i][:caps[i]]
        if eos in want:
            want = want[:want.index(eos) + 1]
        alone, st = eng.generate(input_ids=prompts[i], max_new_tokens=caps[i], speculative=speculative,
                                 eos_token_id=eos)
        assert toks == want == alone, i
        assert stats.stop_reason == st.stop_reason and stats.new_tokens == len(toks)
        assert stats.prompt_tokens == len(prompts[i]) and stats.speculative == speculative
    assert out[5][1].stop_reason == "eos" and len(out[5][0]) == j + 1
    # on_result: every sequence once, in completion order, with what generate_batch returns
    assert sorted(i for i, _ in finished) == list(range(len(prompts)))
    assert all(toks == out[i][0] for i, toks in finished)
    assert [i for i, _ in finished] != list(range(len(prompts)))  # short ones overtook long ones
    if speculative:  # the oracle's chains were accepted: long accepted chunks in the batch
        assert max(s.mean_accepted_length for _, s in out) > 2.0


def test_plain_batches_beyond_the_speculative_buckets(tiny_model):
    """Plain decoding runs 17-64 sequences at once (buckets 32 and 64), each as generate gives it alone, and the
    tail moves down through the buckets below."""
    target = LlamaTarget.from_hf(tiny_model)  # its own: 64 slots of storage would change the shared target's tests
    n = 40
    lengths = torch.randint(1, 12, (n,)).tolist()
    prompts = _prompts(lengths, seed=int(torch.randint(1 << 30, ())))
    caps = torch.randint(1, 9, (n,)).tolist()
    eng = EagleEngine(target, drafter=TreeDrafter(_head(), TreeConfig(6, 2, 2), backend="stub"), max_length=32)
    buckets = []
    out = eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=n, speculative=False,
                             on_result=lambda i, toks, st: buckets.append(target.batch_size))
    assert [t for t, _ in out] == [hf_greedy(tiny_model, p, c) for p, c in zip(prompts, caps, strict=True)]
    assert buckets[0] == 64 and buckets[-1] < 64
    out = eng.generate_batch(input_ids=prompts[:20], max_new_tokens=2, batch_size=20, speculative=False)
    assert [t for t, _ in out] == [hf_greedy(tiny_model, p, 2) for p in prompts[:20]]


def test_max_length_and_zero_caps_in_a_batch(tiny_model, target):
    prompts = _prompts((20, 5, 2), seed=3)
    refs = [hf_greedy(tiny_model, p, 10) for p in prompts]
    eng = EagleEngine(target, drafter=BatchOracleDrafter([p + r for p, r in zip(prompts, refs, strict=True)],
                                                         TreeConfig(6, 2, 2)), max_length=24)
    out = eng.generate_batch(input_ids=prompts, max_new_tokens=[10, 0, 6], batch_size=2)
    assert out[0][0] == refs[0][:4] and out[0][1].stop_reason == "max_length"
    assert out[1][0] == [] and out[1][1].stop_reason == "max_new_tokens"
    assert out[2][0] == refs[2][:6] and out[2][1].stop_reason == "max_new_tokens"


def test_idle_slots_hold_no_rows_and_the_tail_moves_to_smaller_buckets(tiny_model, target):
    """4 slots, nobody waiting: while 3 sequences run, the freed slot idles and its rows are dropped every step (its
    length never grows); once 2 or 1 run, they move to the 2- and 1-slot buckets (KV, draft state, streams)."""
    prompts = _prompts((4, 6, 5, 8), seed=7)
    refs = [hf_greedy(tiny_model, p, 40) for p in prompts]
    drafter = BatchOracleDrafter([p + r for p, r in zip(prompts, refs, strict=True)], TreeConfig(6, 2, 2))
    eng = EagleEngine(target, drafter=drafter, max_length=64)
    seen = []

    def check(i, toks, stats):
        seen.append((i, target.batch_size, target.cache.seqlens.tolist(), [len(h) for h in drafter.hist]))

    caps = [2, 24, 32, 40]
    out = eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=4, on_result=check)
    assert [t for t, _ in out] == [r[:c] for r, c in zip(refs, caps, strict=True)]
    assert [x[0] for x in seen] == [0, 1, 2, 3]
    _, slots, lens, draft_lens = seen[1]  # slot 0 idled since sequence 0 stopped (3 ran: still 4 slots)
    assert slots == 4 and lens[0] == 0 and draft_lens[0] == 0 and lens[1] == 0  # (slot 1 just freed)
    assert min(lens[2:]) > 24
    assert seen[2][1] == 2 and seen[3][1] == 1 and target.batch_size == 1  # the tail moved down the buckets


def test_generate_with_a_list_delegates_and_single_runs_still_work(tiny_model, target):
    prompts = _prompts((5, 8), seed=4)
    eng = EagleEngine(target, drafter=TreeDrafter(_head(), TreeConfig(6, 2, 2), backend="stub"), max_length=48)
    out = eng.generate(input_ids=prompts, max_new_tokens=7)
    assert [t for t, _ in out] == [hf_greedy(tiny_model, p, 7) for p in prompts]
    out2 = eng.generate(input_ids=torch.tensor([prompts[1], prompts[1]]), max_new_tokens=3, speculative=False)
    assert [t for t, _ in out2] == [hf_greedy(tiny_model, prompts[1], 3)] * 2
    # the batch-1 path after a batch (the target is set up again with one slot)
    assert eng.generate(input_ids=prompts[0], max_new_tokens=7)[0] == out[0][0]
    assert target.batch_size == 1


def _head(seed=1, hidden=64):
    return random_eagle3_head(hidden_size=hidden, vocab_size=V, draft_vocab_size=48, seed=seed)


# -- the fused path (Triton interpreter): fused target forward and fused drafter --------------------------------
def test_fused_target_and_drafter_batch_equals_generate():
    """Kernels under the interpreter: the fused batch-invariant target forward and the fused drafter drafting every
    slot in one launch. Greedy and seeded sampling (mixed with greedy rows) give exactly generate's tokens, with
    speculation (plain batched decoding on the fused forward: the target-level batch tests and the GPU test)."""
    m = tiny_llama(vocab=V, hidden=32, layers=3, heads=2, kv_heads=1, seed=3)
    target = LlamaTarget.from_hf(m, ops="triton")
    head = random_eagle3_head(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                              vocab_size=V, draft_vocab_size=48, seed=1)
    eng = EagleEngine(target, head, TreeConfig(6, 2, 2), max_length=40, drafter_backend="triton")
    prompts = _prompts((3, 9, 5), seed=5)
    caps = [5, 2, 6]
    temps = [0.0, 0.9, 0.7]
    for spec in (True,):
        out = eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=2, speculative=spec,
                                 temperature=temps, top_p=[1.0, 0.9, 1.0], top_k=[0, 0, 20], seeds=[7, 8, 9])
        for i, (toks, st) in enumerate(out):
            alone, st1 = eng.generate(input_ids=prompts[i], max_new_tokens=caps[i], speculative=spec,
                                      temperature=temps[i], top_p=[1.0, 0.9, 1.0][i], top_k=[0, 0, 20][i],
                                      seed=[7, 8, 9][i])
            assert toks == alone, (spec, i)
            # the drafter drafts each slot's tree as alone (refills, idle slots and the move to a smaller bucket
            # keep its draft KV right): the same accepted lengths step by step
            assert st.accept_length_histogram == st1.accept_length_histogram, (spec, i)
        assert out[0][0] == hf_greedy(m, prompts[0], caps[0])


def test_batch_trees_per_bucket(tiny_model, target):
    """batch_trees: the tree of a bucket drafts when the slots run in it (its own drafter), other buckets draft the
    engine's tree; every sequence still equals generate. Bad batch_trees are refused."""
    head = random_eagle3_head(hidden_size=64, vocab_size=V, draft_vocab_size=48, seed=1)
    small = TreeConfig(4, 1, 2)
    eng = EagleEngine(target, head, TreeConfig(8, 2, 3), max_length=48, drafter_backend="stub",
                      batch_trees={4: small})
    prompts = _prompts((6, 2, 9), seed=8)
    refs = [hf_greedy(tiny_model, p, 10) for p in prompts]
    out4 = eng.generate_batch(input_ids=prompts, max_new_tokens=10, batch_size=3)  # bucket 4
    out2 = eng.generate_batch(input_ids=prompts, max_new_tokens=10, batch_size=2)  # bucket 2
    assert [t for t, _ in out4] == [t for t, _ in out2] == refs
    assert {s.tree for _, s in out4} == {str(small)} and {s.tree for _, s in out2} == {str(TreeConfig(8, 2, 3))}
    assert eng._drafter_for(small) is not eng.drafter and eng._drafter_for(small).tree_config == small
    with pytest.raises(ValueError, match="key 3 is not a batch bucket"):
        EagleEngine(target, head, max_length=48, batch_trees={3: small})
    with pytest.raises(ValueError, match=r"key 32 is not a batch bucket of speculation \(1, 2, 4, 8, 16\)"):
        EagleEngine(target, head, max_length=48, batch_trees={32: small})
    with pytest.raises(TypeError, match=r"batch_trees\[4\] must be a TreeConfig"):
        EagleEngine(target, head, max_length=48, batch_trees={4: (4, 1, 2)})
    with pytest.raises(ValueError, match="needs a draft head"):
        EagleEngine(target, max_length=48, batch_trees={4: small})


# -- sampling -----------------------------------------------------------------------------------------------------
def test_per_row_processing_equals_process_logits_row_by_row():
    """process_logits_rows / probs_from_logits_rows against process_logits / probs_from_logits on each row alone
    (fresh random logits, [B, N, V] with awkward sizes, every mix of filters): the same values, exactly."""
    from eagle_triton.engine.sampling import RowSampling, probs_from_logits_rows, process_logits, process_logits_rows

    g = torch.Generator().manual_seed(0)
    params = [SamplingParams(0.0), SamplingParams(0.7, 0.95, 0), SamplingParams(1.0, 1.0, 5),
              SamplingParams(1.3, 0.5, 3), SamplingParams(0.9, 1.0, 0), SamplingParams(0.6, 0.9, 200)]
    B, N, Vr = len(params), 3, 37
    logits = 3 * torch.randn(B, N, Vr, generator=g)
    rows = RowSampling(B, "cpu")
    for b, p in enumerate(params):
        rows.set(b, p)
    got = process_logits_rows(logits, rows)
    probs = probs_from_logits_rows(logits, rows)
    for b, p in enumerate(params):
        assert torch.equal(got[b], process_logits(logits[b], p)), b
        want = (torch.nn.functional.one_hot(logits[b].argmax(-1), Vr).float() if p.greedy
                else probs_from_logits(logits[b], p))
        assert torch.equal(probs[b], want), b
    # the sorts skipped when no row asks for their filter: the same values
    plain = [SamplingParams(0.8), SamplingParams(0.0), SamplingParams(1.1)]
    rows3 = RowSampling(3, "cpu")
    for b, p in enumerate(plain):
        rows3.set(b, p)
    assert torch.equal(process_logits_rows(logits[:3], rows3, False, False), process_logits_rows(logits[:3], rows3))


def test_seeded_sampling_equals_generate(target):
    """Per-sequence parameters and seeds (an int seed: sequence i gets seed + i), greedy and sampled sequences in
    one batch: each sequence's tokens equal generate's with its seed (the torch forward gives the same bits here)."""
    eng = EagleEngine(target, drafter=TreeDrafter(_head(), TreeConfig(8, 3, 2), backend="stub"), max_length=64)
    prompts = _prompts((3, 9, 5, 12, 7), seed=6)
    caps = [10, 3, 17, 8, 12]
    temps = [0.0, 0.8, 1.0, 0.5, 0.8]
    for spec in (True, False):
        out = eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=4, speculative=spec,
                                 seeds=100, temperature=temps, top_p=0.9, top_k=[0, 30, 0, 5, 0])
        for i, (toks, _) in enumerate(out):
            alone, _ = eng.generate(input_ids=prompts[i], max_new_tokens=caps[i], speculative=spec, seed=100 + i,
                                    temperature=temps[i], top_p=0.9, top_k=[0, 30, 0, 5, 0][i])
            assert toks == alone, (spec, i)


def _chi_square_ok(counts: torch.Tensor, probs: torch.Tensor, n: int) -> bool:
    counts, probs = counts.flatten().double(), probs.flatten().double()
    assert counts[probs == 0].sum() == 0
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat <= float(chi2.ppf(1 - 1e-3, int(big.sum())))


def test_sampled_tokens_follow_the_target_distribution_per_sequence():
    """Tiny vocabulary (8), one batch of 1200 sequences over 16 slots (75 refills a slot): two prompts, each with
    its own temperature / top-p / top-k, alternating. Per prompt, the first two new tokens (the second from tree
    verification) over its 600 seeds follow p(t1) p(t2 | t1) of its processed target distribution."""
    Vs = 8
    m = tiny_llama(vocab=Vs, hidden=32, layers=4, heads=2, kv_heads=1, seed=4, std=0.3)
    head = random_eagle3_head(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                              vocab_size=Vs, draft_vocab_size=None, seed=5, std=0.5)
    eng = EagleEngine(LlamaTarget.from_hf(m), drafter=TreeDrafter(head, TreeConfig(6, 2, 2), backend="stub"),
                      max_length=32)
    groups = [([1, 5, 2], SamplingParams(0.8, 0.95, 6)), ([3, 3, 0, 7], SamplingParams(1.2, 0.9, 0))]
    n = 600
    prompts = [groups[i % 2][0] for i in range(2 * n)]
    ps = [groups[i % 2][1] for i in range(2 * n)]
    out = eng.generate_batch(input_ids=prompts, max_new_tokens=2, temperature=[p.temperature for p in ps],
                             top_p=[p.top_p for p in ps], top_k=[p.top_k for p in ps], seeds=0, batch_size=16)
    for g, (prompt, params) in enumerate(groups):
        counts = torch.zeros(Vs, Vs)
        for toks, _ in out[g::2]:
            counts[toks[0], toks[1]] += 1
        with torch.no_grad():
            p1 = probs_from_logits(m(torch.tensor([prompt])).logits[0, -1], params)
            p2 = probs_from_logits(m(torch.tensor([prompt + [t] for t in range(Vs)])).logits[:, -1], params)
        assert _chi_square_ok(counts, p1[:, None] * p2, n), g


# -- bad input ----------------------------------------------------------------------------------------------------
def test_bad_input_is_refused_naming_it(target):
    eng = EagleEngine(target, drafter=TreeDrafter(_head(), TreeConfig(6, 2, 2), backend="stub"), max_length=16)
    ok = _prompts((3, 4))
    with pytest.raises(ValueError, match="empty list"):
        eng.generate_batch(input_ids=[])
    with pytest.raises(ValueError, match="exactly one of prompts"):
        eng.generate_batch()
    with pytest.raises(ValueError, match=r"input_ids\[1\]: the prompt has 16 tokens but max_length is 16"):
        eng.generate_batch(input_ids=[ok[0], _prompts((16,))[0]])
    with pytest.raises(ValueError, match=r"input_ids\[0\]: the prompt is empty"):
        eng.generate_batch(input_ids=[[], ok[1]])
    with pytest.raises(ValueError, match=r"prompts\[0\]: a string prompt needs a tokenizer"):
        eng.generate_batch(["hello"])
    with pytest.raises(TypeError, match="must be a list"):
        eng.generate_batch("hello")
    with pytest.raises(ValueError, match="batch_size 65 is beyond the largest batch bucket 64"):
        eng.generate_batch(input_ids=ok, batch_size=65)
    with pytest.raises(ValueError, match="batch_size 17: a speculative batch holds at most 16 sequences"):
        eng.generate_batch(input_ids=ok, batch_size=17)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        eng.generate_batch(input_ids=ok, batch_size=0)
    for name in ("max_new_tokens", "temperature", "top_p", "top_k", "seeds"):
        with pytest.raises(ValueError, match=f"{name} has 3 values for 2 prompts"):
            eng.generate_batch(input_ids=ok, **{name: [1, 1, 1]})
    with pytest.raises(ValueError, match=r"max_new_tokens\[1\] must be an int >= 0"):
        eng.generate_batch(input_ids=ok, max_new_tokens=[3, -1])
    with pytest.raises(ValueError, match="sequence 0: top_p must be in"):
        eng.generate_batch(input_ids=ok, top_p=[0.0, 1.0])
    with pytest.raises(ValueError, match="on_tokens streams one sequence"):
        eng.generate(input_ids=ok, on_tokens=print)
    assert batch_bucket(3) == 4 and batch_bucket(16) == 16 and batch_bucket(17) == 32 and batch_bucket(64) == 64
    assert BATCH_BUCKETS == (1, 2, 4, 8, 16, 32, 64) and SPECULATIVE_BUCKETS == (1, 2, 4, 8, 16)
    # engines that cannot step a batch say why
    ref = EagleEngine(target, _head(), TreeConfig(6, 2, 2), max_length=16, drafter_backend="torch")
    with pytest.raises(ValueError, match="drafter_backend='triton'"):
        ref.generate_batch(input_ids=ok)
    assert [t for t, _ in ref.generate_batch(input_ids=ok, max_new_tokens=2, speculative=False)] == \
        [ref.generate(input_ids=p, max_new_tokens=2, speculative=False)[0] for p in ok]


# -- device pacing --------------------------------------------------------------------------------------------------
def test_one_device_read_per_batch_step(monkeypatch):
    """Through the Triton ops (interpreter) with the stub drafter, a greedy batch reads the device once per step
    (the step's tokens, the first tokens included): nothing else is read back, refills included."""
    from test_engine_steps import _ReadCounter

    from eagle_triton.engine.batch import PendingBatch

    small = tiny_llama(vocab=V, hidden=32, layers=2, heads=2, kv_heads=1, seed=3)
    target = LlamaTarget.from_hf(small, ops="triton")
    eng = EagleEngine(target, drafter=TreeDrafter(_head(), TreeConfig(6, 2, 2), backend="stub"), max_length=48)
    prompts = _prompts((5, 3, 7), seed=9)
    for speculative in (True, False):
        eng.generate_batch(input_ids=prompts[:1], max_new_tokens=2, speculative=speculative)  # first-use work
        steps = {"read": 0}
        rows = PendingBatch.rows

        def counted(self, _rows=rows, _steps=steps):
            _steps["read"] += 1
            return _rows(self)

        monkeypatch.setattr(PendingBatch, "rows", counted)
        counter = _ReadCounter(monkeypatch)
        out = eng.generate_batch(input_ids=prompts, max_new_tokens=[6, 6, 2], batch_size=2, seeds=0,
                                 speculative=speculative)
        reads = counter.count
        monkeypatch.undo()
        assert [t for t, _ in out] == [hf_greedy(small, p, n) for p, n in zip(prompts, (6, 6, 2), strict=True)]
        assert reads == steps["read"] and reads >= max(s.steps for _, s in out), (reads, steps)


# -- GPU: CUDA graphs per bucket, bf16 --------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("batch_size", [1, 3, 16])
@pytest.mark.parametrize("backend", ["stub", "triton"])
def test_gpu_batch_equals_generate_bf16(batch_size, backend):
    """On CUDA (fused forward, steps replayed from graphs per bucket; the fused drafter or the stub): every
    sequence's greedy tokens equal generate's alone, for more prompts than slots; seeded sampled tokens too with
    the stub drafter. Not with the fused drafter in bf16: it picks its q/k/v tile width and work split from the
    rows of the launch (a batch's rows, tests/fused/test_fused_drafter.py::test_qkv_tiling_at_the_8b_shape), so a
    sequence's tree in a batch may round, and at a near-tie rank, differently from its tree alone (the target
    forward itself is batch-invariant: tests/engine/test_engine_target_batched.py), and a sampled speculative
    step's tokens depend on the tree (their distribution does not: the chi-square tests). Greedy tokens never
    depend on the tree."""
    m = tiny_llama(vocab=512, hidden=256, layers=4, heads=4, kv_heads=2, seed=5, std=0.05).to("cuda", torch.bfloat16)
    t = LlamaTarget.from_hf(m, ops="triton")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (int(n),), generator=g).tolist() for n in torch.randint(3, 90, (20,), generator=g)]
    caps = [int(c) for c in torch.randint(1, 48, (20,), generator=g)]
    head = random_eagle3_head(hidden_size=256, vocab_size=512, draft_vocab_size=128, seed=2)
    eng = EagleEngine(t, head, TreeConfig(24, 5, 4), max_length=256, drafter_backend=backend)
    for spec in (True, False):
        refs = [eng.generate(input_ids=p, max_new_tokens=c, eos_token_id=None, speculative=spec)[0]
                for p, c in zip(prompts, caps, strict=True)]
        out = eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=batch_size, speculative=spec,
                                 eos_token_id=None)
        assert [o for o, _ in out] == refs, spec
        if backend != "stub" and spec:
            continue
        kw = dict(temperature=0.8, top_p=0.9, top_k=50)
        out = eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=batch_size, seeds=3,
                                 eos_token_id=None, speculative=spec, **kw)
        for i, (toks, _) in enumerate(out):
            assert toks == eng.generate(input_ids=prompts[i], max_new_tokens=caps[i], seed=3 + i, eos_token_id=None,
                                        speculative=spec, **kw)[0], (spec, i)


# -- moving sequences to a smaller bucket ---------------------------------------------------------------------------
def test_fused_drafter_keep_rows_continues_the_kept_sequences():
    """FusedDraftBackend.keep_rows (interpreter): after keeping rows [2, 0] of a 3-sequence batch in a 2-sequence
    one, the next draft gives those sequences exactly the trees the 3-sequence drafter gives them."""
    head = random_eagle3_head(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                              vocab_size=V, draft_vocab_size=48, seed=3)
    tree = TreeConfig(6, 2, 2)
    g = torch.Generator().manual_seed(4)
    W = head.feature_width
    first = (torch.randn(3, 5, W, generator=g), torch.randint(0, V, (3, 5), generator=g),
             torch.tensor([5, 3, 4], dtype=torch.int32))
    second = (torch.randn(3, 3, W, generator=g), torch.randint(0, V, (3, 3), generator=g),
              torch.tensor([2, 3, 1], dtype=torch.int32))
    full, kept = (TreeDrafter(head, tree, backend="triton") for _ in range(2))
    for d in (full, kept):
        d.reset()
        d.reserve(64, 8, batch=3)
        d.draft_rows(*first)
    want = full.draft_rows(*second)
    kept.keep_rows([2, 0], 2)
    bufs = kept._impl.bufs
    assert bufs.batch == 2 and bufs.kv_len.tolist() == [4, 5]
    rows = torch.tensor([2, 0])
    got = kept.draft_rows(*(x[rows] for x in second))
    for name in ("draft_tokens", "parents", "positions", "retrieve_indices_padded"):
        assert torch.equal(getattr(got, name), getattr(want, name)[rows]), name
    assert torch.equal(kept._impl.bufs.kv_len, full._impl.bufs.kv_len[rows])


@pytest.mark.gpu
def test_gpu_plain_batches_of_32_and_64_equal_generate_bf16():
    """On CUDA, plain decoding in the buckets above speculation's (32 and 64 slots, CUDA graphs per bucket, more
    prompts than slots, the tail moving down the buckets): every sequence's greedy tokens and seeded sampled tokens
    equal generate's alone."""
    m = tiny_llama(vocab=512, hidden=256, layers=4, heads=4, kv_heads=2, seed=5, std=0.05).to("cuda", torch.bfloat16)
    eng = EagleEngine(LlamaTarget.from_hf(m, ops="triton"), max_length=160)
    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    n = 80
    prompts = [torch.randint(0, 512, (int(k),), generator=g).tolist() for k in torch.randint(3, 60, (n,), generator=g)]
    caps = [int(c) for c in torch.randint(1, 40, (n,), generator=g)]
    for kw in (dict(), dict(temperature=0.8, top_p=0.9, seeds=3)):
        seeds = kw.pop("seeds", None)
        refs = [eng.generate(input_ids=p, max_new_tokens=c, eos_token_id=None, seed=None if seeds is None else
                             seeds + i, speculative=False, **kw)[0] for i, (p, c) in enumerate(zip(prompts, caps,
                                                                                                    strict=True))]
        for slots in (32, 64):
            out = eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=slots, seeds=seeds,
                                     eos_token_id=None, speculative=False, **kw)
            assert [o for o, _ in out] == refs, (slots, kw)


def test_target_keep_slots_keeps_rows_and_lengths(target):
    """LlamaTarget.keep_slots: the kept slots' rows and lengths (device and host), in the given order; then a
    decode of the kept slots equals the decode of the same slots in the full batch."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, V, (1, n), generator=g) for n in (3, 7, 5, 2)]
    tok = torch.randint(0, V, (4, 1), generator=g)
    target.setup(32, None, batch_size=4)
    for b, p in enumerate(prompts):
        target.prefill(p, slot=b)
    k = target.cache.k.clone()
    want = target.decode_rows(tok, 32)[0].clone()
    target.setup(32, None, batch_size=4)  # every slot forgotten: the same prompts again
    for b, p in enumerate(prompts):
        target.prefill(p, slot=b)
    target.keep_slots([3, 1], 2)
    assert target.batch_size == 2 and target.lengths == [2, 7] and target.cache.seqlens.tolist() == [2, 7]
    assert torch.equal(target.cache.k[:, 0, :2], k[:, 3, :2]) and torch.equal(target.cache.k[:, 1, :7], k[:, 1, :7])
    got = target.decode_rows(tok[[3, 1]], 32)[0]
    torch.testing.assert_close(got, want[[3, 1]])
    target.note_committed([1, 1])  # the host mirrors follow what the device committed
    target.keep_slots([1], 1)
    assert target.batch_size == 1 and target.length == 8 and target.cache.seqlens.tolist() == [8]
    target.setup(32, None)  # back to one slot for the other tests of the module


def test_batch_buckets_share_the_cache_and_keep_their_step_runners(tiny_model, target):
    """The target's slots are one storage whose first slots each batch size (bucket) steps: moving the tail of a
    job to smaller buckets, a second job and a batch-1 generation after it reallocate nothing, so the step runners
    (and on CUDA their graphs) of every bucket are kept and found again; outputs stay generate's."""
    prompts = _prompts((4, 6, 5, 8), seed=9)
    refs = [hf_greedy(tiny_model, p, 12) for p in prompts]
    drafter = BatchOracleDrafter([p + r for p, r in zip(prompts, refs, strict=True)], TreeConfig(6, 2, 2))
    eng = EagleEngine(target, drafter=drafter, max_length=48)
    caps = [2, 5, 9, 12]
    out = eng.generate_batch(input_ids=prompts, max_new_tokens=caps, batch_size=4)
    assert [t for t, _ in out] == [r[:c] for r, c in zip(refs, caps, strict=True)]
    gen, storage = target.cache_generation, target.cache.k.untyped_storage().data_ptr()
    runners = dict(eng._batch_runners)
    assert {k[1] for k in runners} == {4, 2, 1}  # the job's tail ran in the 2- and 1-slot buckets
    views = {b: target._buckets[b] for b in (4, 2, 1)}
    out2 = eng.generate_batch(input_ids=prompts[::-1], max_new_tokens=caps[::-1], batch_size=4)
    assert [t for t, _ in out2] == [r[:c] for r, c in zip(refs[::-1], caps[::-1], strict=True)]
    assert eng.generate(input_ids=prompts[1], max_new_tokens=5)[0] == refs[1][:5]
    assert target.cache_generation == gen and target.cache.k.untyped_storage().data_ptr() == storage
    assert all(eng._batch_runners[k] is r for k, r in runners.items())
    assert all(target._buckets[b] is v for b, v in views.items())


def test_target_keep_slots_moves_in_place_and_grows_only_past_the_storage(target):
    """keep_slots within the allocated slots copies the moving slots in place (no reallocation, the other
    buckets' views stay valid); past them the storage grows (a new generation) and the kept rows come along."""
    g = torch.Generator().manual_seed(6)
    target.setup(32, None, batch_size=4)
    for b, n in enumerate((3, 7, 5, 2)):
        target.prefill(torch.randint(0, V, (1, n), generator=g), slot=b)
    k, gen = target.cache.k.clone(), target.cache_generation
    target.keep_slots([2, 0, 3], 4)  # same bucket, slots permuted in place
    assert target.cache_generation == gen and target.batch_size == 4
    assert target.cache.seqlens.tolist() == [5, 3, 2, 0] and target.lengths == [5, 3, 2, 0]
    for j, s in enumerate((2, 0, 3)):
        assert torch.equal(target.cache.k[:, j], k[:, s])
    target.keep_slots([1, 0], 8)  # more slots than allocated: the storage grows, rows kept
    assert target.cache_generation == gen + 1 and target.batch_size == 8
    assert target.cache.seqlens.tolist() == [3, 5, 0, 0, 0, 0, 0, 0]
    assert torch.equal(target.cache.k[:, 0, :3], k[:, 0, :3]) and torch.equal(target.cache.k[:, 1, :5], k[:, 2, :5])
    with pytest.raises(ValueError, match="repeat"):
        target.keep_slots([1, 1], 2)
    target.setup(32, None)  # back to one slot (a view of the grown storage) for the other tests of the module
    assert target.cache_generation == gen + 1 and target.batch_size == 1


def test_fused_drafter_buckets_share_the_draft_kv():
    """FusedDraftBackend: the buffer sets of each batch size share one draft KV; keep_rows moves rows in place and
    finds the smaller bucket's buffers again; reserve for a size seen before returns its buffers, lengths zeroed."""
    head = random_eagle3_head(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                              vocab_size=V, draft_vocab_size=48, seed=3)
    d = TreeDrafter(head, TreeConfig(6, 2, 2), backend="triton")
    impl = d._impl
    g = torch.Generator().manual_seed(2)
    W = head.feature_width
    d.reset()
    d.reserve(64, 8, batch=4)
    b4 = impl.bufs
    d.draft_rows(torch.randn(4, 5, W, generator=g), torch.randint(0, V, (4, 5), generator=g),
                 torch.tensor([5, 3, 4, 2], dtype=torch.int32))
    k4 = b4.k_cache.clone()
    d.keep_rows([3, 1], 2)
    b2 = impl.bufs
    assert b2.batch == 2 and b2.k_cache.data_ptr() == b4.k_cache.data_ptr()
    assert b2.kv_len.tolist() == [2, 3] and b4.kv_len.tolist() == [2, 3, 0, 0]
    assert torch.equal(b2.k_cache[0, :2], k4[3, :2]) and torch.equal(b2.k_cache[1, :3], k4[1, :3])
    d.reset()
    d.reserve(64, 8, batch=4)
    assert impl.bufs is b4 and b4.kv_len.tolist() == [0, 0, 0, 0]
    d.keep_rows([0], 2)
    assert impl.bufs is b2
