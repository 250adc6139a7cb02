"""Entry point of ``python -m vm``."""

from vm.cli import main

raise SystemExit(main())
