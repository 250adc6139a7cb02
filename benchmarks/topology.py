"""Guest-side topology for the benchmark: named netns pairs joined by veth, nftables redirect for mixed nodes.

Uses iproute2/nft commands (``ip netns exec`` works on the namespaces): needs root, nothing from PyPI.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

# the kernel's rds_tcp listens on 16385 in every netns once loaded; userspace stacks use this port instead
USERSPACE_PORT = 16386
KERNEL_PORT = 16385


def sh(*cmd: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, input=stdin)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


@dataclass
class Node:
    """One end: a namespace, its address, and the environment its processes get."""

    ns: str
    addr: str
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, cmd: Sequence[str]) -> list[str]:
        envs = [f"{k}={v}" for k, v in self.env.items()]
        return ["ip", "netns", "exec", self.ns, "env", *envs, *cmd]


def make_pair(tag: str, subnet: str) -> tuple[Node, Node]:
    """Namespaces ``b-<tag>1``/``b-<tag>2`` with ``<subnet>.1``/``.2``/24 on a veth pair, lo up."""
    n1, n2 = f"b-{tag}1", f"b-{tag}2"
    for ns in (n1, n2):
        sh("ip", "netns", "del", ns, check=False)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", f"v{tag}1", "netns", n1, "type", "veth", "peer", "name", f"v{tag}2", "netns", n2)
    for ns, ifn, host in ((n1, f"v{tag}1", 1), (n2, f"v{tag}2", 2)):
        sh("ip", "-n", ns, "addr", "add", f"{subnet}.{host}/24", "dev", ifn)
        sh("ip", "-n", ns, "link", "set", ifn, "up")
    return Node(n1, f"{subnet}.1"), Node(n2, f"{subnet}.2")


def userspace_node(node: Node, peer_port: int) -> None:
    """Make ``node`` a userspace RDS node: stack on USERSPACE_PORT, dialing peers on ``peer_port``; with a
    kernel peer (peer_port 16385), also redirect incoming 16385 to the stack so kernel dials reach it."""
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
    sh("ip", "netns", "exec", node.ns, "nft", "-f", "-", stdin=rules)


def teardown(nodes: Sequence[Node]) -> None:
    for n in nodes:
        pids = sh("ip", "netns", "pids", n.ns, check=False).stdout.split()
        for pid in pids:
            sh("kill", pid, check=False)
        sh("ip", "netns", "del", n.ns, check=False)
