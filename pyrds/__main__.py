"""``python -m pyrds``: the ``pyrds`` command (ping, info, stress), for when the script is not on PATH."""

from __future__ import annotations

import sys

from pyrds.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
