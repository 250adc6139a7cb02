"""Two RDS nodes in two network namespaces joined by a veth pair, each driven through an :class:`Agent`.

Node A gets 10.<100+w>.<k>.1 / fd00:<100+w>:<k>::1 (:func:`pair_addresses`; w is the xdist worker: pairs
alive at once never share an address) -- the numerically smaller address: it owns the RDS/TCP connection and
is the side that dials and reconnects -- and node B gets .2 / ::2.

Mixed kernel/userspace nodes: once ``rds_tcp`` is loaded the kernel listens on 16385 in EVERY namespace, so a
userspace node cannot listen there. Its agent (and thus the stack service it starts) gets
``PYRDS_TCP_PORT=16386`` and its namespace gets an nftables rule ``tcp dport 16385 redirect to :16386``,
so peers
(kernel or userspace) that dial the standard port reach the userspace stack. Without ``rds_tcp`` loaded (host
runs) the userspace node listens on 16385 directly and no rule is installed.

Built with :mod:`pyrds.netns` (pyroute2 rtnetlink: namespaces, veth, addresses, links, netem qdiscs); agents
and ``nft`` are spawned from a thread that ``setns``-ed into the node's namespace (no ``ip netns exec``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyrds import netns
from pyrds.constants import RDS_TCP_PORT
from pyrds.testing.agent import Agent, RemoteSocket
from pyrds.testing.kernelinfo import before_fix_series

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


def netns_supported() -> str | None:
    """None when namespaces can be made here, else the reason why not."""
    if os.geteuid() != 0:
        return "two-node scenarios need root (network namespaces)"
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "pyroute2 is missing (pip install pyroute2)"
    return None


class NetemUnavailable(RuntimeError):
    """The kernel lacks sch_netem."""


_NETEM_FIELDS = {
    "loss": "loss_pct",
    "corrupt": "corrupt_pct",
    "duplicate": "duplicate_pct",
    "reorder": "reorder_pct",
    "delay": "delay_ms",
    "limit": "limit",
}


def parse_netem(spec: str) -> netns.Netem:
    """``"loss 5% corrupt 5% duplicate 5%"`` (tc-netem(8) words; delay in ms, optional jitter) -> Netem."""
    words = spec.split()
    kw: dict[str, Any] = {}
    i = 0
    while i < len(words):
        key = words[i]
        if key not in _NETEM_FIELDS or i + 1 >= len(words):
            raise ValueError(f"unsupported netem spec {spec!r} at {key!r}")
        value = words[i + 1]
        i += 2
        if key == "limit":
            kw["limit"] = int(value)
            continue
        num = float(re.sub(r"(%|ms)$", "", value))
        kw[_NETEM_FIELDS[key]] = num
        if key == "delay" and i < len(words) and words[i].endswith("ms"):  # delay 10ms 2ms: jitter
            kw["jitter_ms"] = float(words[i][:-2])
            i += 1
    return netns.Netem(**kw)


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
        """Run a command inside the node's namespace (spawned from a setns-ed thread)."""
        return netns.run_cmd_in_netns(self.netns, argv, check=check)

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


#: nstat counters that say why a TCP flow stopped moving (segments rejected, dropped, or given up on)
_TCP_TROUBLE = re.compile(
    r"^TcpExt(PAWS\w*|TCPACKSkipped\w*|TCPBacklogDrop|TCPZeroWindowDrop|TCPRcvQDrop|"
    r"TCPTimeouts|TCPAbortOn\w*|TCPChallengeACK|TCPOFODrop|TCPMinTTLDrop|TCPSpuriousRtxHostQueues)\s+(\d+)"
)


