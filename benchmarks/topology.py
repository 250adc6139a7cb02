"""Guest-side topology for the benchmark: named netns pairs joined by veth, nftables redirect for mixed nodes.

Built with :mod:`pyrds.netns` (pyroute2 rtnetlink for namespaces, veth, addresses and links; processes are
spawned from a thread that ``setns``-ed into the namespace). Only ``nft`` is a command (pyroute2's nftables
support is not enough for a NAT redirect). Needs root; pyrds is imported lazily, so the host side of run.py
does not need it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# the kernel's rds_tcp listens on 16385 in every netns once loaded; userspace stacks use this port instead
USERSPACE_PORT = 16386
KERNEL_PORT = 16385


@dataclass
class Node:
    """One end: a namespace (None: this process's, where RDS/IB lives), its address, and the environment its
    processes get."""

    ns: str | None
    addr: str
    env: dict[str, str] = field(default_factory=dict)
    #: a node in another guest, reached only through this peer agent (:mod:`pyrds.testing.peeragent`): its
    #: passive side is an agent job (cells.PeerPassive); it cannot run commands
    agent: Any = None

    def popen(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``cmd`` inside the namespace with :attr:`env` added to ``kwargs['env']`` (or os.environ)."""
        from pyrds.netns import popen_in_netns

        kwargs["env"] = {**(kwargs.get("env") or os.environ), **self.env}
        if self.ns is None:
            return subprocess.Popen(list(cmd), **kwargs)
        return popen_in_netns(self.ns, cmd, **kwargs)


def make_pair(tag: str, subnet: str) -> tuple[Node, Node]:
    """Namespaces ``b-<tag>1``/``b-<tag>2`` with ``<subnet>.1``/``.2``/24 on a veth pair, lo up."""
    from pyrds import netns

    n1, n2 = f"b-{tag}1", f"b-{tag}2"
    for ns in (n1, n2):
        netns.delete_netns(ns)
        netns.create_netns(ns)
    netns.create_veth(n1, n2, f"v{tag}1", f"v{tag}2", addrs_a=[f"{subnet}.1/24"], addrs_b=[f"{subnet}.2/24"])
    return Node(n1, f"{subnet}.1"), Node(n2, f"{subnet}.2")


def userspace_node(node: Node, peer_port: int) -> None:
    """Make ``node`` a userspace RDS node: stack on USERSPACE_PORT, dialing peers on ``peer_port``; with a
    kernel peer (peer_port 16385), also redirect incoming 16385 to the stack so kernel dials reach it."""
    from pyrds.netns import run_cmd_in_netns

    node.env.update(
        {
            "PYRDS_TCP_PORT": str(USERSPACE_PORT),
            "PYRDS_TCP_PEER_PORT": str(peer_port),
            "PYRDS_IDLE_EXIT": "60",
            "PYRDS_STACK_LOG": f"/tmp/pyrds-stack-{node.ns}.log",
        }
    )
    rules = (
        "table ip pyrds_bench {\n"
        "  chain pre { type nat hook prerouting priority -100; "
        f"tcp dport {KERNEL_PORT} redirect to :{USERSPACE_PORT}; }}\n"
        "}\n"
    )
    run_cmd_in_netns(node.ns, ["nft", "-f", "-"], input=rules)


def teardown(nodes: Sequence[Node]) -> None:
    from pyrds import netns

    for n in nodes:
        if n.ns is None:
            continue
        for pid in netns.netns_pids(n.ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(netns.NetnsError):
            netns.delete_netns(n.ns)
