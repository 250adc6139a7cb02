"""Two RDS nodes in two network namespaces joined by a veth pair, each driven through an :class:`Agent`.

Node A gets 10.99.<k>.1 / fd00:99:<k>::1 (the numerically smaller address: it owns the RDS/TCP connection
and is
the side that dials and reconnects), node B gets .2 / ::2.

Mixed kernel/userspace nodes: once ``rds_tcp`` is loaded the kernel listens on 16385 in EVERY namespace, so a
userspace node cannot listen there. Its agent (and thus the stack service it starts) gets
``PYRDS_TCP_PORT=16386`` and its namespace gets an nftables rule ``tcp dport 16385 redirect to :16386``,
so peers
(kernel or userspace) that dial the standard port reach the userspace stack. Without ``rds_tcp`` loaded (host
runs) the userspace node listens on 16385 directly and no rule is installed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyrds.constants import RDS_TCP_PORT
from pyrds.testing.agent import Agent, RemoteSocket

USERSPACE_ALT_PORT = 16386
_counter = itertools.count()

NFT_REDIRECT = """table inet pyrds_redirect {{
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        tcp dport {std} redirect to :{alt}
    }}
}}
"""


def kernel_rds_tcp_loaded() -> bool:
    return os.path.isdir("/sys/module/rds_tcp")


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def netns_supported() -> str | None:
    """None when namespaces can be made here, else the reason why not."""
    if os.geteuid() != 0:
        return "two-node scenarios need root (network namespaces)"
    if _run("ip", "-V", check=False).returncode != 0:
        return "iproute2 'ip' is missing"
    return None


class NetemUnavailable(RuntimeError):
    """The kernel lacks sch_netem."""


@dataclass
class Node:
    name: str
    netns: str
    ifname: str
    backend: str
    addr4: str
    addr6: str
    agent: Agent
    tcp_port: int = RDS_TCP_PORT
    sockets: list[RemoteSocket] = field(default_factory=list)

    def socket(self) -> RemoteSocket:
        s = self.agent.socket(self.backend)
        self.sockets.append(s)
        return s

    def sh(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("ip", "netns", "exec", self.netns, *argv, check=check)

    def force_reconnect(self) -> None:
        """Drop every RDS/TCP connection of this node (the owner side reconnects and retransmits).

        kernel: write net.rds.tcp.rds_tcp_sndbuf in the node's namespace (rds_tcp_skbuf_handler resets all
        connections of the netns). userspace: the stack's equivalent knob, ``pyrds.userspace`` sysctl
        ``rds_tcp_sndbuf`` (see :func:`pyrds.testing.workloads.userspace_force_reconnect`).
        """
        if self.backend == "kernel":
            # any write resets the connections; 0 (the default, "auto") is refused on write (EINVAL)
            self.agent.request("write_file", "/proc/sys/net/rds/tcp/rds_tcp_sndbuf", "4194304\n")
        else:
            jid = self.agent.request("job", "pyrds.testing.workloads:userspace_force_reconnect", [], {})
            self.agent.wait(jid, 60)

    def close_sockets(self) -> None:
        with contextlib.suppress(Exception):
            self.agent.request("close_all")
        self.sockets.clear()


class TwoNodes:
    """Node A and node B; build with :meth:`create`, always :meth:`destroy`."""

    def __init__(self, a: Node, b: Node, tag: str) -> None:
        self.a = a
        self.b = b
        self.tag = tag

    @property
    def nodes(self) -> tuple[Node, Node]:
        return (self.a, self.b)

    @property
    def label(self) -> str:
        return f"{self.a.backend}-{self.b.backend}"

    @classmethod
    def create(cls, backends: Sequence[str]) -> TwoNodes:
        # iproute2 rather than pyrds.netns/pyroute2: importing pyroute2 takes over a minute under QEMU TCG
        k = next(_counter)
        tag = f"{os.getpid() % 100000}x{k}"
        subnet = (os.getpid() + k) % 200 + 20
        names = [f"rdsA{tag}", f"rdsB{tag}"]
        ifs = ["vethA", "vethB"]
        addrs = [(f"10.99.{subnet}.{i}", f"fd00:99:{subnet}::{i}") for i in (1, 2)]
        created: list[str] = []
        agents: list[Agent] = []
        try:
            for ns in names:
                _run("ip", "netns", "add", ns)
                created.append(ns)
            _run("ip", "-n", names[0], "link", "add", ifs[0], "type", "veth", "peer", "name", ifs[1],
                 "netns", names[1])
            nodes: list[Node] = []
            for i, (ns, ifname, backend) in enumerate(zip(names, ifs, backends, strict=True)):
                a4, a6 = addrs[i]
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _run("ip", "-n", ns, "addr", "add", f"{a4}/24", "dev", ifname)
                _run("ip", "-n", ns, "addr", "add", f"{a6}/64", "dev", ifname, "nodad")
                _run("ip", "-n", ns, "link", "set", ifname, "up")
                env: dict[str, str] = {}
                port = RDS_TCP_PORT
                if backend == "userspace" and kernel_rds_tcp_loaded():
                    port = USERSPACE_ALT_PORT
                    env["PYRDS_TCP_PORT"] = str(port)
                    nft = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], text=True,
                                         input=NFT_REDIRECT.format(std=RDS_TCP_PORT, alt=port),
                                         capture_output=True, timeout=60)
                    if nft.returncode != 0:
                        raise RuntimeError(f"nft redirect in {ns} failed: {nft.stderr.strip()}")
                agent = Agent(ns, env=env, name=f"{'AB'[i]}:{backend}")
                agents.append(agent)
                nodes.append(Node("AB"[i], ns, ifname, backend, a4, a6, agent, port))
            for n in nodes:
                _wait_link_up(n)
            return cls(nodes[0], nodes[1], tag)
        except BaseException:
            for agent in agents:
                agent.close()
            for ns in created:
                _delete_netns(ns)
            raise

    def netem(self, spec: str) -> None:
        """Apply ``tc qdisc ... netem <spec>`` on both veth ends (e.g. ``loss 5% corrupt 5% duplicate
        5%``)."""
        for n in self.nodes:
            res = n.sh("tc", "qdisc", "replace", "dev", n.ifname, "root", "netem", *spec.split(), check=False)
            if res.returncode != 0:
                if "unknown" in res.stderr.lower():
                    raise NetemUnavailable(f"kernel has no sch_netem: {res.stderr.strip()}")
                raise RuntimeError(f"tc netem on {n.ifname} in {n.netns} failed: {res.stderr.strip()}")

    def clear_netem(self) -> None:
        for n in self.nodes:
            n.sh("tc", "qdisc", "del", "dev", n.ifname, "root", check=False)

    def destroy(self) -> None:
        for n in self.nodes:
            n.close_sockets()
            n.agent.close()
        for n in self.nodes:
            _delete_netns(n.netns)


def _wait_link_up(node: Node, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = _run("ip", "-n", node.netns, "link", "show", node.ifname, check=False).stdout
        if "LOWER_UP" in out:
            return
        time.sleep(0.05)
    raise RuntimeError(f"veth {node.ifname} in {node.netns} did not come up")


def _delete_netns(ns: str) -> None:
    """Kill what still runs in the namespace (e.g. a userspace stack service our agent started), then
    delete it."""
    res = _run("ip", "netns", "pids", ns, check=False)
    for pid in res.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGTERM)
    time.sleep(0.05)
    res = _run("ip", "netns", "pids", ns, check=False)
    for pid in res.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _run("ip", "netns", "del", ns, check=False)


def describe(nodes: TwoNodes) -> dict[str, Any]:
    return {"a": (nodes.a.backend, nodes.a.addr4), "b": (nodes.b.backend, nodes.b.addr4), "tag": nodes.tag}
