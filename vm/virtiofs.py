"""virtiofs for the guest's root filesystem: find (or fetch) a virtiofsd that virtme-ng can use.

Why: vng shares the host's root with the guest. With 9p (``--force-9p`` or no usable daemon) the root is
mounted without a cache, so every ``stat``/``open``/``mmap`` of an exec or an import crosses the emulated
virtio device; with virtiofs vng exports the read-only root with ``--cache always`` and the guest's page and
dentry caches hold. Measured in a 7.3 TCG guest (vm/README.md, 2026-11-26): ``import pyrds.cli.main``
3.6-4.5 s -> 1.6-2.1 s, ``pyrds info --backend kernel -n --json`` 4.1-5.1 s -> 2.5-3.6 s,
``import pytest, pyroute2`` 8.4-16.1 s -> 5.5-9.1 s.

What vng does (virtme-ng 1.42, ``virtme/commands/run.py`` ``VirtioFS``): unless ``--force-9p``, it takes
the first executable of ``<guest tools>/bin/virtiofsd``, ``virtiofsd`` on PATH, ``/usr/libexec/virtiofsd``,
``/usr/lib/virtiofsd/virtiofsd``, ``/usr/lib/virtiofsd``, ``/usr/lib/qemu/virtiofsd`` whose ``--version``
exits 0, starts it with the Rust daemon's options (``--shared-dir --socket-path --sandbox none --cache
always [--readonly]``) and waits up to 3.1 s for its pid file; without one it falls back to 9p. On a
bookworm host the only candidate is QEMU 7.2's C daemon (``/usr/lib/qemu/virtiofsd``, qemu-system-common):
run as root its ``--version`` works, so vng picks it, the daemon rejects those options, and every boot
waits the 3.1 s before using 9p anyway.

Bookworm has no Rust ``virtiofsd`` package (not in bookworm nor bookworm-backports; trixie has 1.13). Its
trixie build needs glibc 2.39 (two weak symbols, ``pidfd_spawnp`` and ``pidfd_getpid``) and bookworm has
2.36, so :func:`fetch` downloads trixie's ``virtiofsd`` and ``libc6`` with the private apt configuration of
vm/catalog.py and runs the daemon through trixie's own dynamic loader (a wrapper script in
``~/.cache/pyrds/virtiofsd/bin``); the host's libc and apt configuration are not touched. On a host with a
Rust virtiofsd of its own (``apt-get install virtiofsd`` on trixie) that one is used and nothing is fetched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from vm.catalog import FetchError, PrivateApt
from vm.paths import cache_dir

#: where vng looks besides PATH (its order); QEMU's C daemon at the end is the one that does not work
SYSTEM_CANDIDATES = (
    "/usr/libexec/virtiofsd",
    "/usr/lib/virtiofsd/virtiofsd",
    "/usr/lib/virtiofsd",
    "/usr/lib/qemu/virtiofsd",
)
#: an option the Rust daemon has and QEMU's C daemon does not (vng passes it)
RUST_OPTION = "--shared-dir"
FETCH_SUITE = ("trixie",)
LOADER = "ld-linux-x86-64.so.2"

_usable_cache: dict[tuple[str, int], bool] = {}  # (path, mtime): usable


def fetched_dir() -> str:
    """``~/.cache/pyrds/virtiofsd``: ``bin/virtiofsd`` (wrapper) and ``lib/`` (trixie's daemon and libc)."""
    return os.path.join(cache_dir(), "virtiofsd")


def fetched_wrapper() -> str:
    return os.path.join(fetched_dir(), "bin", "virtiofsd")


def usable(path: str) -> bool:
    """Whether ``path`` is a virtiofsd that vng can start: executable, ``--version`` exits 0 and ``--help``
    lists the Rust daemon's options (QEMU 7.2's C daemon passes vng's own ``--version`` test, then fails)."""
    try:
        key = (path, os.stat(path).st_mtime_ns)
    except OSError:
        return False
    if key in _usable_cache:
        return _usable_cache[key]
    ok = False
    if os.path.isfile(path) and os.access(path, os.X_OK):
        try:
            version = subprocess.run([path, "--version"], capture_output=True, timeout=10, check=False)
            helped = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10, check=False)
            ok = version.returncode == 0 and helped.returncode == 0 and RUST_OPTION in helped.stdout
        except (OSError, subprocess.SubprocessError):
            ok = False
    _usable_cache[key] = ok
    return ok


def find_virtiofsd() -> str | None:
    """The first usable virtiofsd: on PATH, in vng's fixed places, then the one :func:`fetch` installed."""
    candidates = [shutil.which("virtiofsd"), *SYSTEM_CANDIDATES, fetched_wrapper()]
    for path in candidates:
        if path and usable(path):
            return path
    return None


def vng_path_dir(virtiofsd: str) -> str:
    """A directory holding only ``virtiofsd`` -> ``virtiofsd``, to put first on vng's PATH so vng starts that
    daemon rather than an earlier candidate of its own list (e.g. QEMU's C daemon)."""
    d = os.path.join(cache_dir(), "vng-path")
    link = os.path.join(d, "virtiofsd")
    if os.path.realpath(link) != os.path.realpath(virtiofsd):
        os.makedirs(d, exist_ok=True)
        tmp = f"{link}.tmp{os.getpid()}"
        os.symlink(virtiofsd, tmp)
        os.replace(tmp, link)
    return d


WRAPPER = """#!/bin/sh
# trixie's virtiofsd through trixie's dynamic loader and libc (the host's glibc is older); see vm/virtiofs.py
d=$(dirname "$(dirname "$(readlink -f "$0")")")/lib
exec "$d/{loader}" --library-path "$d:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu" "$d/virtiofsd" "$@"
"""


def fetch(log: bool = True) -> str:
    """A usable virtiofsd, fetched into :func:`fetched_dir` when the host has none. Idempotent."""
    found = find_virtiofsd()
    if found:
        if log:
            print(f"[vm] virtiofsd: {found}")
        return found
    apt = PrivateApt("virtiofsd", FETCH_SUITE)
    apt.update()
    work = tempfile.mkdtemp(prefix="fetch-virtiofsd-", dir=cache_dir())
    try:
        tree = os.path.join(work, "root")
        debs = [apt.download(pkg, work) for pkg in ("virtiofsd", "libc6")]
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", deb, tree], check=True)
        daemon = os.path.join(tree, "usr", "libexec", "virtiofsd")
        libdir = os.path.join(tree, "usr", "lib", "x86_64-linux-gnu")
        if not os.path.isfile(daemon) or not os.path.isfile(os.path.join(libdir, LOADER)):
            raise FetchError(f"unexpected package layout: no usr/libexec/virtiofsd or {LOADER} under {tree}")
        dest = fetched_dir()
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(libdir, os.path.join(dest, "lib"), symlinks=True)
        shutil.copy2(daemon, os.path.join(dest, "lib", "virtiofsd"))
        os.makedirs(os.path.join(dest, "bin"))
        with open(fetched_wrapper(), "w") as fh:
            fh.write(WRAPPER.format(loader=LOADER))
        os.chmod(fetched_wrapper(), 0o755)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not usable(fetched_wrapper()):
        raise FetchError(f"{fetched_wrapper()} does not run (--version/--help)")
    if log:
        names = ", ".join(os.path.basename(d) for d in debs)
        print(f"[vm] virtiofsd: installed {fetched_wrapper()} ({names})")
    return fetched_wrapper()
