"""Guest B of a ``--peer-ib`` run (``python -m vm.ib_peer``, the conformance run's ``--peer-cmd``): the
userspace node of the RDS/IB kernel->userspace scenarios, which one machine cannot host (the kernel's rds_rdma
holds rdma_cm port 18634 wherever it is loaded).

It unloads rds_rdma (this guest never makes a kernel RDS/IB connection, so the unload is safe), waits until
the link's rxe device (``$PYRDS_RXE``, made by ``vm/guest.py``) has a GID for this guest's address, then
becomes :mod:`pyrds.testing.peeragent` with a fresh token in ``$PYRDS_VM_RESULTS/peer-token``. The userspace
stack it starts for its first socket finds the rxe device and listens on 18634 of the link address.
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
    if not (rxe and local and results):
        print("vm.ib_peer: needs the two-guests topology (PYRDS_RXE, PYRDS_LOCAL_ADDR)", file=sys.stderr)
        return 2
    res = subprocess.run(["modprobe", "-r", "rds_rdma"], capture_output=True, text=True, check=False)
    if res.returncode or os.path.isdir("/sys/module/rds_rdma"):
        print(f"vm.ib_peer: rds_rdma stays loaded: {res.stderr.strip()}", file=sys.stderr)
        return 1
    want = ipaddress.IPv6Address(f"::ffff:{local}").packed
    deadline = time.monotonic() + GID_WAIT_S
    while want not in _gids(rxe):
        if time.monotonic() > deadline:
            print(f"vm.ib_peer: {rxe} has no GID for {local}", file=sys.stderr)
            return 1
        time.sleep(0.1)
    token_file = os.path.join(results, "peer-token")
    with_token = [sys.executable, "-m", "pyrds.testing.peeragent", "--token-file", token_file]
    sys.stderr.flush()
    os.execv(sys.executable, with_token)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
