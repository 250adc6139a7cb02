"""Guest-side init of the harness: runs INSIDE the VM (stdlib only, started as a script by vng --exec).

Loads the RDS/RDMA modules, brings ``lo`` up, configures the inter-guest link and its rxe device
(two-guests topology), then runs CMD with the guest environment and reports through the shared results
directory (host-writable 9p):

- ``<results>/<role>/started``: JSON written just before CMD starts (guest uptime, module status)
- ``<results>/<role>/rc``: CMD's exit status
- ``<results>/b/ready``: the peer agent is up (guest A waits for it before starting CMD)
- ``<results>/a/done``: guest A is finished (guest B then stops its peer agent and powers off)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

DEFAULT_MODULES = "rds,rds_tcp,rds_rdma,rdma_rxe,ib_uverbs,rdma_ucm,veth,sch_netem"
PEER_WAIT_S = 300.0


def log(msg: str) -> None:
    print(f"[guest] {msg}", file=sys.stderr, flush=True)


def uptime() -> float:
    with open("/proc/uptime") as fh:
        return float(fh.read().split()[0])


def sh(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and res.returncode != 0:
        log(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def write_json(path: str, data: object) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def load_modules(names: list[str]) -> dict[str, bool]:
    """One ``modprobe -a`` (module loading under TCG is slow; one process saves the per-call 9p lookups)."""
    if names and sh(["modprobe", "-a", *names], check=False).returncode != 0:
        for name in names:  # find the culprit(s) and log them
            sh(["modprobe", name])
    return {name: os.path.isdir(f"/sys/module/{name}") for name in names}


#: empty base chains on every inet hook of the initial namespace, for the guest's lifetime (see
#: :func:`pin_netfilter_hooks`)
PIN_TABLE = "pyrds_pin_hooks"
PIN_RULESET = (
    f"table inet {PIN_TABLE} {{\n"
    + "".join(
        f"  chain {hook} {{ type filter hook {hook} priority 0; policy accept; }}\n"
        for hook in ("prerouting", "input", "forward", "output", "postrouting")
    )
    + "}\n"
)


def pin_netfilter_hooks() -> bool:
    """Keep netfilter's ``nf_hooks_needed`` static keys enabled for the whole run.

    A test's nftables table (the mixed pairings' redirect, the restart gate) registers hooks, and the
    first registration (or the last unregistration) of a hook anywhere patches the kernel's text: the jump
    label in ``NF_HOOK`` flips between a 2-byte nop and a 2-byte jmp. Under QEMU TCG, a vCPU running
    ``ip_local_deliver`` while another patches it died twice on 6.12 with RIP in the middle of that very
    instruction (``66 <90>``, ``eb <11>``, 2026-11-26). With one registration held from boot, later ones only
    move the key's count and the text is never patched while traffic flows."""
    try:
        res = subprocess.run(
            ["nft", "-f", "-"], input=PIN_RULESET, capture_output=True, text=True, check=False
        )
    except OSError as exc:
        log(f"nft not available ({exc}): netfilter hooks not pinned")
        return False
    if res.returncode != 0:
        log(f"pinning netfilter hooks failed ({res.returncode}): {res.stderr.strip()}")
        return False
    return True


#: asm-generic/socket.h (the stdlib's socket module has no name for it before 3.14)
SO_TIMESTAMP = 29


