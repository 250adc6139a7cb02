"""RDS/IB between two nodes of ONE machine, for the conformance scenarios of ``tests/conformance/test_ib.py``.

RDS/IB lives in the initial network namespace only (the kernel's rds_rdma and the userspace stack's
``Service.start_ib`` alike), so the two nodes are two IPv4 addresses of the initial namespace, both on one
dummy netdev with one rdma_rxe device (:class:`IbFabric`; two rxe devices on a veth pair in one namespace
end in ADDR_ERROR, docs/userspace.md). Each node is an :class:`~pyrds.testing.agent.Agent` in the initial
namespace: a kernel node's agent makes AF_RDS sockets, a userspace node's agent gets a stack service of its
own (``PYRDS_STACK_NAME``; started after the rxe device exists, so it attaches RDS/IB; never idle-exits;
stopped by :meth:`IbPair.destroy`). Every socket is pinned with ``SO_RDS_TRANSPORT=IB`` before it binds.

Node A is the one that sends first: the pairing ``A-B`` means A dials. Pairings one machine can host:

- ``kernel-kernel``: both ends in the guest kernel (rds_rdma connects to its own other address over rxe);
- ``userspace-kernel``: the kernel's rds_rdma listens on rdma_cm port 18634, so the userspace node is
  active-only (its stack logs it) and dials the kernel; the kernel answers on that connection;
- ``userspace-userspace``: both userspace stacks listen on 18634, which needs the port free, so rds_rdma is
  unloaded while the pairing lives (:data:`UNLOADS_RDS_RDMA`) and loaded again afterwards. It runs FIRST,
  and only while the kernel has no RDS/IB connection (:class:`UnsafeUnload` otherwise): on 7.3 (7.3.4) a
  ``modprobe -r rds_rdma`` after the other pairings, while the kernel still had its RDS/IB connections,
  panicked the guest (``rds_ib_recv_exit`` warned that ``rds_ib_incoming`` objects remained, then int3 in
  ``rds_shutdown_worker``: rds running the unloaded module's code). That order crashed both boots of 7.3 in
  a full matrix run and survived five others (the IB phase alone on 6.1, 6.12, 7.3; the full run on 6.1,
  6.12), 2026-11-27;
- ``kernel-userspace`` cannot run on one machine: the kernel would dial the userspace address on port 18634,
  where only its own rds_rdma listens (one machine, one rdma_cm port space), so it would connect to itself.
  In guest A of a ``python -m vm ... --peer-ib`` run (:func:`peer_link`) it runs across the two guests:
  node A is this guest's kernel on its link address (an rxe device made on the link, :data:`LINK_RXE`), node
  B guest B's userspace stack, driven through :class:`~pyrds.testing.peeragent.PeerAgent` (``vm/ib_peer.py``).
  Anywhere else the fixture reports it as a skip with the one-machine reason, never as a pass.

The scenarios need the initial namespace to themselves (an rxe device appearing would change what a
userspace stack started meanwhile attaches; rds_rdma is unloaded for a while), so they run in a phase of
their own: ``pytest --rds-ib`` (pyrds.testing.plugin), serially, after the main suite.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyrds import info
from pyrds.constants import SOL_RDS, InfoType, SockOpt, Transport
from pyrds.testing.agent import Agent, RemoteSocket

#: pairings in the order they run: userspace-userspace first (rds_rdma unloaded before the kernel ever had an
#: RDS/IB connection), then the others with rds_rdma loaded again (the plugin's IB_PAIRS, which must not
#: import this module at load time)
PAIRS = ("userspace-userspace", "kernel-kernel", "userspace-kernel", "kernel-userspace")
NETDEV = "pyrdsib0"
RXE = "pyrdsibrxe0"
#: node A's and node B's host numbers per pairing in the fabric's /24 (A < B). Each pairing has its own
#: addresses: the kernel keeps an RDS connection (and redials it after a drop) when the sockets and even the
#: peer are gone, so an address the kernel used in one pairing would still be its own in the next
HOSTS = {
    "kernel-kernel": (1, 2),
    "userspace-kernel": (3, 4),
    "kernel-userspace": (5, 6),
    "userspace-userspace": (7, 8),
}
#: the fabric's /24 is 10.98.N.0/24 for the first N no connection the kernel still lists touches: the same
#: reasoning across sessions (a second ``--rds-ib`` session in one boot), where the kernel still holds the
#: first session's connections and would take the new userspace node's address for the old peer
SUBNET_PREFIX = "10.98"
#: the IPv6 twin of :data:`SUBNET_PREFIX` (a unique-local /48; the session's /64 is its subnet number)
SUBNET6_PREFIX = "fd00:98"
NOT_COVERED = {
    "kernel-userspace": (
        "not covered on one machine: a kernel node dialling a userspace node over RDS/IB reaches rdma_cm "
        "port 18634, where only the kernel's own rds_rdma listens (the userspace node is active-only while "
        "rds_rdma is loaded), so the kernel would connect to itself; it needs two guests"
    )
}
#: pairings a second guest can host (``python -m vm ... --peer-ib``): node B is a
#: :class:`~pyrds.testing.peeragent.PeerAgent` in guest B (rds_rdma unloaded there, the userspace stack
#: listening on 18634 of its link address), node A the kernel of this guest on its link address
PEER_PAIRS = frozenset({"kernel-userspace"})
#: this guest's rxe device on the inter-guest link, made when a peer pairing first needs it
LINK_RXE = "pyrdslinkrxe0"
#: how long to wait for guest B's token file (its agent may start after this guest's suite)
PEER_TOKEN_WAIT = 120.0
#: the kernel->userspace hello across guests: attempts, and how long each waits for the message
PEER_HELLO_ATTEMPTS = 6
PEER_HELLO_WAIT = 15.0
#: pairings that need rdma_cm port 18634 free: rds_rdma is unloaded while they live
UNLOADS_RDS_RDMA = frozenset({"userspace-userspace"})


#: the IPv6 /64 of the inter-guest link (``vm``'s two-guests topology gives IPv4 only): each guest's IPv6
#: address is this prefix and its IPv4 address's last byte (:func:`link6`)
LINK6_PREFIX = "fd00:99::"


def link6(addr4: str) -> str:
    """The IPv6 link address of the guest whose IPv4 link address is ``addr4`` (10.99.0.2 -> fd00:99::2)."""
    return f"{LINK6_PREFIX}{int(ipaddress.IPv4Address(addr4).packed[-1]):x}"


def add_link6(netdev: str, addr4: str) -> str:
    """Give ``netdev`` its IPv6 link address (:func:`link6`, /64, no duplicate detection); returns it.
    ``ip addr replace``: a second IB session in the same boot finds the address there already."""
    addr6 = link6(addr4)
    _sh("ip", "-6", "addr", "replace", f"{addr6}/64", "dev", netdev, "nodad")
    return addr6


@dataclass(frozen=True)
class PeerLink:
    """The inter-guest link of the two-guests topology, as ``vm/guest.py`` describes it in the environment."""

    netdev: str  # this guest's link interface ($PYRDS_NETDEV)
    local: str  # this guest's address on it ($PYRDS_LOCAL_ADDR)
    peer: str  # guest B's ($PYRDS_PEER_ADDR)
    token_file: str  # where guest B's peer agent left its token (<results>/b/peer-token)


def peer_link(environ: Any = None) -> PeerLink | None:
    """The link to guest B when this is guest A of a two-guests run with a results directory, else None."""
    env = os.environ if environ is None else environ
    netdev, local, peer = env.get("PYRDS_NETDEV"), env.get("PYRDS_LOCAL_ADDR"), env.get("PYRDS_PEER_ADDR")
    results = env.get("PYRDS_VM_RESULTS")
    if env.get("PYRDS_ROLE") != "a" or not (netdev and local and peer and results):
        return None
    return PeerLink(netdev, local, peer, os.path.join(os.path.dirname(results), "b", "peer-token"))


def not_covered(pair: str, environ: Any = None) -> str | None:
    """Why ``pair`` cannot run here (its skip reason), or None. A :data:`PEER_PAIRS` pairing runs when this
    guest has a peer guest (:func:`peer_link`)."""
    if pair in PEER_PAIRS and peer_link(environ) is not None:
        return None
    return NOT_COVERED.get(pair)


#: socket buffers of every IB socket (a 1 MiB message needs rds_sk_sndbuf, i.e. SO_SNDBUF / 2, above it)
SOCK_BUF = 4 << 20
#: how long the first message of a pairing may take to arrive (connection setup under TCG)
HELLO_TIMEOUT = 60.0
#: how long a stack service may take to stop before it is killed
STOP_TIMEOUT = 30.0


class IbSetupError(RuntimeError):
    """The rxe fabric or a pairing could not be built (the command and its output are in the message)."""


class UnsafeUnload(IbSetupError):
    """rds_rdma would have to be unloaded while the kernel has RDS/IB connections (the pairing's skip)."""


def kernel_ib_connections() -> int:
    """How many RDS/IB connections the kernel lists (RDS6_INFO_IB_CONNECTIONS: IPv4 ones v4-mapped too)."""
    import pyrds

    s = pyrds.socket("kernel")
    try:
        return len(s.get_info(InfoType.RDS6_INFO_IB_CONNECTIONS))
    finally:
        s.close()


def kernel_rds_addresses() -> set[str]:
    """Every IPv4 address on either end of a connection the kernel lists (RDS_INFO_CONNECTIONS and
    RDS6_INFO_CONNECTIONS, v4-mapped ones as IPv4), TCP, IB and loop alike; empty without AF_RDS."""
    import pyrds

    try:
        s = pyrds.socket("kernel")
    except OSError:
        return set()
    found: set[str] = set()
    try:
        for table in (InfoType.RDS_INFO_CONNECTIONS, InfoType.RDS6_INFO_CONNECTIONS):
            with contextlib.suppress(OSError):
                for rec in s.get_info(table):
                    for a in (rec.laddr, rec.faddr):
                        ip = ipaddress.ip_address(a)
                        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                            ip = ip.ipv4_mapped
                        if isinstance(ip, ipaddress.IPv4Address):
                            found.add(str(ip))
    finally:
        s.close()
    return found


def pick_subnet(used: Iterable[str]) -> int:
    """The first N in 0..255 such that no address of ``used`` is in ``SUBNET_PREFIX.N.0/24``."""
    taken = set()
    for a in used:
        parts = a.split(".")
        if len(parts) == 4 and ".".join(parts[:2]) == SUBNET_PREFIX:
            taken.add(int(parts[2]))
    for n in range(256):
        if n not in taken:
            return n
    raise IbSetupError(f"every {SUBNET_PREFIX}.N.0/24 has an address the kernel still has a connection of")


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if check and res.returncode != 0:
        out = (res.stdout + res.stderr).strip()
        raise IbSetupError(f"{' '.join(argv)} exited {res.returncode}: {out}")
    return res


def ib_unavailable() -> str | None:
    """None when this machine can host the IB scenarios (root, rds_rdma loaded, rdma_rxe loadable), else
    why not (the skip reason: the host has no rxe)."""
    if os.geteuid() != 0:
        return "RDS/IB scenarios need root (an rxe device, module loading)"
    if not os.path.isdir("/sys/module/rds_rdma"):
        return "RDS/IB scenarios need the kernel's rds_rdma loaded (the guest of python -m vm loads it)"
    if not os.path.isdir("/sys/module/rdma_rxe") and _sh("modprobe", "rdma_rxe", check=False).returncode:
        return "RDS/IB scenarios need the rdma_rxe module (soft-RoCE), which this kernel does not have"
    return None


def v4_mapped(addr: str) -> bytes:
    """The 16-byte GID RoCE v2 gives an IPv4 address (``::ffff:a.b.c.d``)."""
    return ipaddress.IPv6Address(f"::ffff:{addr}").packed


def _gids(dev: str) -> set[bytes]:
    found: set[bytes] = set()
    base = f"/sys/class/infiniband/{dev}/ports/1/gids"
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            with contextlib.suppress(OSError, ValueError), open(os.path.join(base, name)) as f:
                found.add(ipaddress.IPv6Address(f.read().strip()).packed)
    return found


class IbFabric:
    """The dummy netdev with both node addresses and its rxe device; socket buffer limits raised to
    :data:`SOCK_BUF` (restored by :meth:`destroy`). Build with :meth:`create`, always :meth:`destroy`."""

    def __init__(self, subnet: int = 0) -> None:
        self.saved: dict[str, str] = {}
        self.subnet = subnet
        self.link_rxe_made = False

    def addrs(self, pair: str) -> tuple[str, str]:
        """Node A's and node B's addresses of ``pair`` on this fabric."""
        a, b = HOSTS[pair]
        return (f"{SUBNET_PREFIX}.{self.subnet}.{a}", f"{SUBNET_PREFIX}.{self.subnet}.{b}")

    def addrs6(self, pair: str) -> tuple[str, str]:
        """Node A's and node B's IPv6 addresses of ``pair`` (``SUBNET6_PREFIX:N::host``, a /64 per session as
        the IPv4 /24)."""
        a, b = HOSTS[pair]
        return (f"{SUBNET6_PREFIX}:{self.subnet:x}::{a:x}", f"{SUBNET6_PREFIX}:{self.subnet:x}::{b:x}")

    @classmethod
    def create(cls, timeout: float = 60.0) -> IbFabric:
        fabric = cls(pick_subnet(kernel_rds_addresses()))
        try:
            _sh("modprobe", "dummy", check=False)  # autoloaded by `ip link add` too; absent: that fails
            _sh("ip", "link", "add", NETDEV, "type", "dummy")
            covered = [pair for pair in PAIRS if pair not in NOT_COVERED]
            every = [addr for pair in covered for addr in fabric.addrs(pair)]
            every6 = [addr for pair in covered for addr in fabric.addrs6(pair)]
            for addr in every:
                _sh("ip", "addr", "add", f"{addr}/24", "dev", NETDEV)
            for addr in every6:  # nodad: usable (and a GID) at once, no duplicate detection on a dummy
                _sh("ip", "-6", "addr", "add", f"{addr}/64", "dev", NETDEV, "nodad")
            _sh("ip", "link", "set", NETDEV, "up")
            _sh("rdma", "link", "add", RXE, "type", "rxe", "netdev", NETDEV)
            # the GID table is filled asynchronously from the netdev's addresses: wait for all of them (RoCE
            # v2: an IPv4 address as its v4-mapped GID, an IPv6 one as itself)
            want = {v4_mapped(addr) for addr in every} | {ipaddress.IPv6Address(a).packed for a in every6}
            deadline = time.monotonic() + timeout
            while not want <= _gids(RXE):
                if time.monotonic() > deadline:
                    raise IbSetupError(f"{RXE}: not every address of {every} has a GID after {timeout:g} s")
                time.sleep(0.1)
            for name in ("wmem_max", "rmem_max"):
                path = f"/proc/sys/net/core/{name}"
                with open(path) as f:
                    fabric.saved[path] = f.read()
                with open(path, "w") as f:
                    f.write(f"{SOCK_BUF}\n")
        except BaseException:
            fabric.destroy()
            raise
        return fabric

    def link_rxe(self, link: PeerLink, timeout: float = 60.0) -> None:
        """An rxe device on the inter-guest link (once; removed by :meth:`destroy`), with a GID for this
        guest's link address."""
        if not self.link_rxe_made:
            add_link6(link.netdev, link.local)
            _sh("rdma", "link", "add", LINK_RXE, "type", "rxe", "netdev", link.netdev)
            self.link_rxe_made = True
        want = {v4_mapped(link.local), ipaddress.IPv6Address(link6(link.local)).packed}
        deadline = time.monotonic() + timeout
        while not want <= _gids(LINK_RXE):
            if time.monotonic() > deadline:
                missing = f"{link.local} and {link6(link.local)}"
                raise IbSetupError(f"{LINK_RXE}: no GIDs for {missing} after {timeout:g} s")
            time.sleep(0.1)

    def destroy(self) -> None:
        for path, value in self.saved.items():
            with contextlib.suppress(OSError), open(path, "w") as f:
                f.write(value)
        self.saved.clear()
        if self.link_rxe_made:
            _sh("rdma", "link", "delete", LINK_RXE, check=False)
            self.link_rxe_made = False
        _sh("rdma", "link", "delete", RXE, check=False)
        _sh("ip", "link", "del", NETDEV, check=False)


# ------------------------------------------------------------------------------------------------ stacks


def _stack_call(name: str, op: int) -> Any:
    """One control request to the stack service serving ``name`` (root's, as this process is root); None
    when nothing serves it."""
    from pyrds.userspace.client.stackctl import WrongServer, stack_request

    try:
        return stack_request(name, 0, op)
    except WrongServer as exc:
        raise IbSetupError(f"{exc}, not root: not touched") from exc


def stop_stack(name: str) -> None:
    """Stop the stack service serving ``name`` and wait until its process is gone (SIGKILL after
    :data:`STOP_TIMEOUT`). Nothing when none serves it."""
    from pyrds.userspace import rpc

    status = _stack_call(name, rpc.Op.STATUS)
    if not isinstance(status, dict) or not isinstance(status.get("pid"), int):
        return
    pid: int = status["pid"]
    with contextlib.suppress(OSError, EOFError):
        _stack_call(name, rpc.Op.STOP)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + STOP_TIMEOUT
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# ------------------------------------------------------------------------------------------------ nodes


@dataclass
class IbNode:
    name: str  # "A" / "B"
    backend: str
    addr: str
    agent: Agent
    addr6: str = ""  # the node's IPv6 address on the fabric
    stack: str | None = None  # the userspace node's PYRDS_STACK_NAME
    log: str | None = None  # its stack service's log file
    sockets: list[RemoteSocket] = field(default_factory=list)
    #: what the agent's environment adds (userspace: PYRDS_STACK_NAME ...): another process given it uses this
    #: node's stack (benchmarks/ib_section.py runs ``pyrds stress`` that way)
    env: dict[str, str] = field(default_factory=dict)

    def socket(self) -> RemoteSocket:
        """A socket pinned to RDS/IB, with :data:`SOCK_BUF` send and receive buffers, not bound."""
        s = self.agent.socket(self.backend)
        self.sockets.append(s)
        s.setsockopt(SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(Transport.IB))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCK_BUF)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCK_BUF)
        return s

    def bound(self, timeout: float = HELLO_TIMEOUT) -> RemoteSocket:
        s = self.socket()
        s.bind((self.addr, 0))
        s.settimeout(timeout)
        return s

    def bound6(self, timeout: float = HELLO_TIMEOUT) -> RemoteSocket:
        """A socket pinned to RDS/IB bound to the node's IPv6 address (the kernel: rdma_cm port 16385)."""
        s = self.socket()
        s.bind((self.addr6, 0, 0, 0))
        s.settimeout(timeout)
        return s

    def close_sockets(self) -> None:
        with contextlib.suppress(Exception):
            self.agent.request("close_all")
        self.sockets.clear()

    def service_log(self) -> str:
        if not self.log:
            return ""
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-4000:]
        except OSError as exc:
            return f"(no service log: {exc})"


