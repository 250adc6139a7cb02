"""Congestion maps of one stack (cong.c): one map per address, shared by every connection of that address.

Local addresses' maps are set/cleared by receive accounting; peers' maps are replaced when a peer sends its
bitmap. A change of a local map is pushed to every connection from that address (TCP: a bitmap on path 0;
loop: the kernel's loop transport turns it into ``rds_cong_map_updated(fcong, ~0)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pyrds.addr import IPAddress
from pyrds.constants import cong_monitor_mask
from pyrds.userspace.proto.cong import CongestionMap
from pyrds.userspace.stack.ports import normalize
from pyrds.userspace.stack.sockstate import CongGeneration, SockState

ALL_PORTS = (1 << 64) - 1


class CongestionTable:
    def __init__(self, counters: dict[str, int]) -> None:
        self._maps: dict[IPAddress, CongestionMap] = {}
        self._counters = counters
        self.monitors: dict[int, SockState] = {}
        #: rds_cong_generation of this stack (the kernel's is global to the host)
        self.generation = CongGeneration()
        #: sockets with rs_seen_congestion (the kernel's rds_poll_waitq sleepers): woken on every map update
        self.waiters: dict[int, SockState] = {}
        #: sockets whose blocking send was told to wait for a congested port (the sleepers on the kernel's
        #: map waitqueue, rds_cong_wait): woken once by the next map update, then forgotten (a send that
        #: finds the port still congested waits again)
        self.sleepers: dict[int, SockState] = {}
        #: called with the local address whose map changed (the stack queues the updates)
        self.on_local_change: Callable[[IPAddress], None] = lambda addr: None

    def map_for(self, addr: IPAddress) -> CongestionMap:
        addr = normalize(addr)
        cmap = self._maps.get(addr)
        if cmap is None:
            cmap = self._maps[addr] = CongestionMap()
        return cmap

    def test(self, addr: IPAddress, port: int) -> bool:
        cmap = self._maps.get(normalize(addr))
        return cmap is not None and cmap.test(port)

    def set_local(self, addr: IPAddress, port: int, congested: bool) -> None:
        cmap = self.map_for(addr)
        if congested:
            cmap.set(port)
        else:
            cmap.clear(port)
        self.on_local_change(normalize(addr))

    def replace_remote(self, addr: IPAddress, new: CongestionMap) -> int:
        """A peer's bitmap arrived over TCP: replace our copy; returns the port mask for
        :meth:`map_updated`: ``~0`` like rds_tcp_cong_recv (only IB computes the uncongested ports)."""
        self._maps[normalize(addr)] = new
        return ALL_PORTS

    @staticmethod
    def uncongested_mask(old: CongestionMap, new: CongestionMap) -> int:
        """The mask IB's rds_ib_cong_recv would pass: ports congested in ``old`` and clear in ``new``."""
        mask = 0
        for port in CongestionMap.changed_ports(old, new):
            if old.test(port) and not new.test(port):
                mask |= cong_monitor_mask(port)
        return mask

    def map_updated(self, portmask: int, wake: Callable[[SockState], None]) -> None:
        """rds_cong_map_updated: bump the generation (historical POLLIN), wake the sockets that saw
        congestion, move monitored ports in ``portmask`` from rs_cong_mask to rs_cong_notify."""
        self._counters["cong_update_received"] += 1
        self.generation.value += 1
        self.wake_sleepers()
        for rs in list(self.waiters.values()):
            wake(rs)
        if not portmask:
            return
        for rs in list(self.monitors.values()):
            rs.cong_notify |= rs.cong_mask & portmask
            rs.cong_mask &= ~portmask
            if rs.cong_notify:
                wake(rs)

    def saw_congestion(self, rs: SockState) -> None:
        """rds_sendmsg: ``rs->rs_seen_congestion = 1`` after rds_cong_wait failed."""
        rs.seen_congestion = True
        self.waiters[rs.sock_id] = rs

    def sleep(self, rs: SockState) -> None:
        """A blocking send of ``rs`` must wait (a congested port, or a local receiver over its cap): wake it
        at the next map update or when a local receiver drops below its cap."""
        self.sleepers[rs.sock_id] = rs

    def wake_sleepers(self) -> None:
        """Every waiting blocking sender sends again (one that still finds its port congested waits again)."""
        if not self.sleepers:
            return
        sleepers = list(self.sleepers.values())
        self.sleepers.clear()
        for rs in sleepers:
            if rs.send_waker is not None:
                rs.send_waker.wake()

    def look(self, rs: SockState) -> None:
        """The socket looks at the generation (the kernel does it in rds_poll; the userspace stack, whose
        readiness fd cannot see polls, on the socket's next send/recv): the historical POLLIN is consumed."""
        gen = rs.cong_gen  # rs.cong_updated_since(), inline: twice per message
        if gen is None or rs.cong_track == gen.value:
            return
        visible = rs.hist_pollin()
        rs.cong_track = self.generation.value
        if visible:
            # rds_poll returned a mask: rs_seen_congestion = 0
            rs.seen_congestion = False
            self.waiters.pop(rs.sock_id, None)
            rs.update_readiness()

    def forget(self, rs: SockState) -> None:
        self.waiters.pop(rs.sock_id, None)
        self.sleepers.pop(rs.sock_id, None)

    def monitor(self, rs: SockState, on: bool) -> None:
        """setsockopt(RDS_CONG_MONITOR): rds_cong_add_socket, or rds_cong_remove_socket and a reset mask."""
        rs.cong_monitor = on
        if on:
            self.monitors[rs.sock_id] = rs
        else:
            self.remove_socket(rs)
            rs.cong_mask = 0
            rs.cong_notify = 0
        rs.update_readiness()

    def remove_socket(self, rs: SockState) -> None:
        """rds_cong_remove_socket (monitor off, rds_release): leave the monitors and, if the socket's port is
        marked congested in its address's map, clear it and queue map updates (rs_congested is left as is)."""
        self.monitors.pop(rs.sock_id, None)
        if rs.bound_addr is None:
            return
        addr = normalize(rs.bound_addr)
        cmap = self._maps.get(addr)
        if cmap is not None and cmap.test(rs.bound_port):
            cmap.clear(rs.bound_port)
            self.on_local_change(addr)

    def local_maps(self, addrs: Iterable[IPAddress]) -> dict[IPAddress, CongestionMap]:
        return {a: self.map_for(a) for a in addrs}