def worker_index() -> int:
    """This process's pytest-xdist worker number (``gw3`` -> 3); outside xdist a number from the pid, so that
    separate runs on one kernel are unlikely to meet (the xdist workers of one run never do)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        return int(worker[2:])
    return 50 + os.getpid() % 50


def pair_addresses(worker: int, k: int) -> list[tuple[str, str]]:
    """Node A's and node B's (IPv4, IPv6) addresses of the ``k``-th pair made by ``worker``: the /24
    10.<100 + worker>.<k>.0 and the /64 fd00:<100 + worker>:<k>::, A on .1/::1, B on .2/::2.

    Pairs that live at the same time must never share an address, not even in different namespaces: the
    kernel keeps one congestion map per address for the whole host (cong.c's rds_cong_tree), the local map of
    a node and the copy another namespace holds of a peer with that address being one object, and binds
    in one table for every namespace. With two xdist workers on one subnet, a map message of one pair can
    overwrite the other pair's local map (a congested bit its receiver never clears again). Suspected, not
    shown, as the cause of a userspace->kernel stall on ENOBUFS in a 7.3 CI run (2026-11-28): 78 selftest
    rounds with every pair forced onto one subnet, two workers, passed. A worker reuses a
    subnet only after 256 pairs, long after the old pair's namespaces are gone. (10.99.0.0/16 stays the
    IB fabric's and the inter-guest link's.)"""
    second = 100 + worker % 100
    third = k % 256
    return [(f"10.{second}.{third}.{i}", f"fd00:{second}:{third}::{i}") for i in (1, 2)]


def scratch_address(worker: int) -> str:
    """An address of ``worker`` for single-node scenarios (e.g. two namespaces on one address): 10.<200 +
    worker % 50>.0.2, away from every pair's (:func:`pair_addresses`) and every other worker's."""
    return f"10.{200 + worker % 50}.0.2"


def userspace_port_env(backend: str) -> dict[str, str]:
    """The agent environment a node of ``backend`` needs: a userspace stack listens on USERSPACE_ALT_PORT
    where the kernel's rds_tcp, once loaded, holds 16385 in every namespace."""
    if backend == "userspace" and kernel_rds_tcp_loaded():
        return {"PYRDS_TCP_PORT": str(USERSPACE_ALT_PORT)}
    return {}


def redirect_standard_port(ns: str, env: dict[str, str]) -> int:
    """The port a node with agent environment ``env`` (:func:`userspace_port_env`) listens on; when that is
    not the standard one, namespace ``ns`` gets the nftables rule that sends peers dialing 16385 there."""
    port = int(env.get("PYRDS_TCP_PORT", RDS_TCP_PORT))
    if port != RDS_TCP_PORT:
        rules = NFT_REDIRECT.format(std=RDS_TCP_PORT, alt=port)
        nft = netns.run_cmd_in_netns(ns, ["nft", "-f", "-"], input=rules, check=False)
        if nft.returncode != 0:
            raise RuntimeError(f"nft redirect in {ns} failed: {nft.stderr.strip()}")
    return port


def tcp_trouble(nstat_output: str) -> dict[str, int]:
    """The non-zero :data:`_TCP_TROUBLE` counters of ``nstat -asz`` output."""
    found: dict[str, int] = {}
    for line in nstat_output.splitlines():
        m = _TCP_TROUBLE.match(line)
        if m and int(m.group(2)):
            found[m.group(1)] = int(m.group(2))
    return found