class IbPair:
    """Node A and node B of one pairing over the fabric; :meth:`create`, then always :meth:`destroy`."""

    def __init__(self, a: IbNode, b: IbNode, unloaded_rds_rdma: bool, fabric: IbFabric | None = None) -> None:
        self.a, self.b = a, b
        self.unloaded_rds_rdma = unloaded_rds_rdma
        self._fabric = fabric
        self._across: IbPair | None = None

    @property
    def nodes(self) -> tuple[IbNode, IbNode]:
        return (self.a, self.b)

    @property
    def label(self) -> str:
        return f"{self.a.backend}-{self.b.backend}"

    @classmethod
    def create(cls, pair: str, fabric: IbFabric) -> IbPair:
        """Start both agents (userspace: with a stack of its own) and bring the A->B connection up with a
        message each way. ``pair`` must be one of :data:`PAIRS` outside :data:`NOT_COVERED`."""
        if pair not in PAIRS or not_covered(pair):
            raise ValueError(f"not a pairing this machine can host: {pair!r}")
        if pair in PEER_PAIRS:
            return cls._create_with_peer(pair, fabric)
        backends = pair.split("-")
        unload = pair in UNLOADS_RDS_RDMA
        if unload:
            held = kernel_ib_connections()
            if held:
                raise UnsafeUnload(
                    f"{pair} needs rds_rdma unloaded, but the kernel has {held} RDS/IB connection(s): "
                    "unloading it then is not safe (7.3.4 panicked in rds_shutdown_worker); this pairing "
                    "runs first"
                )
            _sh("modprobe", "-r", "rds_rdma")
            if os.path.isdir("/sys/module/rds_rdma"):
                raise IbSetupError("modprobe -r rds_rdma returned 0 but the module is still loaded")
        nodes: list[IbNode] = []
        try:
            tag = uuid.uuid4().hex[:8]
            specs: list[tuple[str, str, str, dict[str, str]]] = []
            addrs6 = dict(zip("AB", fabric.addrs6(pair), strict=True))
            for name, backend, addr in zip("AB", backends, fabric.addrs(pair), strict=True):
                env: dict[str, str] = {}
                if backend == "userspace":
                    stack = f"pyrds-ib-{name}-{tag}"
                    env = {
                        "PYRDS_STACK_NAME": stack,
                        "PYRDS_STACK_LOG": f"/tmp/{stack}.log",
                        "PYRDS_LOG": "INFO",
                        "PYRDS_IDLE_EXIT": "-1",
                    }
                specs.append((name, backend, addr, env))
            with ThreadPoolExecutor(2) as pool:
                futures = [
                    pool.submit(Agent, None, env=env, name=f"{name}:{backend}:ib")
                    for name, backend, _addr, env in specs
                ]
                agents: list[Agent | BaseException] = []
                for fut in futures:
                    try:
                        agents.append(fut.result())
                    except BaseException as exc:  # noqa: BLE001 - the other agent is closed below
                        agents.append(exc)
            for (name, backend, addr, env), agent in zip(specs, agents, strict=True):
                if isinstance(agent, Agent):
                    stack_name = env.get("PYRDS_STACK_NAME")
                    log = env.get("PYRDS_STACK_LOG")
                    nodes.append(
                        IbNode(name, backend, addr, agent, addrs6[name], stack_name, log, env=dict(env))
                    )
            for agent in agents:
                if isinstance(agent, BaseException):
                    raise agent
            made = cls(nodes[0], nodes[1], unload, fabric)
            made.hello()
            return made
        except BaseException:
            _teardown(nodes, unload)
            raise

    @classmethod
    def _create_with_peer(cls, pair: str, fabric: IbFabric, peer_node: str = "B") -> IbPair:
        """One node here (the kernel, on this guest's link address over :data:`LINK_RXE`), the other the peer
        guest's agent (the userspace stack on guest B's link address): node B by default (kernel-userspace),
        node A for :meth:`across_guests` (userspace-kernel)."""
        from pyrds.testing.peeragent import PORT, PeerAgent, read_token_file

        link = peer_link()
        assert link is not None
        fabric.link_rxe(link)
        deadline = time.monotonic() + PEER_TOKEN_WAIT
        while not os.path.exists(link.token_file):
            if time.monotonic() > deadline:
                raise IbSetupError(f"guest B's peer agent left no token in {link.token_file}")
            time.sleep(0.5)
        nodes: list[IbNode] = []
        try:
            for name, backend in zip("AB", pair.split("-"), strict=True):
                if name == peer_node:
                    agent: Any = PeerAgent(
                        link.peer, PORT, read_token_file(link.token_file), name=f"{name}:{backend}:peer"
                    )
                    nodes.append(IbNode(name, backend, link.peer, agent, link6(link.peer)))
                else:
                    agent = Agent(None, name=f"{name}:{backend}:ib")
                    nodes.append(IbNode(name, backend, link.local, agent, link6(link.local)))
            made = cls(nodes[0], nodes[1], False)
            made.hello(attempts=PEER_HELLO_ATTEMPTS)
            return made
        except BaseException:
            _teardown(nodes, False)
            raise

    def hello(self, attempts: int = 1) -> None:
        """A->B then B->A between warm-up sockets (closed afterwards): the connection is up before any
        scenario runs, and A (the node that may dial) made it. With ``attempts`` > 1 the A->B message is sent
        again after each :data:`PEER_HELLO_WAIT` s without it (between two guests the first message on a fresh
        connection was sometimes never delivered, vm/rds_echo.py), and the attempts used are printed."""
        wa, wb = self.a.bound(), self.b.bound()
        try:
            if attempts > 1:
                wb.settimeout(PEER_HELLO_WAIT)
            for attempt in range(1, attempts + 1):
                wa.sendto(b"hello", wb.getsockname())
                try:
                    data = wb.recv(64)
                    break
                except TimeoutError:
                    if attempt == attempts:
                        raise
            if attempts > 1:
                print(f"[ib] {self.label}: hello A->B arrived on attempt {attempt} of {attempts}")
            if data != b"hello":
                raise IbSetupError(f"{self.label}: the first message A->B arrived as {data!r}")
            wb.sendto(b"olleh", wa.getsockname())
            data = wa.recv(64)
            if data != b"olleh":
                raise IbSetupError(f"{self.label}: the first message B->A arrived as {data!r}")
        except (OSError, TimeoutError) as exc:
            raise IbSetupError(f"{self.label}: no hello exchange: {type(exc).__name__}: {exc}") from exc
        finally:
            wa.close()
            wb.close()
            self.a.sockets.clear()
            self.b.sockets.clear()

    def healthy(self) -> bool:
        return all(n.agent.broken is None and n.agent.proc.poll() is None for n in self.nodes)

    def dump_state(self, socks: Sequence[RemoteSocket]) -> None:
        """Print what each node's RDS/IB looks like (RDS_INFO connections and IB connections, non-zero
        counters, queue lengths; a userspace node's stack log tail) to the test's log, when a transfer failed
        or stalled. ``socks``: one socket per node, A's first. Never raises."""
        from pyrds.testing.diagnose import print_rds_state

        tables = (InfoType.RDS_INFO_CONNECTIONS, InfoType.RDS_INFO_IB_CONNECTIONS)
        for node, sock in zip(self.nodes, socks, strict=False):
            print(f"--- node {node.name} {node.backend} {node.addr}")
            print_rds_state(sock, node.backend, tables)
            if node.log:
                print(f"  stack log {node.log} (tail):\n{node.service_log()}")

    def close_sockets(self) -> None:
        """Every socket a test made on this pair's nodes and on :meth:`across_guests`'s."""
        for n in self.nodes + (self._across.nodes if self._across is not None else ()):
            n.close_sockets()

    def across_guests(self) -> IbPair | None:
        """userspace-kernel with node A the peer guest's userspace stack and node B this guest's kernel on
        its link address, made on first use and destroyed with this pair; None without a peer guest or for
        another pairing. For the scenarios that end in a remote access error: the kernel then redials node
        A's address, which on one machine reaches its own rds_rdma listener (test_ib_rdma.NO_ERRORS_ON)."""
        if self.label != "userspace-kernel" or peer_link() is None or self._fabric is None:
            return None
        if self._across is None:
            self._across = IbPair._create_with_peer(self.label, self._fabric, peer_node="A")
        return self._across

    def destroy(self) -> None:
        if self._across is not None:
            self._across.destroy()
            self._across = None
        _teardown(list(self.nodes), self.unloaded_rds_rdma)


