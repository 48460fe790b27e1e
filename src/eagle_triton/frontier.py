"""Old import path of :mod:`eagle_triton.integrations.frontier`
(the frontier drafting API, now in the integrations wing), kept so that existing imports keep working.

This module object *is* the new one (same functions, classes and state), so attribute access and patching
behave exactly as on the new path.
"""

import sys

from .integrations import frontier as _module

sys.modules[__name__] = _module
