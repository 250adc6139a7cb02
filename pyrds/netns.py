"""Network-namespace helpers for tests: named netns, veth pairs, addresses, netem, rxe.

Everything netlink goes through pyroute2 (imported lazily, so importing this module has no side effects and
does not need pyroute2). Only ``rdma link add/delete`` is shelled out: pyroute2 has no RDMA netlink support.

No forking: pyroute2's ``netns.create()`` and ``NetNS(name)`` fork a child (with a 2 s reply timeout) to get
into the namespace; under QEMU TCG a fork of a big pytest process is slow and can miss that timeout. Here a
helper thread ``setns``/``unshare``s itself instead (CLONE_NEWNET is per thread), the rtnetlink socket is
opened in that thread, and subprocesses are spawned from it (a child inherits the namespace of the thread that
forks it).

Namespaces are "named" the iproute2 way (a bind mount under ``/run/netns/NAME``), so ``ip netns exec NAME``
sees them too. Needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN).

Typical use::

    with netns_pair(netem=Netem(loss_pct=5)) as pair:
        srv = run_in_netns(pair.ns_b, make_bound_socket, pair.addr4_b)
        ...
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import ipaddress
import itertools
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from pyroute2 import IPRoute

__all__ = [
    "NETNS_RUN_DIR",
    "NetnsError",
    "NetemMissingError",
    "Netem",
    "NetnsPair",
    "netns_path",
    "create_netns",
    "delete_netns",
    "list_netns",
    "netns_exists",
    "netns_pids",
    "ipr_for",
    "link_up",
    "link_is_up",
    "create_veth",
    "add_address",
    "set_netem",
    "clear_netem",
    "netem_available",
    "enter_netns",
    "run_in_netns",
    "popen_in_netns",
    "run_cmd_in_netns",
    "add_rxe",
    "delete_rxe",
    "unique_name",
    "netns_pair",
]

NETNS_RUN_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000
IFA_F_NODAD = 0x02
IFF_LOWER_UP = 0x10000
IFNAMSIZ_MAX = 15  # usable characters of an interface name

P = ParamSpec("P")
T = TypeVar("T")

_counter = itertools.count()
_libc: ctypes.CDLL | None = None
_netem_ok: bool | None = None


class NetnsError(RuntimeError):
    """A namespace/link operation failed (the message says which and why)."""


class NetemMissingError(NetnsError):
    """The kernel has no netem qdisc (sch_netem not built/loadable): the netlink request got ENOENT."""


# --------------------------------------------------------------------------------------------- namespaces


def netns_path(name: str) -> str:
    """Path of the bind-mounted namespace file (``/run/netns/NAME``)."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"invalid netns name: {name!r}")
    return os.path.join(NETNS_RUN_DIR, name)


def unique_name(prefix: str = "pyrds") -> str:
    """A namespace name unique to this process (safe under pytest-xdist)."""
    return f"{prefix}-{os.getpid()}-{next(_counter)}"


def list_netns() -> list[str]:
    """Names of the named namespaces (entries of /run/netns)."""
    try:
        return sorted(os.listdir(NETNS_RUN_DIR))
    except FileNotFoundError:
        return []


def netns_exists(name: str) -> bool:
    return os.path.exists(netns_path(name))