def _teardown(nodes: Sequence[IbNode], reload_rds_rdma: bool) -> None:
    """Close the agents, stop the userspace nodes' stacks, and load rds_rdma again when it was unloaded.
    Never raises for a node; the reload's failure is raised (the guest's state would be wrong)."""
    for n in nodes:
        if n.agent.broken is None:
            n.close_sockets()
        with contextlib.suppress(Exception):
            n.agent.close()
        if n.stack:
            with contextlib.suppress(Exception):
                stop_stack(n.stack)
    if reload_rds_rdma and not os.path.isdir("/sys/module/rds_rdma"):
        _sh("modprobe", "rds_rdma")


# ------------------------------------------------------------------------------------------------ info


def info_table(socks: Sequence[Any], *, table: int) -> tuple[int | None, list[Any]]:
    """An agent job: one RDS_INFO table of ``socks[0]``'s backend as (record size, parsed rows). The record
    size is the kernel's ``getsockopt`` return value on a kernel socket, and the raw length over the row
    count on a userspace one (None when it has no rows)."""
    sock = socks[0]
    raw_of = getattr(sock, "get_info_raw", None)
    if raw_of is not None:
        each, raw = raw_of(table)
        size: int | None = int(each)
    else:
        got = sock.getsockopt(SOL_RDS, table, 1 << 20)
        raw = got if isinstance(got, bytes) else b""
        size = None
    rows = list(info.parse_info(InfoType(table), raw))
    if size is None and rows:
        size = len(raw) // len(rows) if len(raw) % len(rows) == 0 else -len(raw)
    return size, rows


def errno_name(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code, str(code)) if isinstance(code, int) else type(exc).__name__
