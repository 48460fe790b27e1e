"""Incremental detokenisation for streaming: the text of each new batch of tokens, whole characters only."""

from __future__ import annotations

__all__ = ["TextStream"]


class TextStream:
    """Turns tokens arriving in batches into text deltas whose concatenation is ``decode(all tokens)``.

    Each push decodes a short window (the tokens since the last emitted delta, plus the batch before them as
    context, because tokenizers may render a token differently at the start of a text, e.g. a leading space) and
    emits only what the window added. Text ending in U+FFFD is held back: the character's remaining bytes are
    probably in the next tokens (a byte-level token can carry part of a multi-byte character).
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.tokens: list[int] = []
        self._prefix = 0  # window start (context tokens, already emitted)
        self._read = 0  # tokens before this index have been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, ids: list[int]) -> str:
        """Add tokens; returns the new text that is complete (possibly ``""``)."""
        self.tokens.extend(ids)
        return self._delta(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end is emitted as U+FFFD)."""
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        before = self._decode(self.tokens[self._prefix:self._read])
        now = self._decode(self.tokens[self._prefix:])
        if len(now) <= len(before) or (now.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(self.tokens)
        return now[len(before):]
