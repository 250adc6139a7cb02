"""The kernel matrix: which Debian kernels the guests boot, and how they reach this host.

Users run three kernel lines, each from one Debian suite:

======  ==================  =============================================================
alias   suite               how it is installed
======  ==================  =============================================================
6.1     bookworm            the host's own ``linux-image-amd64`` (``.ci/setup`` installs it)
6.12    trixie              fetched: ``apt-get download`` with a private sources list
7.3     trixie-backports    fetched the same way (image split in linux-binary + linux-modules)
======  ==================  =============================================================

A fetched kernel never changes the host's own kernel or its apt configuration: packages are downloaded
with a private sources list and private lists/cache directories under ``~/.cache/pyrds/apt``, unpacked with
``dpkg -x`` into ``~/.cache/pyrds/kernels/<release>``, and only the modules tree is copied to
``/lib/modules/<release>`` (the guest boots the host's root filesystem, so its ``modprobe`` looks there),
followed by ``depmod``. Which release an alias means is looked up in the suite each time (the newest
``linux-image-<alias>.N+debXX-amd64`` there), never hard-coded to one ABI.

``python -m vm fetch-kernels [ALIAS...]`` does it; ``.ci/setup`` calls it for every alias.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from vm.paths import cache_dir

DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY = "http://deb.debian.org/debian-security"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


@dataclass(frozen=True)
class KernelLine:
    alias: str  # "6.12"
    suites: tuple[str, ...]  # suites searched, newest version wins
    host_package: bool = False  # installed on the host by apt (6.1), not fetched


#: the matrix, oldest first; ``tox -e conformance`` runs every entry
MATRIX: tuple[KernelLine, ...] = (
    KernelLine("6.1", ("bookworm",), host_package=True),
    KernelLine("6.12", ("trixie", "trixie-security", "trixie-updates")),
    KernelLine("7.3", ("trixie-backports",)),
)
ALIASES = tuple(k.alias for k in MATRIX)


def line_for(alias: str) -> KernelLine:
    for k in MATRIX:
        if k.alias == alias:
            return k
    raise KeyError(alias)


def kernels_dir() -> str:
    return os.path.join(cache_dir(), "kernels")


def record_path(alias: str) -> str:
    """Where ``fetch`` records what an alias resolved to (release, vmlinuz, package)."""
    return os.path.join(kernels_dir(), f"{alias}.json")


def image_package_re(alias: str) -> re.Pattern[str]:
    """Image packages of one kernel line: ``linux-image-6.12.117+deb13-amd64`` (not -dbg, -unsigned, rt)."""
    return re.compile(r"^linux-image-" + re.escape(alias) + r"\.(\d+)\+deb\d+-amd64$")


def newest_image(names: list[str], alias: str) -> str | None:
    """The newest image package of ``alias`` among package ``names`` (by the point release number)."""
    pat = image_package_re(alias)
    found = [(int(m.group(1)), n) for n in names if (m := pat.match(n))]
    return max(found)[1] if found else None


def sources_list(suites: tuple[str, ...]) -> str:
    """A one-line-per-suite sources.list (main only) for the private apt configuration."""
    out = []
    for s in suites:
        uri = DEBIAN_SECURITY if s.endswith("-security") else DEBIAN_MIRROR
        out.append(f"deb [signed-by={KEYRING}] {uri} {s} main")
    return "\n".join(out) + "\n"


class FetchError(RuntimeError):
    """A kernel of the matrix could not be fetched or unpacked."""


class PrivateApt:
    """apt-get/apt-cache with a sources list and state of their own: the host's configuration is untouched."""

    def __init__(self, name: str, suites: tuple[str, ...]) -> None:
        self.root = os.path.join(cache_dir(), "apt", name)
        for sub in ("lists/partial", "archives/partial"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        self.sources = os.path.join(self.root, "sources.list")
        with open(self.sources, "w") as fh:
            fh.write(sources_list(suites))

    def _opts(self) -> list[str]:
        return [
            "-o", f"Dir::Etc::sourcelist={self.sources}",
            "-o", "Dir::Etc::sourceparts=/dev/null",
            "-o", f"Dir::State::Lists={os.path.join(self.root, 'lists')}",
            "-o", f"Dir::Cache::Archives={os.path.join(self.root, 'archives')}",
            "-o", f"Dir::Cache::pkgcache={os.path.join(self.root, 'pkgcache.bin')}",
            "-o", f"Dir::Cache::srcpkgcache={os.path.join(self.root, 'srcpkgcache.bin')}",
            "-o", "Debug::NoLocking=1",
            "-o", "APT::Get::List-Cleanup=0",
        ]  # fmt: skip

    def run(self, tool: str, *args: str, cwd: str | None = None) -> str:
        argv = [tool, "-q", *self._opts(), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=False)
        if proc.returncode != 0:
            raise FetchError(
                f"{' '.join([tool, *args])} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}"
            )
        return proc.stdout

    def update(self) -> None:
        self.run("apt-get", "update")

    def package_names(self, prefix: str) -> list[str]:
        out = self.run("apt-cache", "pkgnames", prefix)
        return [ln.strip() for ln in out.splitlines() if ln.strip()]

    def download(self, package: str, dest: str) -> str:
        self.run("apt-get", "download", package, cwd=dest)
        debs = sorted(glob.glob(os.path.join(dest, f"{package}_*.deb")))
        if not debs:
            raise FetchError(f"apt-get download {package}: no .deb appeared in {dest}")
        return debs[-1]


def _deb_depends(deb: str) -> list[str]:
    out = subprocess.run(["dpkg-deb", "-f", deb, "Depends"], capture_output=True, text=True, check=True)
    names = []
    for alt in out.stdout.split(","):
        name = alt.split("|")[0].strip().split(" ")[0].split(":")[0]
        if name:
            names.append(name)
    return names


def _release_of(tree: str) -> tuple[str, str]:
    """(release, vmlinuz path) in an unpacked image tree: boot/vmlinuz-REL or lib/modules/REL/vmlinuz."""
    for pattern in ("boot/vmlinuz-*", "usr/lib/modules/*/vmlinuz", "lib/modules/*/vmlinuz"):
        hits = sorted(glob.glob(os.path.join(tree, pattern)))
        if hits:
            path = hits[-1]
            if path.endswith("/vmlinuz"):
                return os.path.basename(os.path.dirname(path)), path
            return os.path.basename(path).removeprefix("vmlinuz-"), path
    raise FetchError(f"no vmlinuz in the unpacked packages under {tree}")


def _modules_tree(tree: str, release: str) -> str:
    for base in ("usr/lib/modules", "lib/modules"):
        path = os.path.join(tree, base, release)
        if os.path.isdir(os.path.join(path, "kernel")):
            return path
    raise FetchError(f"no modules for {release} in the unpacked packages under {tree}")


def fetch(alias: str, modules_root: str = "/lib/modules", log: bool = True) -> dict[str, str]:
    """Look up, download and unpack the newest kernel of ``alias``; returns and records what it installed."""
    line = line_for(alias)
    if line.host_package:
        raise FetchError(f"{alias} is the host's own apt package (apt-get install linux-image-amd64)")
    apt = PrivateApt(alias, line.suites)
    apt.update()
    image = newest_image(apt.package_names("linux-image-" + alias + "."), alias)
    if image is None:
        raise FetchError(f"no linux-image-{alias}.N+debXX-amd64 package in {', '.join(line.suites)}")
    rec_file = record_path(alias)
    try:
        with open(rec_file) as fh:
            old = json.load(fh)
        if (
            old.get("package") == image
            and os.path.isfile(old.get("vmlinuz", ""))
            and os.path.isdir(os.path.join(modules_root, old.get("release", "?"), "kernel"))
        ):
            if log:
                print(f"[vm] kernel {alias}: {image} already installed ({old['release']})")
            return dict(old)
    except (OSError, ValueError):
        pass
    work = tempfile.mkdtemp(prefix=f"fetch-{alias}-", dir=cache_dir())
    try:
        debs = [apt.download(image, work)]
        # 7.x images are a meta package over linux-binary-REL (vmlinuz), linux-modules-REL (.ko) and
        # linux-base-REL (modules.order, modules.builtin)
        for dep in _deb_depends(debs[0]):
            if (
                dep.startswith(("linux-binary-", "linux-modules-", "linux-base-", "linux-image-"))
                and dep != image
            ):
                debs.append(apt.download(dep, work))
        tree = os.path.join(work, "root")
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", deb, tree], check=True)
        release, vmlinuz_src = _release_of(tree)
        mods_src = _modules_tree(tree, release)
        dest = os.path.join(kernels_dir(), release)
        os.makedirs(dest, exist_ok=True)
        vmlinuz = os.path.join(dest, "vmlinuz")
        shutil.copyfile(vmlinuz_src, vmlinuz)
        os.chmod(vmlinuz, 0o644)
        mods_dest = os.path.join(modules_root, release)
        shutil.rmtree(mods_dest, ignore_errors=True)
        shutil.copytree(mods_src, mods_dest, symlinks=True)
        subprocess.run(["depmod", "-a", release], check=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rec = {"alias": alias, "package": image, "release": release, "vmlinuz": vmlinuz}
    os.makedirs(kernels_dir(), exist_ok=True)
    with open(rec_file, "w") as fh:
        json.dump(rec, fh, indent=1)
    if log:
        print(f"[vm] kernel {alias}: installed {image} ({release}): {vmlinuz}, modules in {mods_dest}")
    return rec


def recorded(alias: str) -> dict[str, str] | None:
    try:
        with open(record_path(alias)) as fh:
            rec: dict[str, str] = json.load(fh)
    except (OSError, ValueError):
        return None
    return rec