class TwoNodes:
    """Node A and node B; build with :meth:`create`, always :meth:`destroy`."""

    def __init__(self, a: Node, b: Node, tag: str) -> None:
        self.a = a
        self.b = b
        self.tag = tag
        #: a test recorded a known pre-7.0 kernel race here (KernelRace.record): the kernel's RDS/TCP state
        #: in these namespaces may be left wedged, so the next test gets fresh ones (plugin: rds_two_nodes)
        self.suspect = False

    @property
    def nodes(self) -> tuple[Node, Node]:
        return (self.a, self.b)

    @property
    def label(self) -> str:
        return f"{self.a.backend}-{self.b.backend}"

    @classmethod
    def create(cls, backends: Sequence[str]) -> TwoNodes:
        k = next(_counter)
        tag = f"{os.getpid() % 100000}x{k}"
        names = [f"rdsA{tag}", f"rdsB{tag}"]
        ifs = ["vethA", "vethB"]
        addrs = pair_addresses(worker_index(), k)
        created: list[str] = []
        agents: list[Agent] = []
        try:
            for ns in names:
                netns.create_netns(ns)
                created.append(ns)
            netns.create_veth(
                names[0],
                names[1],
                ifs[0],
                ifs[1],
                addrs_a=[f"{addrs[0][0]}/24", f"{addrs[0][1]}/64"],
                addrs_b=[f"{addrs[1][0]}/24", f"{addrs[1][1]}/64"],
            )
            envs: list[dict[str, str]] = []
            ports: list[int] = []
            for ns, backend in zip(names, backends, strict=True):
                env = userspace_port_env(backend)
                envs.append(env)
                ports.append(redirect_standard_port(ns, env))
            # start both agents at once (each is a Python start-up: seconds under QEMU TCG)
            with ThreadPoolExecutor(2) as pool:
                futures = [
                    pool.submit(Agent, ns, env=env, name=f"{'AB'[i]}:{backend}")
                    for i, (ns, env, backend) in enumerate(zip(names, envs, backends, strict=True))
                ]
                for fut in futures:
                    with contextlib.suppress(BaseException):
                        agents.append(fut.result())
                if len(agents) != len(futures):
                    for fut in futures:
                        fut.result()  # re-raise the failure
            nodes = [
                Node("AB"[i], ns, ifname, backend, a4, a6, agent, port)
                for i, (ns, ifname, backend, (a4, a6), agent, port) in enumerate(
                    zip(names, ifs, backends, addrs, agents, ports, strict=True)
                )
            ]
            for n in nodes:
                _wait_link_up(n)
            return cls(nodes[0], nodes[1], tag)
        except BaseException:
            for agent in agents:
                agent.close()
            for ns in created:
                delete_node_netns(ns)
            raise

    def netem(self, spec: str) -> None:
        """Apply a root netem qdisc ``spec`` on both veth ends (e.g. ``loss 5% corrupt 5% duplicate 5%``),
        through pyroute2's tc; :class:`NetemUnavailable` when the kernel has no sch_netem."""
        impair = parse_netem(spec)
        for n in self.nodes:
            try:
                netns.set_netem(n.netns, n.ifname, impair)
            except netns.NetemMissingError as exc:
                raise NetemUnavailable(str(exc)) from exc

    def clear_netem(self) -> None:
        for n in self.nodes:
            with contextlib.suppress(netns.NetnsError):
                netns.clear_netem(n.netns, n.ifname)

    def bound_pair(self) -> tuple[RemoteSocket, RemoteSocket]:
        """A socket on each node bound to its IPv4 address (port chosen by the stack), with the A->B
        connection brought up first by a delivered "hello" (B then has a 30 s timeout).

        The hello goes between a separate pair of warm-up sockets, closed before the pair is made. With a
        kernel node before 7.0 it is sent again every 10 s for up to 60 s, as rds-ping does: there the first
        message on a fresh RDS/TCP connection can sit unread (the accept path's "kick-start the receiver" fix
        is 7.0) or be discarded (rds_tcp_accept_one), and a second message gets the connection read. A late
        copy lands on a closed port, never in the scenario's sockets. Elsewhere one hello must arrive within
        30 s (a kernel with the fixes, or a userspace node, that needs more is a failure)."""
        retry = any(n.backend == "kernel" for n in self.nodes) and before_fix_series()
        wa, wb = self.a.socket(), self.b.socket()
        try:
            wa.bind((self.a.addr4, 0))
            wb.bind((self.b.addr4, 0))
            wb.settimeout(10 if retry else 30)
            for attempt in range(1, (6 if retry else 1) + 1):
                wa.sendto(b"hello", wb.getsockname())
                try:
                    data = wb.recv(10)
                except TimeoutError:
                    continue
                if data != b"hello":
                    raise AssertionError(f"the first message A->B did not arrive intact: {data!r}")
                if attempt > 1:
                    print(f"bound_pair: the first A->B message came after {attempt} hellos (pre-7.0 kernel)")
                break
            else:
                raise AssertionError(f"the first message A->B did not arrive ({attempt} hellos)")
        finally:
            wa.close()
            wb.close()
        a, b = self.a.socket(), self.b.socket()
        a.bind((self.a.addr4, 0))
        b.bind((self.b.addr4, 0))
        b.settimeout(30)
        return a, b

    def report_failure(
        self, exc: BaseException, a_finished: bool, job_b: Any, socks: Sequence[RemoteSocket]
    ) -> None:
        """A two-node job failed: print which node's job (``a_finished``: A's ended, so B's raised
        ``exc``), how B's job ended when A's was the one that failed (its result or its own error, e.g. its
        stall message with what it sent and received), then :meth:`dump_state`. Never raises."""
        print(f"{'B' if a_finished else 'A'}: {type(exc).__name__}: {exc}")
        if not a_finished:
            node = self.nodes[1]
            try:
                print(f"{node.backend} {node.addr4}: {node.agent.wait(job_b, 60.0)}")
            except Exception as other:  # the diagnostic must not replace the test's own error
                print(f"{node.backend} {node.addr4}: {type(other).__name__}: {other}")
        self.dump_state(socks)

    def dump_state(self, socks: Sequence[RemoteSocket]) -> None:
        """Print what each node's RDS/TCP looks like (``ss -tni``, RDS_INFO connections, TCP sockets, non-zero
        counters, send/retransmit queue lengths) to the test's log: called when a transfer stalled, so the
        log says where it stopped. ``socks``: one socket per node, A's first. Never raises."""
        from pyrds.constants import InfoType
        from pyrds.testing.diagnose import print_rds_state

        for node, sock in zip(self.nodes, socks, strict=False):
            print(f"--- node {node.backend} {node.addr4}")
            try:
                # RDS/TCP's own connections only (not the readiness pairs on 127.0.0.1), with their timers
                # (-o: a retransmission backoff or keepalive) and memory (-m: a full receive buffer)
                # (a node whose stack listens on another port still dials the peer's RDS_TCP_PORT)
                ports = sorted({node.tcp_port, RDS_TCP_PORT})
                rds_tcp = "( " + " or ".join(f"sport = :{p} or dport = :{p}" for p in ports) + " )"
                print(node.sh("ss", "-tnimoa", rds_tcp, check=False).stdout)
                print(
                    "  TCP drops and timeouts (nstat):",
                    tcp_trouble(node.sh("nstat", "-asz", check=False).stdout),
                )
            except Exception as exc:  # a diagnostic must not replace the test's own error
                print(f"  (ss/nstat failed: {type(exc).__name__}: {exc})")
            tables = (InfoType.RDS_INFO_CONNECTIONS, InfoType.RDS_INFO_TCP_SOCKETS)
            print_rds_state(sock, node.backend, tables)
        self.print_congestion_views(socks)

    def print_congestion_views(self, socks: Sequence[RemoteSocket]) -> None:
        """Which node sees which test socket's port as congested, told by a fresh non-blocking probe socket
        on each node sending 0 bytes to each test socket. To its own node's socket the probe goes over the
        loop connection, whose map is the address's own live map (rds_cong_get_maps: laddr == faddr); to
        the other node's it goes over RDS/TCP and reads this node's copy of the peer's map. So a stalled
        sender on ENOBUFS with its peer's own map clear holds a stale copy; with the peer's own map set the
        peer itself still counts the port as congested. Never raises."""
        for node in self.nodes:
            for dest_node, dest in zip(self.nodes, socks, strict=False):
                try:
                    daddr = dest.getsockname()
                    probe = node.socket()
                    try:
                        probe.bind((node.addr4, 0))
                        probe.setblocking(False)
                        probe.sendto(b"", daddr)
                        seen = "clear (sent)"
                    except OSError as exc:
                        seen = "congested (ENOBUFS)" if exc.errno == errno.ENOBUFS else f"errno {exc.errno}"
                    finally:
                        probe.close()
                    whose = "its own map" if dest_node is node else "its copy of the peer's map"
                    print(f"  congestion probe {node.backend} {node.addr4} -> {daddr} ({whose}): {seen}")
                except Exception as exc:  # noqa: BLE001 - a diagnostic must not replace the test's own error
                    print(f"  (congestion probe failed: {type(exc).__name__}: {exc})")

    def healthy(self) -> bool:
        """False once an agent's request stream was interrupted (a test timeout) or its process died, or a
        test met a known kernel race here (:attr:`suspect`)."""
        agents_ok = all(n.agent.broken is None and n.agent.proc.poll() is None for n in self.nodes)
        return agents_ok and not self.suspect

    def rebuild(self) -> None:
        """Replace both namespaces and agents with fresh ones (same backends), in place."""
        backends = [n.backend for n in self.nodes]
        self.destroy()
        fresh = TwoNodes.create(backends)
        self.__dict__.update(fresh.__dict__)

    def destroy(self) -> None:
        for n in self.nodes:
            if n.agent.broken is None:
                with contextlib.suppress(Exception):
                    n.close_sockets()
            n.agent.close()
        for n in self.nodes:
            delete_node_netns(n.netns)


def _wait_link_up(node: Node, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if netns.link_is_up(node.netns, node.ifname):
            return
        time.sleep(0.05)
    raise RuntimeError(f"veth {node.ifname} in {node.netns} did not come up")


def delete_node_netns(ns: str) -> None:
    """Kill what still runs in the namespace (e.g. a userspace stack service our agent started), then
    delete it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in netns.netns_pids(ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if sig == signal.SIGTERM:
            time.sleep(0.05)
    with contextlib.suppress(netns.NetnsError):
        netns.delete_netns(ns)


def describe(nodes: TwoNodes) -> dict[str, Any]:
    return {"a": (nodes.a.backend, nodes.a.addr4), "b": (nodes.b.backend, nodes.b.addr4), "tag": nodes.tag}
