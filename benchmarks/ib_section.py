"""Guest side of the RDS/IB rows (``run.py --guest --sections ib``): RDS over rdma_rxe, soft-RoCE on a dummy
netdev, the last section of a guest run (after the RDS/TCP sections when those are measured too).

RDS/IB lives in the initial network namespace only (the kernel's rds_rdma and the userspace stack alike), so
the two nodes of a pairing are two IPv4 addresses of one dummy netdev carrying one rxe device: the fabric and
the pairings are :mod:`pyrds.testing.ib`'s (:class:`~pyrds.testing.ib.IbFabric`,
:class:`~pyrds.testing.ib.IbPair`, as in the conformance IB phase; read its docstring). Each pairing's agents
stay up while its cells run (a userspace node's agent owns its stack service, which the ``pyrds stress``
processes of that node reach through the node's environment, ``PYRDS_STACK_NAME``); the pairing's hello
exchange has brought the A->B connection up before the first cell. Each cell is benchmarks/cells.py's, with
every socket of both sides pinned by ``pyrds stress --transport ib`` (SO_RDS_TRANSPORT=IB before bind).

Order (:func:`phases`): the pairings that need rds_rdma unloaded (userspace-userspace: both stacks listen on
rdma_cm port 18634) run first, each alone, before the kernel ever had an RDS/IB connection (unloading
rds_rdma after kernel RDS/IB connections panicked 7.3.4; :class:`~pyrds.testing.ib.UnsafeUnload` refuses
it); rds_rdma is loaded again when the pairing is destroyed. Then the other pairings together, their
scenarios alternating cell by cell as the RDS/TCP rows do. kernel->userspace runs only with a peer guest
(``vm run --peer-ib``; one machine cannot host it: the kernel would dial its own rds_rdma): this guest's
kernel on its link address, the userspace node in guest B, whose passive side is its peer agent's job
(cells.PeerPassive).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from cells import Scenario, measure_cells
from topology import Node

#: (label, active backend, passive backend, pyrds.testing.ib pairing); the first row is the baseline of the
#: section's ratios. The labels are the RDS/TCP rows' (same stress code, same roles).
IB_SCENARIOS: list[Scenario] = [
    ("kernel<->kernel (stdlib)", "stdlib", "stdlib", "kernel-kernel"),
    ("kernel<->kernel (pyrds.kernel)", "kernel", "kernel", "kernel-kernel"),
    ("userspace<->userspace", "userspace", "userspace", "userspace-userspace"),
    ("userspace->kernel", "userspace", "kernel", "userspace-kernel"),
    ("kernel->userspace", "kernel", "userspace", "kernel-userspace"),
]
#: the scenarios that need the peer guest (``vm run --peer-ib``): the kernel here, the userspace node there
PEER_SCENARIOS = frozenset({"kernel->userspace"})
#: the RDS ports of the passive servers, 10 a phase (the netns rows use 4001.. and 4101..)
PORT_BASE = 4301


def phases(scenarios: Sequence[Scenario], unloads: frozenset[str]) -> list[list[Scenario]]:
    """The scenarios grouped into what runs together, in order: each pairing of ``unloads`` alone first (its
    scenarios in their given order), then every other scenario together (their pairings live at once)."""
    first: dict[str, list[Scenario]] = {}
    rest: list[Scenario] = []
    for sc in scenarios:
        if sc[3] in unloads:
            first.setdefault(sc[3], []).append(sc)
        else:
            rest.append(sc)
    return [*first.values(), *([rest] if rest else [])]


def _node(ib_node: Any) -> Node:
    """The benchmark's view of one node of a pairing: this guest's (its processes get the node's
    environment), or the peer guest's, reached through its agent."""
    from pyrds.testing.peeragent import PeerAgent

    agent = getattr(ib_node, "agent", None)
    agent = agent if isinstance(agent, PeerAgent) else None
    return Node(None, ib_node.addr, dict(ib_node.env), agent=agent)


def available(scenarios: Sequence[Scenario]) -> tuple[list[Scenario], dict[str, str]]:
    """The scenarios this guest can run, and the others with why not: the two-guest ones need a peer guest
    (:func:`pyrds.testing.ib.peer_link`)."""
    from pyrds.testing import ib

    if ib.peer_link() is not None:
        return list(scenarios), {}
    why = "needs the peer guest (vm run --peer-ib)"
    skipped = {sc[0]: why for sc in scenarios if sc[0] in PEER_SCENARIOS}
    return [sc for sc in scenarios if sc[0] not in skipped], skipped


