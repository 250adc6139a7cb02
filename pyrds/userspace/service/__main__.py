"""``python -m pyrds.userspace.service``: this namespace's stack service (see :mod:`.daemon`)."""

from __future__ import annotations

import sys

from pyrds.userspace.service.daemon import main

if __name__ == "__main__":
    sys.exit(main())
