"""Congestion maps of one stack (cong.c): one map per address, shared by every connection of that address.

Local addresses' maps are set/cleared by receive accounting; peers' maps are replaced when a peer sends its
bitmap. A change of a local map is pushed to every connection from that address (TCP: a bitmap on path 0;
loop: the kernel's loop transport turns it into ``rds_cong_map_updated(fcong, ~0)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pyrds.addr import IPAddress
from pyrds.constants import cong_monitor_mask
from pyrds.userspace.ports import normalize
from pyrds.userspace.proto.cong import CongestionMap
from pyrds.userspace.sockstate import SockState

ALL_PORTS = (1 << 64) - 1


class CongestionTable:
    def __init__(self, counters: dict[str, int]) -> None:
        self._maps: dict[IPAddress, CongestionMap] = {}
        self._counters = counters
        self.monitors: dict[int, SockState] = {}
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
        """A peer's bitmap arrived: replace our copy; returns the uncongested-port mask."""
        old = self.map_for(addr)
        mask = 0
        for port in CongestionMap.changed_ports(old, new):
            if old.test(port) and not new.test(port):
                mask |= cong_monitor_mask(port)
        self._maps[normalize(addr)] = new
        return mask

    def map_updated(self, portmask: int, wake: Callable[[SockState], None]) -> None:
        """rds_cong_map_updated: tell RDS_CONG_MONITOR sockets about ports they waited on."""
        self._counters["cong_update_received"] += 1
        if not portmask:
            return
        for rs in list(self.monitors.values()):
            rs.cong_notify |= rs.cong_mask & portmask
            if rs.cong_notify:
                wake(rs)

    def monitor(self, rs: SockState, on: bool) -> None:
        rs.cong_monitor = on
        if on:
            self.monitors[rs.sock_id] = rs
        else:
            self.monitors.pop(rs.sock_id, None)
            rs.cong_mask = 0
            rs.cong_notify = 0

    def local_maps(self, addrs: Iterable[IPAddress]) -> dict[IPAddress, CongestionMap]:
        return {a: self.map_for(a) for a in addrs}