def _log(text: str) -> None:
    print(f"[bench] IB {text}", file=sys.stderr, flush=True)


def _failed(
    scenarios: Sequence[Scenario], modes: Sequence[str], sizes: Sequence[int], why: str
) -> list[dict[str, Any]]:
    cells = [(sc[0], m, z) for sc in scenarios for m in modes for z in sizes]
    return [{"scenario": label, "mode": m, "size": z, "error": why} for label, m, z in cells]


def measure(
    scenarios: Sequence[Scenario], modes: Sequence[str], sizes: Sequence[int], duration: float
) -> dict[str, Any]:
    """The IB section's rows (in ``scenarios`` order, then mode, then size) and how they were made: the
    fabric's subnet, each pairing's addresses or why it could not be built, the phases, and how many RDS/IB
    connections the kernel lists at the end (the kernel rows went over IB)."""
    from pyrds.testing import ib

    out: dict[str, Any] = {"rows": [], "pairs": {}, "error": None}
    order = {sc[0]: i for i, sc in enumerate(scenarios)}
    why = ib.ib_unavailable()  # root, rds_rdma loaded (so AF_RDS too), rdma_rxe
    if why:
        out.update(error=why, rows=_failed(scenarios, modes, sizes, why))
        return out
    groups = phases(scenarios, ib.UNLOADS_RDS_RDMA)
    out["phases"] = [sorted({sc[3] for sc in g}, key=ib.PAIRS.index) for g in groups]
    t0 = time.monotonic()
    try:
        fabric = ib.IbFabric.create()
    except Exception as exc:  # noqa: BLE001 - every row says why
        why = f"no rxe fabric: {exc}"
        out.update(error=why, rows=_failed(scenarios, modes, sizes, why))
        return out
    out["fabric"] = {"netdev": ib.NETDEV, "rxe": ib.RXE, "subnet": f"{ib.SUBNET_PREFIX}.{fabric.subnet}.0/24"}
    _log(f"fabric {ib.RXE} on {ib.NETDEV}, {out['fabric']['subnet']} ({time.monotonic() - t0:.0f} s)")
    rows: list[dict[str, Any]] = []
    fatal: str | None = None
    try:
        for i, group in enumerate(groups):
            if fatal:
                rows += _failed(group, modes, sizes, fatal)
                continue
            pairs: dict[str, Any] = {}
            broken: dict[str, str] = {}
            topo: dict[str, tuple[Node, Node]] = {}
            try:
                for pairing in dict.fromkeys(sc[3] for sc in group):
                    t0 = time.monotonic()
                    a_addr, b_addr = fabric.addrs(pairing)
                    out["pairs"][pairing] = {"a": a_addr, "b": b_addr, "error": None}
                    try:
                        pair = pairs[pairing] = ib.IbPair.create(pairing, fabric)
                    except Exception as exc:  # noqa: BLE001 - the pairing's rows say why
                        broken[pairing] = f"{pairing}: {type(exc).__name__}: {exc}"
                        out["pairs"][pairing]["error"] = broken[pairing]
                        _log(f"{pairing}: not built: {broken[pairing]}")
                        continue
                    # a peer guest's pairing runs on the link's addresses, not the fabric's
                    a_addr, b_addr = pair.a.addr, pair.b.addr
                    out["pairs"][pairing].update(a=a_addr, b=b_addr)
                    topo[pairing] = (_node(pair.a), _node(pair.b))
                    _log(f"{pairing}: {a_addr} -> {b_addr} up ({time.monotonic() - t0:.0f} s)")
                rows += measure_cells(
                    group,
                    topo,
                    modes,
                    sizes,
                    duration,
                    port_base=PORT_BASE + 10 * i,
                    transport="ib",
                    broken=broken,
                    tag="IB ",
                )
            finally:
                for pairing, pair in pairs.items():
                    try:
                        pair.destroy()  # a userspace-userspace pairing loads rds_rdma again here
                    except Exception as exc:  # noqa: BLE001 - the guest's state is wrong: no more pairings
                        fatal = f"after {pairing}: {type(exc).__name__}: {exc}"
                        _log(fatal)
        if any(sc[1] in ("stdlib", "kernel") for sc in scenarios):
            try:
                out["kernel_ib_connections"] = ib.kernel_ib_connections()
            except OSError as exc:
                out["kernel_ib_connections"] = f"unreadable: {exc}"
    finally:
        fabric.destroy()
    out["error"] = fatal
    rows.sort(key=lambda r: (order[r["scenario"]], list(modes).index(r["mode"]), r["size"]))
    out["rows"] = rows
    return out