def pin_timestamp_key() -> socket.socket | None:
    """A socket with SO_TIMESTAMP held open while CMD runs: ``netstamp_needed_key`` stays enabled, so the
    tests' SO_TIMESTAMP sockets (first on, last off) never patch the receive path's jump label under TCG
    (the same race as :func:`pin_netfilter_hooks`). The caller keeps the socket referenced."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
    except OSError as exc:
        log(f"timestamp key not pinned: {exc}")
        return None
    return s


def iface_by_mac(mac: str) -> str | None:
    for ifname in sorted(os.listdir("/sys/class/net")):
        try:
            with open(f"/sys/class/net/{ifname}/address") as fh:
                if fh.read().strip().lower() == mac.lower():
                    return ifname
        except OSError:
            continue
    return None


def setup_link(mac: str, cidr: str, rxe: str) -> str:
    for _ in range(50):  # the virtio-net device may appear a moment after init starts
        ifname = iface_by_mac(mac)
        if ifname:
            break
        time.sleep(0.1)
    else:
        raise SystemExit(f"[guest] no network interface with MAC {mac}")
    sh(["ip", "addr", "add", cidr, "dev", ifname])
    sh(["ip", "link", "set", ifname, "up"])
    if rxe:
        sh(["rdma", "link", "add", rxe, "type", "rxe", "netdev", ifname])
    return ifname


def mount_cached_trees(specs: list[str], repo: str) -> list[str]:
    """Mount each ``TAG=PATH`` (a read-only 9p export of host PATH, see vm/runner.py cached_trees) with
    ``cache=loose`` over PATH: the repository as the lower layer of a fresh tmpfs-backed overlay (writes stay
    in the guest, as with vng's --overlay-rwdir), anything else bind-mounted. A mount that fails leaves PATH
    on vng's uncached root (slower, same content). Returns the paths now cached."""
    done: list[str] = []
    for spec in specs:
        tag, _, path = spec.partition("=")
        stage = f"/run/pyrds-cache/{tag}"
        os.makedirs(stage, exist_ok=True)
        opts = "trans=virtio,version=9p2000.L,cache=loose,msize=524288,ro"
        if sh(["mount", "-t", "9p", "-o", opts, tag, stage]).returncode != 0:
            continue
        if os.path.realpath(path) == os.path.realpath(repo):
            upper, work = f"/run/pyrds-cache/{tag}.upper", f"/run/pyrds-cache/{tag}.work"
            os.makedirs(upper, exist_ok=True)
            os.makedirs(work, exist_ok=True)
            argv = ["mount", "-t", "overlay", "-o", f"lowerdir={stage},upperdir={upper},workdir={work}"]
            ok = sh([*argv, f"pyrds_{tag}", path]).returncode == 0
        else:
            ok = sh(["mount", "--bind", stage, path]).returncode == 0
        if ok:
            done.append(path)
    return done


def wait_for(path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.2)
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vm.guest")
    ap.add_argument("--results", required=True)
    ap.add_argument("--role", choices=("a", "b"), default="a")
    ap.add_argument("--repo", required=True)
    ap.add_argument("--venv-bin", default="")
    ap.add_argument("--pythonpath", default="", help="extra PYTHONPATH entries after the repo")
    ap.add_argument("--modules", default=DEFAULT_MODULES)
    ap.add_argument("--mac", default="")
    ap.add_argument("--addr", default="", help="CIDR for the inter-guest link, e.g. 10.99.0.1/24")
    ap.add_argument("--peer-addr", default="")
    ap.add_argument("--rxe", default="rxe0")
    ap.add_argument("--wait-peer", action="store_true", help="guest A: wait for b/ready before CMD")
    ap.add_argument("--cached-tree", action="append", default=[], help="TAG=PATH: 9p export to mount cached")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        log("no command")
        return 2
    own = os.path.join(args.results, args.role)
    os.makedirs(own, exist_ok=True)

    t_init = uptime()
    cached = mount_cached_trees(args.cached_tree, args.repo)
    modules = load_modules([m for m in args.modules.split(",") if m])
    pinned = pin_netfilter_hooks()
    stamp_pin = pin_timestamp_key()  # noqa: F841 - held until this process exits
    sh(["ip", "link", "set", "lo", "up"])
    env = dict(os.environ)
    netdev = ""
    if args.mac:
        netdev = setup_link(args.mac, args.addr, args.rxe)
        env.update(
            PYRDS_NETDEV=netdev,
            PYRDS_RXE=args.rxe,
            PYRDS_LOCAL_ADDR=args.addr.split("/")[0],
            PYRDS_PEER_ADDR=args.peer_addr,
        )
    path = env.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    if args.venv_bin:
        path = f"{args.venv_bin}:{path}"
    env.update(
        PATH=path,
        PYRDS_IN_GUEST="1",
        PYRDS_ROLE=args.role,
        PYRDS_VM_RESULTS=own,
        PYTHONPATH=os.pathsep.join(p for p in (args.repo, args.pythonpath, env.get("PYTHONPATH", "")) if p),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
    )

    if args.role == "b":
        proc = subprocess.Popen(cmd, cwd=args.repo, env=env)
        write_json(os.path.join(own, "ready"), {"uptime": uptime()})
        done = os.path.join(args.results, "a", "done")
        while not os.path.exists(done) and proc.poll() is None:
            time.sleep(0.3)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        else:
            wait_for(done, PEER_WAIT_S)  # agent exited early: keep this kernel (the RDS peer) up for A
        rc = proc.wait()
        with open(os.path.join(own, "rc"), "w") as fh:
            fh.write(f"{rc}\n")
        return rc

    if args.wait_peer and not wait_for(os.path.join(args.results, "b", "ready"), PEER_WAIT_S):
        log(f"peer guest B did not become ready within {PEER_WAIT_S:.0f} s")
        rc = 125
    else:
        started = {"uptime": uptime(), "init_uptime": t_init, "modules": modules, "netdev": netdev}
        started["netfilter_hooks_pinned"] = pinned
        started["cached"] = cached
        write_json(os.path.join(own, "started"), started)
        try:
            rc = subprocess.call(cmd, cwd=args.repo, env=env)
        except OSError as exc:
            log(f"cannot run {cmd[0]}: {exc}")
            rc = 127
    with open(os.path.join(own, "rc"), "w") as fh:
        fh.write(f"{rc}\n")
    write_json(os.path.join(own, "done"), {"uptime": uptime(), "rc": rc})
    return rc


if __name__ == "__main__":
    sys.exit(main())
