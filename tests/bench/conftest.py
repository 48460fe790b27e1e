"""The benchmark scripts (``bench/*.py``) are imported by their tests as top-level modules."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
