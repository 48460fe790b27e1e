"""``python -m eagle_triton`` runs the ``eagle-triton`` CLI."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
