"""Two userspace stacks in two network namespaces exchanging messages both ways while ~5% of the RDS/TCP
packets are dropped and ~5% duplicated (nftables ``numgen random`` with ``drop`` and ``dup``: works where
sch_netem is missing) and both sides force reconnects over and over (50,000 messages per direction): a running
SHA-256 per direction proves exactly-once, in-order delivery. netem's third impairment, corruption, reaches
TCP as a checksum failure, i.e. one more loss; the guest's selftest scenario runs real netem."""

from __future__ import annotations

import re
import time

import pytest

from pyrds.constants import InfoType
from pyrds.info import counters_dict

pytestmark = [pytest.mark.netns, pytest.mark.nft]  # userspace_netns_pair: needs nft too

LOSS_RULES = """table inet pyrds_loss {
 chain out {
  type filter hook output priority 0; policy accept;
  tcp dport 16385 numgen random mod 20 == 0 drop
  tcp sport 16385 numgen random mod 20 == 0 drop
 }
}
"""

DUP_RULES = """table ip pyrds_dup {{
 chain out {{
  type filter hook output priority 0; policy accept;
  tcp dport 16385 numgen random mod 20 == 1 counter dup to {peer} device "{ifname}"
  tcp sport 16385 numgen random mod 20 == 1 counter dup to {peer} device "{ifname}"
 }}
}}
"""


def _dup_count(node: object) -> int:
    out = node.sh("nft", "list", "table", "ip", "pyrds_dup").stdout  # type: ignore[attr-defined]
    return sum(int(m) for m in re.findall(r"counter packets (\d+)", out))


# 50,000 messages per direction: the exactly-once bar (about 35-60 s on the 2-core host)
@pytest.mark.parametrize("count", [50_000])
def test_exactly_once_under_loss_and_repeated_resets(userspace_netns_pair, tmp_path, count: int) -> None:
    na, nb = userspace_netns_pair.a, userspace_netns_pair.b
    a, b = userspace_netns_pair.bound_pair()
    rules = tmp_path / "loss.nft"
    rules.write_text(LOSS_RULES)
    for n, peer in ((na, nb), (nb, na)):
        n.sh("nft", "-f", str(rules))
        dup = tmp_path / f"dup-{n.name}.nft"
        dup.write_text(DUP_RULES.format(peer=peer.addr4, ifname=n.ifname))
        n.sh("nft", "-f", str(dup))
    # a transfer that stops moving for 60 s is lost or stuck (it never comes back: seen once in CI with 114 of
    # 50,000 A->B messages missing after 600 s); the state of both stacks then goes to the log
    timeout = 600.0
    kw = {"count": count, "seed": 3, "timeout": timeout, "stall": 60.0}
    ja = na.agent.job("pyrds.testing.workloads:exchange", [a], peers=[b.getsockname()], **kw)
    jb = nb.agent.job("pyrds.testing.workloads:exchange", [b], peers=[a.getsockname()], **kw)
    for i in range(12):  # resets spread over the first ~25 s of the exchange, alternating sides
        time.sleep(0.3 if i < 4 else 3.0)
        (na if i % 2 == 0 else nb).force_reconnect()
    try:
        ra = na.agent.wait(ja, timeout + 30)
        rb = nb.agent.wait(jb, timeout + 30)
    except Exception:
        userspace_netns_pair.dump_state([a, b])
        raise
    from pyrds.testing.topology import tcp_trouble

    for n in (na, nb):  # in the log (-rP): what TCP went through on the way
        print(f"{n.name}: {tcp_trouble(n.sh('nstat', '-asz', check=False).stdout)}")
    ka, kb = ra["me"], rb["me"]
    assert ra["recv_n"] == {kb: count} and rb["recv_n"] == {ka: count}
    assert ra["sent"][kb] == rb["recv"][ka], "A->B: loss, duplicate or reordering"
    assert rb["sent"][ka] == ra["recv"][kb], "B->A: loss, duplicate or reordering"
    assert counters_dict(a.get_info(InfoType.RDS_INFO_COUNTERS))["conn_reset"] >= 4
    assert _dup_count(na) > 0 and _dup_count(nb) > 0  # duplicates were really injected
