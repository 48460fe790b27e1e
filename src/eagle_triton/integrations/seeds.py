"""Old import path of :mod:`eagle_triton.integrations.optimize`
(the EAGLE-user entry points), kept so that existing imports keep working.

This module object *is* the new one (same functions, classes and state), so attribute access and patching
behave exactly as on the new path.
"""

import sys

from . import optimize as _module

sys.modules[__name__] = _module
