"""``python -m evotuner``: the ``evotuner`` command, for an environment without its script on PATH."""

import sys

from evotuner.launch import main

sys.exit(main())
