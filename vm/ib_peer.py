"""Guest B of a ``--peer-ib`` run (``python -m vm.ib_peer``, the conformance run's ``--peer-cmd``): the
userspace node of the RDS/IB kernel->userspace scenarios, which one machine cannot host (the kernel's rds_rdma
holds rdma_cm port 18634 wherever it is loaded).

It unloads rds_rdma (this guest never makes a kernel RDS/IB connection, so the unload is safe), raises
``net.core.wmem_max`` / ``rmem_max`` to the IB sockets' 4 MiB (as the fabric does in guest A), gives the
link its IPv6 twin address (``pyrds.testing.ib.link6``), waits until the link's rxe device (``$PYRDS_RXE``,
made by ``vm/guest.py``) has GIDs for both of this guest's addresses, then becomes
:mod:`pyrds.testing.peeragent` with a fresh token in ``$PYRDS_VM_RESULTS/peer-token``. The userspace stack it
starts for its first socket finds the rxe device and listens on 18634 (IPv6: 16385) of the link addresses.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time

GID_WAIT_S = 60.0


def _gids(dev: str) -> set[bytes]:
    base = f"/sys/class/infiniband/{dev}/ports/1/gids"
    found: set[bytes] = set()
    try:
        names = os.listdir(base)
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(base, name)) as f:
                found.add(ipaddress.IPv6Address(f.read().strip()).packed)
        except (OSError, ValueError):
            continue
    return found


def main() -> int:
    env = os.environ
    rxe, local, results = env.get("PYRDS_RXE"), env.get("PYRDS_LOCAL_ADDR"), env.get("PYRDS_VM_RESULTS")
    if not (rxe and local and results and env.get("PYRDS_NETDEV")):
        print("vm.ib_peer: needs the two-guests topology (PYRDS_RXE, PYRDS_LOCAL_ADDR)", file=sys.stderr)
        return 2
    res = subprocess.run(["modprobe", "-r", "rds_rdma"], capture_output=True, text=True, check=False)
    if res.returncode or os.path.isdir("/sys/module/rds_rdma"):
        print(f"vm.ib_peer: rds_rdma stays loaded: {res.stderr.strip()}", file=sys.stderr)
        return 1
    netdev = env.get("PYRDS_NETDEV", "")
    from pyrds.testing.ib import SOCK_BUF, add_link6  # noqa: PLC0415 - after the environment checks

    for name in ("wmem_max", "rmem_max"):  # as IbFabric in guest A: 4 MiB socket buffers (1 MiB messages)
        with open(f"/proc/sys/net/core/{name}", "w") as f:
            f.write(f"{SOCK_BUF}\n")

    local6 = add_link6(netdev, local)  # the IPv6 twin of the link (RDS/IB over IPv6: rdma_cm port 16385)
    want = {ipaddress.IPv6Address(f"::ffff:{local}").packed, ipaddress.IPv6Address(local6).packed}
    deadline = time.monotonic() + GID_WAIT_S
    while not want <= _gids(rxe):
        if time.monotonic() > deadline:
            print(f"vm.ib_peer: {rxe} has no GIDs for {local} and {local6}", file=sys.stderr)
            return 1
        time.sleep(0.1)
    token_file = os.path.join(results, "peer-token")
    with_token = [sys.executable, "-m", "pyrds.testing.peeragent", "--token-file", token_file]
    sys.stderr.flush()
    os.execv(sys.executable, with_token)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
