"""``python -m vm``: run commands inside QEMU guests booted from Debian's kernels (6.1, 6.12, 7.3)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys

from pyrds.testing.kernelinfo import is_kernel_label, short_alias
from vm import accel as accel_mod
from vm import catalog, guestpy, virtiofs
from vm.kernel import GuestKernel, KernelNotFound, find_kernel
from vm.runner import (
    CONSOLE_LOG,
    GUEST_DEATHS,
    ROOTFS_MODES,
    HarnessError,
    RunConfig,
    RunResult,
    cached_trees,
    died_mid_command,
    guest_death,
    resolve_rootfs,
    run,
)

_FETCHED = tuple(k.alias for k in catalog.MATRIX if not k.host_package)


def _kernels() -> int:
    """One line per alias of the matrix: what it resolves to here, or why it cannot boot."""
    bad = 0
    for k in catalog.MATRIX:
        try:
            g = find_kernel(k.alias)
            print(f"{k.alias}\t{g.release}\t{g.vmlinuz}")
        except KernelNotFound as exc:
            bad += 1
            print(f"{k.alias}\tMISSING\t{exc}")
    return 1 if bad else 0


def _run_args(p: argparse.ArgumentParser) -> None:
    """Options shared by ``run`` and ``matrix``."""
    p.add_argument("--topology", choices=("netns", "two-guests"), default="netns")
    p.add_argument("--junit", metavar="PATH", help="copy the guest's JUnit XML here (pytest gets --junitxml)")
    p.add_argument("--timeout", type=float, default=1200.0, help="whole-run bound in seconds (default 1200)")
    p.add_argument(
        "--accel", choices=("auto", "kvm", "tcg"), default=None, help="default $PYRDS_VM_ACCEL/auto"
    )
    p.add_argument("--cpus", "-p", type=int, default=None, help="vCPUs per guest (default 2, two-guests 1)")
    p.add_argument("--memory", "-m", default=None, help="memory per guest (default 2G, two-guests 1G)")
    p.add_argument("--peer-cmd", default="sleep infinity", help="guest B's agent (shell words; two-guests)")
    p.add_argument(
        "--peer-ib",
        action="store_true",
        help="two-guests for the conformance suite: guest A keeps --cpus/--memory (default 2, 2G) and gets "
        "no rxe device at boot (the IB phase makes one), guest B has 1 vCPU and 1G",
    )
    p.add_argument("--modules", default=None, help="comma list of modules to modprobe (default: RDS set)")
    p.add_argument("--system-python", action="store_true", help="don't use the guest venv (Debian's python3)")
    p.add_argument("--keep-results", action="store_true", help="keep the shared results directory")
    p.add_argument(
        "--no-code-cache",
        action="store_true",
        help="read the repository and Python from vng's uncached 9p root (slower; see runner.cached_trees)",
    )
    p.add_argument(
        "--rootfs",
        choices=ROOTFS_MODES,
        default=None,
        help="the guest's root filesystem: virtiofs (cached; needs a Rust virtiofsd, see fetch-virtiofsd), "
        "9p (uncached, plus the code cache), auto (virtiofs when a virtiofsd is found; the default, or "
        "$PYRDS_VM_ROOTFS)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="show the guest kernel console")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m vm", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="boot once, run CMD in the guest, exit with its status")
    _run_args(r)
    r.add_argument(
        "--kernel",
        help="6.1 (default: newest /boot/vmlinuz-6.1.0-*-amd64), 6.12, 7.3 (see fetch-kernels), or PATH",
    )
    r.add_argument(
        "--copy-out",
        metavar="DIR",
        help="copy guest A's results directory ({results} in CMD) to DIR afterwards",
    )
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD...")

    m = sub.add_parser("matrix", help="run CMD once per kernel (one boot each); results in OUT/<alias>")
    _run_args(m)
    m.add_argument(
        "--kernels",
        default=os.environ.get(KERNELS_ENV) or ",".join(catalog.ALIASES),
        help="comma list of aliases, image paths, or LABEL=PATH (your kernel under a name of its own: its "
        f"results in OUT/LABEL); default ${KERNELS_ENV} or {','.join(catalog.ALIASES)}",
    )
    m.add_argument(
        "--out", required=True, metavar="DIR", help="guest A's results directory per kernel: DIR/<alias>"
    )
    m.add_argument(
        "--reboots",
        type=int,
        default=1,
        metavar="N",
        help="boot a kernel again (at most N times, default 1) when its guest died mid-CMD with no exit "
        "status; each death is recorded in OUT/<alias>/guest-deaths.json with the kernel console",
    )
    m.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD...")

    sub.add_parser("setup", help="create/refresh the guest venv (~/.cache/pyrds/guest-venv)")
    f = sub.add_parser("fetch-kernels", help="download and unpack the matrix's Debian kernels (root)")
    f.add_argument("aliases", nargs="*", help=f"default: every fetched alias ({', '.join(_FETCHED)})")
    sub.add_parser(
        "fetch-virtiofsd",
        help="find a usable virtiofsd, or fetch trixie's into ~/.cache/pyrds/virtiofsd (vm/virtiofs.py)",
    )
    sub.add_parser("kernels", help="print the matrix: alias, release, image")
    a = sub.add_parser("accel", help="print the accelerator auto mode picks (probes KVM once)")
    a.add_argument("--kernel")
    return ap


def _config(args: argparse.Namespace, kernel: GuestKernel, copy_out: str | None) -> RunConfig:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise HarnessError(f"no command given: python -m vm {args.command} [options] -- CMD...")
    acc, why = accel_mod.resolve_accel(kernel.vmlinuz, args.accel)
    if args.peer_ib:
        args.topology = "two-guests"
    two = args.topology == "two-guests"
    venv_bin = None if args.system_python else guestpy.ensure_venv(create=True)
    daemon, root_why = resolve_rootfs(args.rootfs)
    cfg = RunConfig(
        kernel=kernel,
        accel=acc,
        cmd=cmd,
        topology=args.topology,
        cpus=args.cpus or (1 if two and not args.peer_ib else 2),
        memory=args.memory or ("1G" if two and not args.peer_ib else "2G"),
        peer_cpus=1 if args.peer_ib else None,
        peer_memory="1G" if args.peer_ib else None,
        link_rxe_a=not args.peer_ib,
        timeout=args.timeout,
        junit=args.junit,
        peer_cmd=shlex.split(args.peer_cmd),
        venv_bin=venv_bin,
        pythonpath=guestpy.pyverbs_shim(),
        modules=args.modules,
        keep_results=args.keep_results,
        copy_out=copy_out,
        verbose=args.verbose,
        code_cache=not args.no_code_cache,
        virtiofsd=daemon,
    )
    trees = cached_trees(cfg)
    print(
        f"[vm] kernel {kernel.release}, accel {acc} ({why}), topology {cfg.topology}, "
        f"root {'virtiofs' if daemon else '9p'} ({root_why}), "
        f"python {'venv ' + venv_bin if venv_bin else guestpy.SYSTEM_PYTHON}, "
        f"cached code trees {', '.join(trees) if trees else 'none'}",
        file=sys.stderr,
    )
    return cfg


def _report(res: RunResult, keep: bool, label: str = "") -> None:
    for msg in res.messages:
        print(f"[vm]{label} {msg}", file=sys.stderr)
    boot = f"{res.boot_s:.1f} s" if res.boot_s is not None else "n/a"
    up = f"{res.guest_uptime_s:.1f} s" if res.guest_uptime_s is not None else "n/a"
    print(
        f"[vm]{label} boot to CMD {boot} (guest uptime {up}); total wall {res.wall_s:.1f} s; "
        f"exit status {res.rc}" + (f"; results kept in {res.results_dir}" if keep else ""),
        file=sys.stderr,
    )


def _attempt_console(attempt: int) -> str:
    """The file in a kernel's results that keeps the console of boot ``attempt``, which died mid-command
    (the next boot writes its own ``console.log``)."""
    return f"console-attempt{attempt}.log"


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


#: the kernels of ``python -m vm matrix`` (and so of ``tox -e conformance``) when --kernels is not given
KERNELS_ENV = "PYRDS_KERNELS"


def matrix_kernels(text: str) -> list[tuple[str, GuestKernel]]:
    """``--kernels``: (alias, kernel) per entry. An alias of the matrix names itself; an image path gets
    the major.minor of its release (``7.4.0-rc1`` -> ``7.4``); ``LABEL=PATH`` gets LABEL, for a kernel that
    would otherwise share an alias (your patched 7.3 beside Debian's). Two entries with one alias, or a
    LABEL that cannot be a directory name, are refused (ValueError) before anything boots."""
    kernels: list[tuple[str, GuestKernel]] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        label, sep, image = entry.partition("=")
        if sep:
            label = label.strip()
            if not is_kernel_label(label):
                raise ValueError(f"--kernels: {label!r} is not a label (letters, digits, . + ~ - _)")
            kernel = find_kernel(image.strip())
            alias = label
        else:
            kernel = find_kernel(entry)
            alias = entry if entry in catalog.ALIASES else short_alias(kernel.release)
        if any(alias == a for a, _ in kernels):
            raise ValueError(f"--kernels: two kernels would be {alias!r}: name one LABEL=PATH")
        kernels.append((alias, kernel))
    if not kernels:
        raise ValueError("--kernels: no kernel given")
    return kernels


def _matrix(args: argparse.Namespace) -> int:
    """One boot per kernel; ``OUT/<alias>`` gets guest A's results, ``OUT/matrix.json`` what each boot did.

    Exit status: 0 when CMD exited 0 on every kernel, else the first non-zero status (2: a kernel of the
    matrix is not installed; that is checked for all of them before the first boot)."""
    kernels = matrix_kernels(args.kernels)  # every kernel exists before anything boots
    os.makedirs(args.out, exist_ok=True)
    summary: list[dict[str, object]] = []
    planned = [alias for alias, _ in kernels]
    with open(os.path.join(args.out, "matrix.json"), "w") as fh:  # the report's kernels, before any boot
        json.dump({"planned": planned, "kernels": summary}, fh, indent=1)
    rc = 0
    for alias, kernel in kernels:
        out = os.path.join(args.out, alias)
        deaths: list[dict[str, object]] = []
        consoles: dict[str, bytes] = {}  # a dead attempt's whole console, kept past the next boot's wipe
        while True:
            shutil.rmtree(out, ignore_errors=True)
            res = run(_config(args, kernel, out))
            _report(res, args.keep_results, f"[{alias}]")
            if not died_mid_command(res) or len(deaths) >= max(0, args.reboots):
                break
            deaths.append(guest_death(res, os.path.join(out, CONSOLE_LOG), len(deaths) + 1))
            consoles[_attempt_console(len(deaths))] = _read_bytes(os.path.join(out, CONSOLE_LOG))
            print(
                f"[vm][{alias}] guest died while CMD ran (attempt {len(deaths)}); "
                f"booting {alias} again (recorded in {GUEST_DEATHS})",
                file=sys.stderr,
                flush=True,
            )
        if died_mid_command(res):
            deaths.append(guest_death(res, os.path.join(out, CONSOLE_LOG), len(deaths) + 1))
        if deaths:
            os.makedirs(out, exist_ok=True)
            for name, data in consoles.items():
                with open(os.path.join(out, name), "wb") as fh:
                    fh.write(data)
            with open(os.path.join(out, GUEST_DEATHS), "w") as fh:
                json.dump({"deaths": deaths}, fh, indent=1)
        summary.append(
            {
                "alias": alias,
                "release": kernel.release,
                "rc": res.rc,
                "timed_out": res.timed_out,
                "boot_s": None if res.boot_s is None else round(res.boot_s, 1),
                "wall_s": round(res.wall_s, 1),
                "guest_deaths": len(deaths),
                "results": out,
            }
        )
        rc = rc or res.rc
        with open(os.path.join(args.out, "matrix.json"), "w") as fh:
            json.dump({"planned": planned, "kernels": summary}, fh, indent=1)
    for row in summary:
        print(
            f"[vm] matrix {row['alias']:5s} {row['release']}: exit {row['rc']}, wall {row['wall_s']} s",
            file=sys.stderr,
        )
    return rc


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "setup":
            bin_dir = guestpy.ensure_venv(create=True)
            print(bin_dir or "guest venv unavailable")
            return 0 if bin_dir else 1
        if args.command == "fetch-kernels":
            for alias in args.aliases or _FETCHED:
                if alias not in _FETCHED:
                    raise ValueError(f"{alias!r} is not fetched (choose from {', '.join(_FETCHED)})")
                catalog.fetch(alias)
                find_kernel(alias)  # the four RDS/rxe modules are there
            return 0
        if args.command == "fetch-virtiofsd":
            virtiofs.fetch()
            return 0
        if args.command == "kernels":
            return _kernels()
        if args.command == "matrix":
            return _matrix(args)
        kernel = find_kernel(args.kernel)
        if args.command == "accel":
            acc, why = accel_mod.resolve_accel(kernel.vmlinuz)
            print(f"{acc}: {why}")
            return 0
        res = run(_config(args, kernel, args.copy_out))
    except (KernelNotFound, HarnessError, ValueError, catalog.FetchError) as exc:
        print(f"python -m vm: error: {exc}", file=sys.stderr)
        return 2
    _report(res, args.keep_results)
    return res.rc
