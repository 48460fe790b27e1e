"""EAGLE draft heads (EAGLE-3 and EAGLE-1/2) and their checkpoint format."""

from .base import DraftHead, detect_head_kind, load_draft_head
from .checkpoint import CheckpointError
from .config import DraftHeadConfig
from .eagle1 import Eagle1DraftHead
from .eagle3 import Eagle3DraftHead, eagle3_tap_layers
from .fp8 import Fp8Linear, fp8_linear, quantize_fp8_weight

__all__ = [
    "CheckpointError",
    "DraftHead",
    "DraftHeadConfig",
    "Eagle1DraftHead",
    "Eagle3DraftHead",
    "Fp8Linear",
    "detect_head_kind",
    "fp8_linear",
    "eagle3_tap_layers",
    "load_draft_head",
    "quantize_fp8_weight",
]
