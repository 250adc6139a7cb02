"""The plugin's RDS/IB phase: ``rds_ib`` scenarios run only with ``--rds-ib`` and ``--rds-ib`` runs nothing
else; their pairings get the report's backend labels; a pairing this machine cannot host is a SKIP with its
reason (never a pass), and kernel-userspace always says it is not covered. Runs pytest in a subprocess on a
throw-away project (on the host: no rxe, no rds_rdma, so every IB pairing skips)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pyrds.testing import ib, plugin

ROOT = Path(__file__).resolve().parents[2]

PROJECT = textwrap.dedent(
    """
    import pytest


    def test_main_suite():
        pass


    @pytest.mark.rds_ib
    @pytest.mark.parametrize("size", [0, 1], ids=["0B", "1B"])
    def test_ib_scenario(rds_ib_pair, size):
        raise AssertionError("never reached where the fabric cannot be built")
    """
)


def _run(tmp_path: Path, *options: str) -> tuple[str, dict[str, Any]]:
    (tmp_path / "test_ib_project.py").write_text(PROJECT)
    results = tmp_path / "results.json"
    # this checkout's plugin, whichever pyrds the interpreter has installed
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONPATH=path)
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    args = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-o", "addopts=", "-rA"]
    proc = subprocess.run(
        [*args, "-p", "pyrds.testing.plugin", f"--rds-results={results}", *options, "test_ib_project.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.stdout + proc.stderr, json.loads(results.read_text())


def test_ib_scenarios_are_deselected_from_the_main_suite(tmp_path: Path) -> None:
    out, data = _run(tmp_path)
    assert "1 passed, 8 deselected" in out, out
    assert [t["nodeid"] for t in data["tests"]] == ["test_ib_project.py::test_main_suite"]


def test_the_ib_phase_runs_only_ib_scenarios_with_pairing_labels(tmp_path: Path) -> None:
    out, data = _run(tmp_path, "--rds-ib")
    assert "8 skipped, 1 deselected" in out, out
    seen = {(t["props"]["rds_scenario"], t["props"]["rds_backend"], t["outcome"]) for t in data["tests"]}
    labels = ["kernel", "mixed:userspace-kernel", "mixed:kernel-userspace", "userspace"]
    assert seen == {
        (f"test_ib_project.py::test_ib_scenario[{size}]", label, "skipped")
        for size in ("0B", "1B")
        for label in labels
    }
    reasons = {t["props"]["rds_backend"]: t["reason"] for t in data["tests"]}
    assert "not covered on one machine" in reasons["mixed:kernel-userspace"]
    assert "needs two guests" in " ".join(reasons["mixed:kernel-userspace"].split())


def test_pairings_agree_between_plugin_and_topology() -> None:
    assert ib.PAIRS == plugin.IB_PAIRS
    assert set(ib.NOT_COVERED) | set(ib.HOSTS) <= set(plugin.IB_PAIRS)
    hosted = [p for p in plugin.IB_PAIRS if p not in ib.NOT_COVERED]
    fabric = ib.IbFabric(subnet=3)
    addrs = [a for p in hosted for a in fabric.addrs(p)]
    assert len(set(addrs)) == len(addrs) == 2 * len(hosted)  # every pairing has addresses of its own
    assert all(a.startswith("10.98.3.") for a in addrs)
    assert all(ib.HOSTS[p][0] < ib.HOSTS[p][1] for p in hosted)  # node A has the smaller address


def test_the_fabric_avoids_every_subnet_the_kernel_still_has_connections_in() -> None:
    # a second IB session in one boot: the kernel still lists the first session's connections (10.98.0.x),
    # and would take a new userspace node on one of those addresses for the peer it keeps redialling
    assert ib.pick_subnet([]) == 0
    assert ib.pick_subnet(["10.98.0.4", "10.98.0.3", "192.168.1.1"]) == 1
    assert ib.pick_subnet(["10.98.0.1", "10.98.1.2", "10.98.3.7"]) == 2
    assert ib.pick_subnet(["10.99.0.1", "::1"]) == 0
    with pytest.raises(ib.IbSetupError):
        ib.pick_subnet([f"10.98.{n}.1" for n in range(256)])


def test_a_peer_guest_covers_kernel_userspace() -> None:
    """Guest A of a --peer-ib run (vm/guest.py's environment) hosts kernel-userspace with guest B's agent as
    node B; anywhere else it stays a skip with the one-machine reason."""
    env = {
        "PYRDS_ROLE": "a",
        "PYRDS_NETDEV": "eth0",
        "PYRDS_LOCAL_ADDR": "10.99.0.1",
        "PYRDS_PEER_ADDR": "10.99.0.2",
        "PYRDS_VM_RESULTS": "/res/a",
    }
    assert ib.peer_link(env) == ib.PeerLink("eth0", "10.99.0.1", "10.99.0.2", "/res/b/peer-token")
    assert ib.not_covered("kernel-userspace", env) is None
    assert ib.not_covered("kernel-kernel", env) is None
    assert ib.not_covered("kernel-userspace", {}) == ib.NOT_COVERED["kernel-userspace"]
    assert ib.PEER_PAIRS <= set(ib.NOT_COVERED)  # one machine still cannot host them
    for key in env:
        partial = {k: v for k, v in env.items() if k != key}
        assert ib.peer_link(partial) is None
        assert ib.not_covered("kernel-userspace", partial) == ib.NOT_COVERED["kernel-userspace"]
    assert ib.peer_link({**env, "PYRDS_ROLE": "b"}) is None  # guest B is the peer, not the suite


def test_link6_is_the_ipv6_twin_of_the_link_address() -> None:
    assert ib.link6("10.99.0.1") == "fd00:99::1" and ib.link6("10.99.0.2") == "fd00:99::2"
    assert ib.link6("10.99.0.254") == "fd00:99::fe"


def test_userspace_kernel_goes_across_guests_only_with_a_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenarios that end in a remote access error run userspace-kernel across the two guests: node A the
    peer guest's userspace stack, node B this guest's kernel (made once, destroyed with the pair); other
    pairings, and userspace-kernel without a peer guest, get None (the test's skip)."""
    made: list[tuple[str, str]] = []
    destroyed: list[str] = []

    class FakeAcross:
        def destroy(self) -> None:
            destroyed.append("across")

    def fake_create(pair: str, fabric: Any, peer_node: str = "B") -> Any:
        made.append((pair, peer_node))
        return FakeAcross()

    def node(name: str, backend: str) -> Any:
        return ib.IbNode(name, backend, f"10.98.0.{ord(name) - 64}", agent=None)  # type: ignore[arg-type]

    monkeypatch.setattr(ib.IbPair, "_create_with_peer", staticmethod(fake_create))
    monkeypatch.setattr(ib, "_teardown", lambda nodes, reload: destroyed.append("pair"))
    fabric = object()
    link = ib.PeerLink("eth0", "10.99.0.1", "10.99.0.2", "/res/b/peer-token")
    uk = ib.IbPair(node("A", "userspace"), node("B", "kernel"), False, fabric)  # type: ignore[arg-type]
    kk = ib.IbPair(node("A", "kernel"), node("B", "kernel"), False, fabric)  # type: ignore[arg-type]
    monkeypatch.setattr(ib, "peer_link", lambda environ=None: None)
    assert uk.across_guests() is None
    monkeypatch.setattr(ib, "peer_link", lambda environ=None: link)
    assert kk.across_guests() is None
    across = uk.across_guests()
    assert across is not None and uk.across_guests() is across
    assert made == [("userspace-kernel", "A")]
    uk.destroy()
    assert destroyed == ["across", "pair"]
