"""``python -m minillm ...`` runs the ``minillm`` command."""

import sys

from .cli import main

sys.exit(main())
