"""A copy of a pyrds tree whose userspace service modules are compiled with mypyc, for an A/B run of
``benchmarks/hops.py --tree`` (issue 10, docs/userspace-profile.md).

It answers one question: how much of the service's time per message is the interpretation of pyrds's own
code. The same sources, compiled unchanged (mypyc turns typed modules into C extensions: native classes,
direct calls between compiled functions), against the interpreted tree. The copy is for measuring only:
compiled classes cannot be monkeypatched, so pyrds's unit tests do not run on it, and the copy is never
installed. mypyc comes with mypy (``pip install -e .[lint]``); a C compiler and Python's headers are needed.

    python benchmarks/compiled_tree.py /work/compiled
    python -m vm run --kernel 7.3 -- bash -c 'cd /work/main && python benchmarks/hops.py --only "[" \\
        --tree plain=/work/main --tree mypyc=/work/compiled'

(hops.py runs each tree's processes with that tree as working directory and PYTHONPATH, which is where
mypyc's shared module lands.)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the modules a message passes through in the service (RDS/TCP); left out: stack/transport.py
#: (a runtime_checkable Protocol, which mypyc cannot compile) and rpc.py (an exception subclass of EOFError)
MODULES = (
    "proto/header.py",
    "proto/framer.py",
    "proto/path.py",
    "proto/cong.py",
    "proto/events.py",
    "proto/handshake.py",
    "proto/pathset.py",
    "proto/backoff.py",
    "stack/core.py",
    "stack/sockstate.py",
    "stack/congestion.py",
    "stack/outbox.py",
    "stack/resources.py",
    "stack/ports.py",
    "service/eventloop.py",
    "service/server.py",
    "service/datachannel.py",
    "service/readiness.py",
    "service/posting.py",
    "transports/tcp/path.py",
    "transports/tcp/conn.py",
    "transports/tcp/transport.py",
    "transports/tcp/sockopt.py",
    "transports/tcp/rxseq.py",
)

_SKIP = shutil.ignore_patterns(".git", ".tox", "build", "__pycache__", "*.egg-info", ".pytest_cache")


def build(dest: Path, source: Path, mypyc: str) -> list[str]:
    """Copy ``source`` to ``dest`` (which must not exist) and compile MODULES there; the modules that
    import as extensions afterwards."""
    shutil.copytree(source, dest, ignore=_SKIP)
    paths = [f"pyrds/userspace/{m}" for m in MODULES]
    subprocess.run([mypyc, *paths], cwd=dest, check=True, stdout=subprocess.DEVNULL)
    names = [p[: -len(".py")].replace("/", ".") for p in paths]
    probe = "import importlib, sys\nfor n in sys.argv[1:]:\n    print(n, importlib.import_module(n).__file__)"
    out = subprocess.run(
        [sys.executable, "-c", probe, *names], cwd=dest, check=True, capture_output=True, text=True
    ).stdout
    return [line.split()[0] for line in out.splitlines() if line.endswith(".so")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path, help="where the copy goes (must not exist)")
    ap.add_argument("--from", dest="source", type=Path, default=ROOT, help="the tree to copy (this clone)")
    ap.add_argument("--mypyc", default=shutil.which("mypyc"), help="the mypyc command (default: from PATH)")
    args = ap.parse_args()
    if not args.mypyc:
        sys.exit("no mypyc: pip install mypy (it comes with it), or say --mypyc PATH")
    if args.dest.exists():
        sys.exit(f"{args.dest} exists")
    compiled = build(args.dest, args.source.resolve(), args.mypyc)
    print(f"{len(compiled)} of {len(MODULES)} modules compiled in {args.dest}")
    if len(compiled) != len(MODULES):
        sys.exit("some modules still import as Python")


if __name__ == "__main__":
    main()
