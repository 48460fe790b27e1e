"""Configuration dataclasses shared by the drafters, kernels and engine."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TreeConfig"]


@dataclass(frozen=True)
class TreeConfig:
    """Shape of an EAGLE-2 dynamic draft tree, with SafeAILab EAGLE's meanings.

    Parameters
    ----------
    total_tokens:
        Tree size *including the root* (EAGLE's ``total_token``); ``total_tokens - 1`` nodes are drafted.
    depth:
        Number of expansion forwards after the root step (EAGLE's code ``depth``). Trees reach ``depth + 1``
        drafted levels below the root, so one step can accept up to ``depth + 1`` drafts plus a bonus token.
    top_k:
        Branching factor: children proposed per frontier node and frontier width per level.

    The drafter scores ``top_k + depth * top_k**2`` candidates and keeps the best ``total_tokens - 1``, so that
    count may not exceed the number of candidates.
    """

    total_tokens: int = 60
    depth: int = 7
    top_k: int = 10

    def __post_init__(self) -> None:
        for name in ("total_tokens", "depth", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"TreeConfig.{name} must be an int, got {type(value).__name__} ({value!r})")
        if self.top_k < 1:
            raise ValueError(f"TreeConfig.top_k must be >= 1, got {self.top_k}")
        if self.depth < 0:
            raise ValueError(f"TreeConfig.depth must be >= 0, got {self.depth}")
        if self.total_tokens < 2:
            raise ValueError(f"TreeConfig.total_tokens counts the root and must be >= 2, got {self.total_tokens}")
        if self.num_draft_nodes > self.num_candidates:
            raise ValueError(
                f"TreeConfig: total_tokens - 1 = {self.num_draft_nodes} drafted nodes exceed the "
                f"top_k + depth * top_k**2 = {self.top_k} + {self.depth} * {self.top_k}**2 = {self.num_candidates} "
                f"candidates the drafter scores; lower total_tokens or raise depth/top_k"
            )

    @property
    def num_draft_nodes(self) -> int:
        """Number of drafted nodes, ``T = total_tokens - 1``."""
        return self.total_tokens - 1

    @property
    def num_candidates(self) -> int:
        """Candidates scored per draft: ``top_k`` at the root plus ``top_k**2`` per expansion."""
        return self.top_k + self.depth * self.top_k**2

    @property
    def max_levels(self) -> int:
        """Deepest drafted level below the root (``depth + 1``)."""
        return self.depth + 1

    def __str__(self) -> str:
        return f"{self.total_tokens}/{self.depth}/{self.top_k}"
