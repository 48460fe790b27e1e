"""Old import path of :mod:`eagle_triton.integrations.aiter_tree_utils`
(AITER-style tree helpers), kept so that existing imports keep working.

This module object *is* the new one (same functions, classes and state), so attribute access and patching
behave exactly as on the new path.
"""

import sys

from .integrations import aiter_tree_utils as _module

sys.modules[__name__] = _module
