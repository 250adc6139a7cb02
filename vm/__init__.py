"""pyrds VM harness: run a command inside QEMU guests booted from Debian bookworm's 6.1 kernel (virtme-ng).

``python -m vm run [--topology netns|two-guests] [--junit PATH] -- CMD...``; see vm/README.md.
Importing this package has no side effects.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