def create_netns(name: str, *, lo_up: bool = True) -> str:
    """Create the named namespace ``name`` (error if it exists) and bring its ``lo`` up."""
    from pyroute2 import netns as p2netns

    if netns_exists(name):
        raise NetnsError(f"netns {name!r} already exists")

    def make() -> None:  # on a helper thread: unshare moves only that thread
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _get_libc().unshare(CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
            try:
                # bind-mount this thread's new netns on /run/netns/NAME (what ``ip netns add`` does)
                p2netns.attach(name, "thread-self")
            finally:
                _setns_fd(home)
        finally:
            os.close(home)

    try:
        _on_thread(make)
    except OSError as exc:
        if exc.errno != errno.EEXIST:  # EEXIST: someone else just created ``name``; not ours to remove
            with contextlib.suppress(OSError):
                p2netns.remove(name)
        raise NetnsError(f"cannot create netns {name!r} (root needed?): {exc}") from exc
    if lo_up:
        link_up(name, "lo")
    return name


def delete_netns(name: str, *, missing_ok: bool = True) -> None:
    """Delete the named namespace; its interfaces (veth ends) go with it."""
    from pyroute2 import netns as p2netns

    if not netns_exists(name):
        if missing_ok:
            return
        raise NetnsError(f"netns {name!r} does not exist")
    try:
        p2netns.remove(name)
    except OSError as exc:
        raise NetnsError(f"cannot delete netns {name!r}: {exc}") from exc


def netns_pids(name: str) -> list[int]:
    """Pids of the processes whose network namespace is ``name`` (like ``ip netns pids``)."""
    try:
        st = os.stat(netns_path(name))
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ns = os.stat(f"/proc/{entry}/ns/net")
            except OSError:  # gone, or a kernel thread
                continue
            if (ns.st_dev, ns.st_ino) == (st.st_dev, st.st_ino):
                pids.append(int(entry))
    return pids


def ipr_for(name: str | None) -> IPRoute:
    """An rtnetlink handle in netns ``name`` (``None``: this namespace); use it as a context manager.

    The netlink socket is opened while this thread is in ``name`` (no fork, unlike pyroute2's ``NetNS``) and
    keeps talking to that namespace afterwards.
    """
    from pyroute2 import IPRoute

    if name is None:
        return IPRoute()
    if not netns_exists(name):
        raise NetnsError(f"netns {name!r} does not exist")
    with enter_netns(name):
        return IPRoute()


def _ifindex(ipr: IPRoute, ifname: str, where: str | None) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise NetnsError(f"no interface {ifname!r} in netns {where or '<current>'}")
    return int(found[0])


def link_up(name: str | None, ifname: str) -> None:
    """Set ``ifname`` up in netns ``name``."""
    with ipr_for(name) as ipr:
        ipr.link("set", index=_ifindex(ipr, ifname, name), state="up")


# --------------------------------------------------------------------------------------------- links/addrs


def _addr_kwargs(address: str, prefixlen: int | None) -> dict[str, Any]:
    ip = ipaddress.ip_address(address)
    if prefixlen is None:
        prefixlen = 24 if ip.version == 4 else 64
    kwargs: dict[str, Any] = {"address": str(ip), "prefixlen": prefixlen}
    if ip.version == 6:
        kwargs["flags"] = IFA_F_NODAD
    return kwargs


def add_address(name: str | None, ifname: str, address: str, prefixlen: int | None = None) -> None:
    """Add an IPv4 or IPv6 address; IPv6 addresses get IFA_F_NODAD (usable immediately, no DAD wait)."""
    kwargs = _addr_kwargs(address, prefixlen)
    with ipr_for(name) as ipr:
        ipr.addr("add", index=_ifindex(ipr, ifname, name), **kwargs)


def link_is_up(name: str | None, ifname: str) -> bool:
    """Whether ``ifname`` in netns ``name`` has carrier (IFF_LOWER_UP, e.g. both veth ends up)."""
    with ipr_for(name) as ipr:
        links = ipr.get_links(_ifindex(ipr, ifname, name))
        return bool(links and int(links[0]["flags"]) & IFF_LOWER_UP)


def create_veth(
    ns_a: str,
    ns_b: str,
    if_a: str = "veth0",
    if_b: str = "veth1",
    *,
    addrs_a: Sequence[str] = (),
    addrs_b: Sequence[str] = (),
    mtu: int | None = None,
) -> None:
    """Create a veth pair with end ``if_a`` in ``ns_a`` and ``if_b`` in ``ns_b``, add addresses, set both up.

    Addresses are ``"10.0.0.1/24"`` or ``"fd00::1/64"`` (prefix optional). The pair is created in the caller's
    namespace under temporary names and then moved, so it never clashes with existing host interfaces.
    """
    for ifname in (if_a, if_b):
        if not ifname or len(ifname) > IFNAMSIZ_MAX:
            raise ValueError(f"interface name must be 1..{IFNAMSIZ_MAX} characters: {ifname!r}")
    tag = f"{os.getpid() % 100000}{next(_counter)}"
    tmp_a, tmp_b = f"pv{tag}a"[:IFNAMSIZ_MAX], f"pv{tag}b"[:IFNAMSIZ_MAX]
    with ipr_for(None) as ipr:
        try:
            ipr.link("add", ifname=tmp_a, kind="veth", peer=tmp_b)
        except Exception as exc:  # pyroute2 raises NetlinkError (an OSError subclass) or its own types
            raise NetnsError(f"cannot create veth pair: {exc}") from exc
        try:
            idx_a = _ifindex(ipr, tmp_a, None)
            idx_b = _ifindex(ipr, tmp_b, None)
            ipr.link("set", index=idx_a, net_ns_fd=ns_a)
            ipr.link("set", index=idx_b, net_ns_fd=ns_b)
        except Exception:
            with contextlib.suppress(Exception):
                ipr.link("del", ifname=tmp_a)
            raise
    for ns, tmp, final, addrs in ((ns_a, tmp_a, if_a, addrs_a), (ns_b, tmp_b, if_b, addrs_b)):
        with ipr_for(ns) as ipr:  # one handle per namespace for rename, addresses and links up
            idx = _ifindex(ipr, tmp, ns)
            settings: dict[str, Any] = {"ifname": final}
            if mtu is not None:
                settings["mtu"] = mtu
            ipr.link("set", index=idx, **settings)
            for spec in addrs:
                addr, _, plen = spec.partition("/")
                ipr.addr("add", index=idx, **_addr_kwargs(addr, int(plen) if plen else None))
            ipr.link("set", index=idx, state="up")
            ipr.link("set", index=_ifindex(ipr, "lo", ns), state="up")


# --------------------------------------------------------------------------------------------- netem


@dataclass(frozen=True)
class Netem:
    """netem impairments (tc-netem(8) semantics). Percentages are 0..100, times in milliseconds."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    corrupt_pct: float = 0.0
    duplicate_pct: float = 0.0
    reorder_pct: float = 0.0
    limit: int = 1000

    def __post_init__(self) -> None:
        for field in ("loss_pct", "corrupt_pct", "duplicate_pct", "reorder_pct"):
            value = getattr(self, field)
            if not 0.0 <= value <= 100.0:
                raise ValueError(f"{field} must be within 0..100, got {value}")
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.limit <= 0:
            raise ValueError("delay/jitter must be >= 0 and limit > 0")
        if self.reorder_pct and not self.delay_ms:
            raise ValueError("netem reordering needs a delay")

    def tc_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of pyroute2's ``tc(..., 'netem', ...)`` (times in microseconds)."""
        kw: dict[str, Any] = {"limit": self.limit}
        if self.delay_ms:
            kw["delay"] = int(self.delay_ms * 1000)
        if self.jitter_ms:
            kw["jitter"] = int(self.jitter_ms * 1000)
        if self.loss_pct:
            kw["loss"] = self.loss_pct
        if self.duplicate_pct:
            kw["duplicate"] = self.duplicate_pct
        if self.corrupt_pct:
            kw["prob_corrupt"] = self.corrupt_pct
        if self.reorder_pct:
            kw["prob_reorder"] = self.reorder_pct
        return kw


def set_netem(name: str | None, ifname: str, netem: Netem) -> None:
    """Install (or replace) a root netem qdisc on ``ifname`` (egress of that interface only)."""
    with ipr_for(name) as ipr:
        idx = _ifindex(ipr, ifname, name)
        try:
            ipr.tc("replace", "netem", index=idx, handle="1:", **netem.tc_kwargs())
        except Exception as exc:
            if getattr(exc, "code", None) == errno.ENOENT:  # NetlinkError: unknown qdisc kind
                raise NetemMissingError(f"kernel has no sch_netem ({ifname} in {name}: {exc})") from exc
            raise NetnsError(f"cannot set netem on {ifname} in {name}: {exc}") from exc


def clear_netem(name: str | None, ifname: str) -> None:
    """Remove the root qdisc of ``ifname`` (back to the default); no error if none was set."""
    with ipr_for(name) as ipr:
        idx = _ifindex(ipr, ifname, name)
        with contextlib.suppress(Exception):  # no root qdisc of ours: nothing to do
            ipr.tc("del", index=idx, root=True)  # pyroute2: handle= alone gives EINVAL


def netem_available() -> bool:
    """Whether this kernel can install a netem qdisc (probed once in a throwaway namespace)."""
    global _netem_ok
    if _netem_ok is None:
        name = unique_name("pyrds-probe")
        try:
            create_netns(name)
            set_netem(name, "lo", Netem(delay_ms=1))
            _netem_ok = True
        except (NetnsError, OSError):
            _netem_ok = False
        finally:
            delete_netns(name)
    return _netem_ok


# --------------------------------------------------------------------------------------------- running code


def _get_libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _setns_fd(fd: int) -> None:
    if _get_libc().setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


@contextlib.contextmanager
def enter_netns(name: str) -> Iterator[None]:
    """Switch the *calling thread* into netns ``name`` and back on exit.

    Sockets created inside stay in ``name`` after the block. Only this thread moves; do not ``await`` or hand
    the thread to other work inside the block.
    """
    target = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except BaseException:
        os.close(target)
        raise
    try:
        _setns_fd(target)
        try:
            yield
        finally:
            _setns_fd(home)
    finally:
        os.close(target)
        os.close(home)


def _on_thread(fn: Callable[[], T]) -> T:
    """Run ``fn()`` on a fresh helper thread and return its result (exceptions propagate)."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name="pyrds-netns", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def run_in_netns(name: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Call ``fn(*args, **kwargs)`` in netns ``name`` (on a helper thread) and return its result.

    Exceptions propagate. Objects created inside (sockets) keep that namespace, so a test can create a server
    socket in one namespace and a client in the other, then use both from the main thread.
    """

    def call() -> T:
        with enter_netns(name):
            return fn(*args, **kwargs)

    return _on_thread(call)


def popen_in_netns(name: str, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """Start a subprocess inside netns ``name``: it is spawned from a helper thread that ``setns``-ed into
    ``name`` (a child inherits the forking thread's namespace), so no ``preexec_fn`` and no ``ip netns exec``
    (nor its /etc/netns bind mounts and /sys remount). Other kwargs go to :class:`subprocess.Popen`."""
    if not netns_exists(name):
        raise NetnsError(f"netns {name!r} does not exist")

    def spawn() -> subprocess.Popen[Any]:
        with enter_netns(name):
            return subprocess.Popen(list(args), **kwargs)

    return _on_thread(spawn)


def run_cmd_in_netns(
    name: str | None,
    args: Sequence[str],
    *,
    check: bool = True,
    timeout: float = 60.0,
    input: str | None = None,  # noqa: A002 - subprocess's name
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion in netns ``name`` (``None``: here) and capture its text output."""
    pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    if input is not None:
        pipes["stdin"] = subprocess.PIPE
    if name is None:
        proc = subprocess.Popen(list(args), **pipes)
    else:
        proc = popen_in_netns(name, args, **pipes)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(list(args), proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(args)} failed ({proc.returncode}): {err.strip()}")
    return done


# --------------------------------------------------------------------------------------------- rxe


def add_rxe(netdev: str, name: str | None = None, *, netns: str | None = None) -> str:
    """Create a soft-RoCE device on ``netdev`` (``rdma link add NAME type rxe netdev IF``); returns NAME.

    Shells out to iproute2's ``rdma`` (pyroute2 has no RDMA netlink). Needs the rdma_rxe module. With
    ``netns`` the interface name is resolved in that namespace (RDMA devices are shared across namespaces in
    the default ``rdma system`` netns mode).
    """
    if shutil.which("rdma") is None:
        raise NetnsError("no 'rdma' tool: apt-get install iproute2")
    rxe = name or f"rxe_{netdev}"[:IFNAMSIZ_MAX]
    run_cmd_in_netns(netns, ["rdma", "link", "add", rxe, "type", "rxe", "netdev", netdev])
    return rxe


def delete_rxe(name: str) -> None:
    """Delete a soft-RoCE device created by :func:`add_rxe` (no error if it is gone)."""
    if shutil.which("rdma") is not None:
        run_cmd_in_netns(None, ["rdma", "link", "delete", name], check=False)


# --------------------------------------------------------------------------------------------- pair


@dataclass(frozen=True)
class NetnsPair:
    """Two namespaces joined by a veth pair (``if_a`` in ``ns_a``, ``if_b`` in ``ns_b``)."""

    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    addr4_a: str
    addr4_b: str
    addr6_a: str | None
    addr6_b: str | None


@contextlib.contextmanager
def netns_pair(
    prefix: str = "pyrds",
    *,
    addr4: tuple[str, str] = ("10.200.0.1", "10.200.0.2"),
    prefixlen4: int = 24,
    addr6: tuple[str, str] | None = ("fd00:200::1", "fd00:200::2"),
    prefixlen6: int = 64,
    netem: Netem | None = None,
    netem_both: bool = True,
    if_names: tuple[str, str] = ("veth0", "veth1"),
) -> Iterator[NetnsPair]:
    """Create two fresh namespaces joined by a veth pair with IPv4 (+ IPv6, nodad) addresses, all links up.

    With ``netem``, the qdisc is installed on ``if_a`` (and on ``if_b`` too when ``netem_both``). Both
    namespaces are deleted on exit, whatever happens.
    """
    ns_a, ns_b = unique_name(prefix + "a"), unique_name(prefix + "b")
    created: list[str] = []
    try:
        for ns in (ns_a, ns_b):
            create_netns(ns)
            created.append(ns)
        addrs_a = [f"{addr4[0]}/{prefixlen4}"]
        addrs_b = [f"{addr4[1]}/{prefixlen4}"]
        if addr6 is not None:
            addrs_a.append(f"{addr6[0]}/{prefixlen6}")
            addrs_b.append(f"{addr6[1]}/{prefixlen6}")
        create_veth(ns_a, ns_b, if_names[0], if_names[1], addrs_a=addrs_a, addrs_b=addrs_b)
        if netem is not None:
            set_netem(ns_a, if_names[0], netem)
            if netem_both:
                set_netem(ns_b, if_names[1], netem)
        yield NetnsPair(
            ns_a=ns_a,
            ns_b=ns_b,
            if_a=if_names[0],
            if_b=if_names[1],
            addr4_a=addr4[0],
            addr4_b=addr4[1],
            addr6_a=addr6[0] if addr6 else None,
            addr6_b=addr6[1] if addr6 else None,
        )
    finally:
        for ns in reversed(created):
            with contextlib.suppress(Exception):
                delete_netns(ns)
