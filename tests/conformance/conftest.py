"""Load the pyrds pytest plugin when it is not installed as an entry point (e.g. the VM guest runs the
checkout
through PYTHONPATH without installing it). Installed (pip install -e .), pytest11 already loaded it."""

from __future__ import annotations

import sys

if "pyrds.testing.plugin" not in sys.modules:
    from pyrds.testing import plugin as _plugin

    globals().update({k: v for k, v in vars(_plugin).items() if k.startswith(("pytest_", "rds_", "_rds_"))})
