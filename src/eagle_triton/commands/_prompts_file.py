"""``eagle-triton generate --prompts-file``: read a JSON-lines prompts file, checked whole before any generation.

Each non-blank line is a JSON object with ``"prompt"`` (a string, through the chat template unless
``--no-chat-template``) or ``"messages"`` (a chat: a list of ``{"role", "content"}`` objects, through the chat
template), not both, and the same kind on every line; optional per-line ``"max_new_tokens"``, ``"temperature"``,
``"top_p"``, ``"top_k"`` and ``"seed"`` override the command's options. Any other key is an error, so a typo is
not silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

OPTIONAL_KEYS = {"max_new_tokens": int, "temperature": (int, float), "top_p": (int, float), "top_k": int,
                 "seed": int}


class PromptsFileError(ValueError):
    """A prompts file that cannot be used; the message names the file and the line."""


@dataclass
class PromptLine:
    """One prompt of the file: its 1-based ``line`` number, ``prompt`` text or chat ``messages``, and the options
    it overrides."""

    line: int
    prompt: str | None = None
    messages: list | None = None
    options: dict = field(default_factory=dict)


def read_prompts_file(path: str) -> list[PromptLine]:
    """Parse and check every line of ``path`` (UTF-8 JSON lines); raises :class:`PromptsFileError`."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise PromptsFileError(f"--prompts-file {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise PromptsFileError(f"--prompts-file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise PromptsFileError(f"--prompts-file {path}: {e.strerror}") from None
    out: list[PromptLine] = []
    kind_line = None  # the first line, and whether it is a chat
    for no, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        where = f"{path} line {no}"
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise PromptsFileError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise PromptsFileError(f"{where}: expected a JSON object with \"prompt\" or \"messages\", got "
                                   f"{type(obj).__name__}")
        unknown = sorted(set(obj) - set(OPTIONAL_KEYS) - {"prompt", "messages"})
        if unknown:
            raise PromptsFileError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} (allowed: \"prompt\" or "
                                   f"\"messages\", and {', '.join(map(repr, OPTIONAL_KEYS))})")
        if ("prompt" in obj) == ("messages" in obj):
            raise PromptsFileError(f"{where}: needs exactly one of \"prompt\" (text) or \"messages\" (a chat)")
        item = PromptLine(no)
        if "prompt" in obj:
            p = obj["prompt"]
            if not isinstance(p, str) or not p.strip():
                raise PromptsFileError(f"{where}: \"prompt\" must be a non-empty string")
            item.prompt = p
        else:
            m = obj["messages"]
            if (not isinstance(m, list) or not m or not all(
                    isinstance(x, dict) and isinstance(x.get("role"), str) and isinstance(x.get("content"), str)
                    for x in m)):
                raise PromptsFileError(f"{where}: \"messages\" must be a non-empty list of {{\"role\": str, "
                                       "\"content\": str}} objects")
            item.messages = m
        chat = item.messages is not None
        if kind_line is None:
            kind_line = (no, chat)
        elif kind_line[1] != chat:
            kinds = {True: '"messages" (chat)', False: '"prompt" (text)'}
            raise PromptsFileError(f"{where}: mixes chat and non-chat prompts: line {kind_line[0]} has "
                                   f"{kinds[kind_line[1]]}, this one has {kinds[chat]}; use one kind in a file")
        for key, typ in OPTIONAL_KEYS.items():
            if key in obj:
                v = obj[key]
                if isinstance(v, bool) or not isinstance(v, typ):
                    raise PromptsFileError(f"{where}: \"{key}\" must be {'an int' if typ is int else 'a number'}, "
                                           f"got {v!r}")
                item.options[key] = v
        _check_options(where, item.options)
        out.append(item)
    if not out:
        raise PromptsFileError(f"--prompts-file {path} has no prompts (every line is blank)")
    return out


def _check_options(where: str, o: dict) -> None:
    if o.get("max_new_tokens", 0) < 0:
        raise PromptsFileError(f"{where}: \"max_new_tokens\" must be >= 0, got {o['max_new_tokens']}")
    if o.get("temperature", 0) < 0:
        raise PromptsFileError(f"{where}: \"temperature\" must be >= 0 (0 = greedy), got {o['temperature']}")
    if "top_p" in o and not 0 < o["top_p"] <= 1:
        raise PromptsFileError(f"{where}: \"top_p\" must be in (0, 1], got {o['top_p']}")
    if o.get("top_k", 0) < 0:
        raise PromptsFileError(f"{where}: \"top_k\" must be >= 0 (0 = off), got {o['top_k']}")


def chat_ids(tokenizer, messages: list) -> list[int]:
    """Token ids of a chat through the tokenizer's chat template (with the generation prompt)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
