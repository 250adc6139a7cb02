"""Load the pyrds pytest plugin when it is not installed as an entry point (e.g. the VM guest runs the
checkout
through PYTHONPATH without installing it). Installed (pip install -e .), pytest11 already loaded it."""

from __future__ import annotations

import sys

if "pyrds.testing.plugin" not in sys.modules:
    from pyrds.testing import plugin as _plugin

    globals().update({k: v for k, v in vars(_plugin).items() if k.startswith(("pytest_", "rds_", "_rds_"))})

import pytest  # noqa: E402

# the plugin's own hook when it was copied in above (not installed); installed, pytest calls it separately
_plugin_collection_hook = globals().get("pytest_collection_modifyitems")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Scenarios marked ``slow`` (the CLI across nodes, the selftests: most of a kernel's minutes) run first,
    in their collected order, then the rest: with pytest-xdist's load scheduling the short tests then fill
    the workers' tails instead of one worker finishing a minute-long scenario alone."""
    if _plugin_collection_hook is not None:
        _plugin_collection_hook(config, items)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
