"""Old import path of :mod:`eagle_triton.tree`
(tree selection and buffers, now below the drafters), kept so that existing imports keep working.

This module object *is* the new one (same functions, classes and state), so attribute access and patching
behave exactly as on the new path.
"""

import sys

from .. import tree as _module

sys.modules[__name__] = _module
