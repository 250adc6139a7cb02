"""The benchmark's RDS/IB section without a guest: the order of the pairings (userspace-userspace first and
alone), the orchestration over fake fabric and pairings, ``--sections ib`` / ``--merge``, the command line
the host hands the guest, and the report's IB text and tables."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from benchlib import bench_modules

from pyrds.testing import ib

#: benchmarks/ modules import each other as top-level modules (run.py puts its directory on sys.path)
BENCH_MODULES = ("run", "cells", "ib_section", "report", "topology", "sections")
REAL_FABRIC = ib.IbFabric  # the tests below replace ib.IbFabric


@pytest.fixture(scope="module")
def bench() -> Iterator[dict[str, ModuleType]]:
    with bench_modules(("run", "cells", "ib_section", "report"), BENCH_MODULES) as mods:
        yield mods


def labels(group: list[Any]) -> list[str]:
    return [sc[0] for sc in group]


# -------------------------------------------------------------------------------------------------- order


def test_userspace_pair_runs_first_and_alone(bench: dict[str, ModuleType]) -> None:
    ibs = bench["ib_section"]
    groups = ibs.phases(ibs.IB_SCENARIOS, ib.UNLOADS_RDS_RDMA)
    assert labels(groups[0]) == ["userspace<->userspace"]
    assert labels(groups[1]) == [
        "kernel<->kernel (stdlib)",
        "kernel<->kernel (pyrds.kernel)",
        "userspace->kernel",
        "kernel->userspace",
    ]
    assert len(groups) == 2


def test_phases_of_a_subset(bench: dict[str, ModuleType]) -> None:
    ibs = bench["ib_section"]
    kernel_only = [sc for sc in ibs.IB_SCENARIOS if sc[3] == "kernel-kernel"]
    assert [labels(g) for g in ibs.phases(kernel_only, ib.UNLOADS_RDS_RDMA)] == [labels(kernel_only)]
    uu = [sc for sc in ibs.IB_SCENARIOS if sc[3] == "userspace-userspace"]
    assert [labels(g) for g in ibs.phases(uu, ib.UNLOADS_RDS_RDMA)] == [labels(uu)]
    assert ibs.phases([], ib.UNLOADS_RDS_RDMA) == []


def test_scenarios_are_pairings_one_machine_hosts(bench: dict[str, ModuleType]) -> None:
    ibs = bench["ib_section"]
    run = bench["run"]
    tcp_roles = {label: (a, p) for label, a, p, _key in run.SCENARIOS}
    for label, active, passive, pairing in ibs.IB_SCENARIOS:
        assert pairing in ib.PAIRS
        # one machine hosts the pairing, or it is a peer guest's scenario and pairing
        assert pairing not in ib.NOT_COVERED or (label in ibs.PEER_SCENARIOS and pairing in ib.PEER_PAIRS)
        assert tcp_roles[label] == (active, passive)  # same label, same roles as the RDS/TCP row
        node_a, node_b = pairing.split("-")  # node A dials: the active side runs there
        assert node_a == ("kernel" if active == "stdlib" else active)
        assert node_b == ("kernel" if passive == "stdlib" else passive)
    assert ibs.IB_SCENARIOS[0][0] == bench["report"].BASE


def test_the_peer_scenario_needs_the_peer_guest(bench: dict[str, ModuleType]) -> None:
    """Without a peer guest kernel->userspace is left out with why; with one (guest A of ``vm run
    --peer-ib``: PYRDS_ROLE a, the link's variables) every scenario runs."""
    ibs = bench["ib_section"]
    keys = ("PYRDS_ROLE", "PYRDS_NETDEV", "PYRDS_LOCAL_ADDR", "PYRDS_PEER_ADDR", "PYRDS_VM_RESULTS")
    with pytest.MonkeyPatch.context() as mp:
        for k in keys:
            mp.delenv(k, raising=False)
        chosen, skipped = ibs.available(ibs.IB_SCENARIOS)
        assert labels(chosen) == [sc[0] for sc in ibs.IB_SCENARIOS if sc[0] != "kernel->userspace"]
        assert skipped == {"kernel->userspace": "needs the peer guest (vm run --peer-ib)"}
        for k, v in zip(keys, ("a", "eth1", "10.99.0.1", "10.99.0.2", "/tmp/r/a"), strict=True):
            mp.setenv(k, v)
        assert ibs.available(ibs.IB_SCENARIOS) == (list(ibs.IB_SCENARIOS), {})


# ------------------------------------------------------------------------------------------ orchestration


class FakeFabric:
    created = 0
    destroyed = 0

    def __init__(self) -> None:
        self.subnet = 7

    @classmethod
    def create(cls) -> FakeFabric:
        cls.created += 1
        return cls()

    def addrs(self, pair: str) -> tuple[str, str]:
        return REAL_FABRIC(self.subnet).addrs(pair)

    def destroy(self) -> None:
        FakeFabric.destroyed += 1


class FakeNode:
    def __init__(self, addr: str, env: dict[str, str]) -> None:
        self.addr, self.env = addr, env


class World:
    """Fake pyrds.testing.ib pairings and cells: records what happened in which order."""

    def __init__(self, fail_create: str | None = None, fail_destroy: str | None = None) -> None:
        self.log: list[str] = []
        self.live: set[str] = set()
        self.fail_create, self.fail_destroy = fail_create, fail_destroy

    def pair(self, pairing: str, fabric: FakeFabric) -> Any:
        if pairing == self.fail_create:
            raise ib.IbSetupError("no hello exchange")
        world = self
        a, b = fabric.addrs(pairing)

        class Pair:
            def __init__(self) -> None:
                env = {"PYRDS_STACK_NAME": f"stack-{pairing}"} if "userspace" in pairing else {}
                self.a, self.b = FakeNode(a, env), FakeNode(b, {})

            def destroy(self) -> None:
                world.live.discard(pairing)
                world.log.append(f"destroy {pairing}")
                if pairing == world.fail_destroy:
                    raise ib.IbSetupError("modprobe rds_rdma exited 1")

        self.live.add(pairing)
        self.log.append(f"create {pairing}")
        return Pair()

    def cells(self, selected: Any, topo: Any, modes: Any, sizes: Any, duration: float, **kw: Any) -> Any:
        assert kw["transport"] == "ib"
        broken = kw.get("broken") or {}
        for label, _a, _p, key in selected:
            if key in broken:
                continue
            assert key in self.live, f"{label}: its pairing is not up"
            if key == "userspace-userspace":
                assert self.live == {key}, "userspace-userspace shares the machine with another pairing"
            a, _b = topo[key]
            assert a.ns is None and a.addr == FakeFabric().addrs(key)[0]
        self.log.append("cells " + ",".join(sc[0] for sc in selected) + f" port {kw['port_base']}")
        return [
            {"scenario": label, "mode": m, "size": z, "error": broken.get(key), "msgs_per_s": 1.0}
            for label, _a, _p, key in selected
            for m in modes
            for z in sizes
        ]


@pytest.fixture
def world(bench: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def make(**kw: Any) -> World:
        w = World(**kw)
        monkeypatch.setattr(ib, "ib_unavailable", lambda: None)
        monkeypatch.setattr(ib, "IbFabric", FakeFabric)
        monkeypatch.setattr(ib.IbPair, "create", classmethod(lambda _cls, pair, fabric: w.pair(pair, fabric)))
        monkeypatch.setattr(ib, "kernel_ib_connections", lambda: 2)
        monkeypatch.setattr(bench["ib_section"], "measure_cells", w.cells)
        FakeFabric.created = FakeFabric.destroyed = 0
        return w

    yield make


def one_machine(ibs: ModuleType) -> list[Any]:
    """The scenarios of a guest without a peer guest."""
    return [sc for sc in ibs.IB_SCENARIOS if sc[0] not in ibs.PEER_SCENARIOS]


def test_measure_order_and_rows(bench: dict[str, ModuleType], world: Any) -> None:
    ibs = bench["ib_section"]
    w = world()
    got = ibs.measure(one_machine(ibs), ["rr", "oneway"], [1024, 65536], 3.0)
    assert w.log == [
        "create userspace-userspace",
        "cells userspace<->userspace port 4301",
        "destroy userspace-userspace",
        "create kernel-kernel",
        "create userspace-kernel",
        "cells kernel<->kernel (stdlib),kernel<->kernel (pyrds.kernel),userspace->kernel port 4311",
        "destroy kernel-kernel",
        "destroy userspace-kernel",
    ]
    assert FakeFabric.created == FakeFabric.destroyed == 1
    assert got["error"] is None and got["kernel_ib_connections"] == 2
    assert got["fabric"]["subnet"] == "10.98.7.0/24"
    assert got["phases"] == [["userspace-userspace"], ["kernel-kernel", "userspace-kernel"]]
    assert got["pairs"]["userspace-kernel"] == {"a": "10.98.7.3", "b": "10.98.7.4", "error": None}
    keys = [(r["scenario"], r["mode"], r["size"]) for r in got["rows"]]
    want = [(sc[0], m, z) for sc in one_machine(ibs) for m in ("rr", "oneway") for z in (1024, 65536)]
    assert keys == want


def test_a_pairing_that_fails_marks_its_rows(bench: dict[str, ModuleType], world: Any) -> None:
    ibs = bench["ib_section"]
    world(fail_create="userspace-userspace")
    got = ibs.measure(one_machine(ibs), ["rr"], [1024], 3.0)
    by = {r["scenario"]: r for r in got["rows"]}
    assert "no hello exchange" in by["userspace<->userspace"]["error"]
    assert "no hello exchange" in got["pairs"]["userspace-userspace"]["error"]
    assert by["kernel<->kernel (stdlib)"]["error"] is None  # the kernel phase still ran
    assert got["error"] is None


def test_a_failed_reload_stops_the_kernel_phase(bench: dict[str, ModuleType], world: Any) -> None:
    ibs = bench["ib_section"]
    w = world(fail_destroy="userspace-userspace")
    got = ibs.measure(one_machine(ibs), ["rr"], [1024], 3.0)
    assert not any(line.startswith("create kernel") for line in w.log)
    assert "modprobe rds_rdma exited 1" in got["error"]
    by = {r["scenario"]: r for r in got["rows"]}
    assert by["userspace<->userspace"]["error"] is None
    assert "modprobe rds_rdma" in by["userspace->kernel"]["error"]
    assert FakeFabric.destroyed == 1


def test_no_rxe_means_every_row_says_why(
    bench: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    ibs = bench["ib_section"]
    monkeypatch.setattr(ib, "ib_unavailable", lambda: "RDS/IB scenarios need the rdma_rxe module")
    got = ibs.measure(one_machine(ibs), ["rr", "oneway"], [1024], 3.0)
    assert got["error"] == "RDS/IB scenarios need the rdma_rxe module"
    assert len(got["rows"]) == 8 and all(r["error"] == got["error"] for r in got["rows"])


# ------------------------------------------------------------------------------------- sections and merge


def test_sections_option_knows_ib(bench: dict[str, ModuleType]) -> None:
    run = bench["run"]
    assert run._sections("ib") == ["ib"]
    assert run._sections("ib,stress") == ["stress", "ib"]
    assert "ib" in run.SECTIONS and run.SECTION_KEYS["ib"] == "ib"


def test_merge_keeps_other_sections_and_replaces_ib(bench: dict[str, ModuleType], tmp_path: Path) -> None:
    run = bench["run"]
    old = {
        "date": "old",
        "machine": "m",
        "duration_s": 3.0,
        "results": [{"scenario": "plain TCP"}],
        "percall": [],
        "note": "old note",
        "fanin": {"rows": ["old fanin"]},
        "ib": {"rows": ["old ib"]},
    }
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(old))
    new: dict[str, Any] = {"date": "new", "machine": "m2", "duration_s": 3.0, "results": [], "percall": []}
    out = run.merge({**new, "ib": {"rows": ["new"]}}, saved, ["ib"])
    assert out["ib"] == {"rows": ["new"]}
    assert out["fanin"] == old["fanin"] and out["results"] == old["results"] and out["date"] == "old"
    # measuring the stress rows without ib keeps the old IB section
    out = run.merge(new, saved, ["stress"])
    assert out["ib"] == old["ib"] and out["results"] == [] and out["date"] == "new"


def test_host_hands_the_guest_the_ib_options(
    bench: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run = bench["run"]
    seen: list[list[str]] = []

    class Proc:
        stdout: list[str] = []

        def __init__(self, cmd: list[str], **_kw: Any) -> None:
            seen.append(cmd)

        def wait(self) -> int:
            return 1

    monkeypatch.setattr(run.subprocess, "Popen", Proc)
    rc = run.main(["--sections", "ib", "--ib-sizes", "1024,65536", "--save-json", str(tmp_path / "r.json")])
    assert rc == 1  # no results line from the (fake) guest
    (cmd,) = seen
    guest = cmd[cmd.index("--") + 1 :]
    assert guest[:2] == ["python", "benchmarks/run.py"] and "--guest" in guest
    assert guest[guest.index("--sections") + 1] == "ib"
    assert guest[guest.index("--ib-sizes") + 1] == "1024,65536"


# ------------------------------------------------------------------------------------------------- report


def _ib_rows() -> list[dict[str, Any]]:
    rows = []
    rates = {"kernel<->kernel (stdlib)": 400.0, "userspace<->userspace": 100.0, "userspace->kernel": 200.0}
    for label, rate in rates.items():
        for mode in ("rr", "oneway"):
            rows.append(
                {
                    "scenario": label,
                    "mode": mode,
                    "size": 1024,
                    "msgs_per_s": rate,
                    "mb_per_s": rate * 1024 / 1e6,
                    "p50_us": 1000.0,
                    "p99_us": 2000.0,
                    "error": None,
                }
            )
    return rows


def test_report_ib_section(bench: dict[str, ModuleType]) -> None:
    report = bench["report"]
    sec = {
        "date": "2026-11-27 08:00 UTC",
        "machine": "Linux 7.3.4; QEMU guest, accel tcg",
        "duration_s": 3.0,
        "fabric": {"netdev": "pyrdsib0", "rxe": "pyrdsibrxe0", "subnet": "10.98.0.0/24"},
        "pairs": {
            "userspace-userspace": {"a": "10.98.0.7", "b": "10.98.0.8", "error": None},
            "kernel-kernel": {"a": "10.98.0.1", "b": "10.98.0.2", "error": None},
            "userspace-kernel": {"a": "10.98.0.3", "b": "10.98.0.4", "error": None},
        },
        "kernel_ib_connections": 2,
        "error": None,
        "note": "host load 5",
        "rows": _ib_rows(),
    }
    text = "\n".join(report._ib_section(sec))
    assert "## RDS/IB over rdma_rxe (soft-RoCE on a dummy netdev, TCG guest)" in text
    assert "**These are rxe figures.**" in text and "nothing about RDS/IB on an HCA" in text
    assert "pyrdsibrxe0 on pyrdsib0, 10.98.0.0/24" in text
    assert "`userspace<->userspace` (10.98.0.7 -> 10.98.0.8) ran first" in text
    assert "`kernel->userspace` is not measured (not in this run)" in text
    assert "**Not measured in this run:** kernel<->kernel (pyrds.kernel)." in text
    assert "**Note:** host load 5" in text
    assert "| userspace<->userspace | 1 KiB | 100 | 0.10 | 1,000 | 2,000 | 0.25x |" in text
    assert "| userspace->kernel | 1 KiB | 200 | 0.20 | 0.50x |" in text  # one-way table
    assert "### RDS/IB request/response" in text and "### RDS/IB one-way" in text


def test_report_without_ib_says_how_to_measure_it(bench: dict[str, ModuleType], tmp_path: Path) -> None:
    report = bench["report"]
    text = "\n".join(report._ib_section(None))
    assert "--sections ib --merge" in text
    data = {"date": "d", "machine": "m", "duration_s": 3.0, "results": _ib_rows(), "percall": []}
    md = tmp_path / "b.md"
    report.write_report({**data, "ib": {"rows": _ib_rows(), "duration_s": 3.0}}, md, tmp_path / "b.png")
    out = md.read_text()
    assert out.index("## Memory per queued message") < out.index("## RDS/IB over rdma_rxe")
    assert "soft-RoCE on a dummy netdev" in out.split("## ")[0]  # the header names the IB section too


class FakePeerAgent:
    """Records what PeerPassive asks of a peer guest's agent."""

    def __init__(self) -> None:
        self.log: list[Any] = []
        self.broken: str | None = None
        self.jobs = 0

    def socket(self, backend: str) -> Any:
        agent = self

        class Sock:
            def setsockopt(self, *args: Any) -> None:
                agent.log.append(("setsockopt", *args))

            def bind(self, addr: Any) -> None:
                agent.log.append(("bind", addr))

            def close(self) -> None:
                agent.log.append(("close",))

        self.log.append(("socket", backend))
        return Sock()

    def job(self, func: str, socks: Any, **kwargs: Any) -> int:
        self.jobs += 1
        self.log.append(("job", func, kwargs))
        return self.jobs

    def wait(self, jid: int, timeout: float | None = None) -> Any:
        self.log.append(("wait", jid))
        return True


def test_a_peer_guests_passive_side_is_its_agents_job(bench: dict[str, ModuleType]) -> None:
    """kernel->userspace: the passive side on the peer guest is a userspace socket of its agent, pinned to IB
    and bound to the node's address and the scenario's port, served by an allowed job until stop (the stop
    job, then the serving job's end, then the socket's close)."""
    from topology import Node

    from pyrds.constants import SOL_RDS, SockOpt, Transport
    from pyrds.testing import peeragent

    cells = bench["cells"]
    agent = FakePeerAgent()
    node = Node(None, "10.99.0.2", agent=agent)
    server = cells.start_passive(node, "userspace", 4341, "ib", 900.0)
    assert isinstance(server, cells.PeerPassive) and server.alive()
    server.stop()
    server.stop()  # once only
    assert not server.alive()
    assert agent.log == [
        ("socket", "userspace"),
        ("setsockopt", SOL_RDS, SockOpt.SO_RDS_TRANSPORT, int(Transport.IB)),
        ("bind", ("10.99.0.2", 4341)),
        ("job", "pyrds.testing.workloads:stress_passive", {"seconds": 900.0}),
        ("job", "pyrds.testing.workloads:stress_passive_stop", {}),
        ("wait", 2),
        ("wait", 1),
        ("close",),
    ]
    assert {e[1] for e in agent.log if e[0] == "job"} <= peeragent.JOBS
    with pytest.raises(RuntimeError):
        cells.start_passive(node, "kernel", 4342, "ib", 900.0)  # the peer guest has no kernel node


def test_a_peer_pairing_is_recorded_with_its_nodes_addresses(
    bench: dict[str, ModuleType], world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kernel->userspace runs on the two guests' link addresses, not the fabric's: the report's pairs say
    where the rows ran."""
    ibs = bench["ib_section"]
    w = world()

    class Pair:
        a, b = FakeNode("10.99.0.1", {}), FakeNode("10.99.0.2", {})

        def destroy(self) -> None:
            pass

    monkeypatch.setattr(ib.IbPair, "create", classmethod(lambda _cls, pair, fabric: Pair()))
    monkeypatch.setattr(ibs, "measure_cells", lambda *a, **kw: [])
    k2u = [sc for sc in ibs.IB_SCENARIOS if sc[0] in ibs.PEER_SCENARIOS]
    got = ibs.measure(k2u, ["rr"], [1024], 3.0)
    assert got["pairs"]["kernel-userspace"] == {"a": "10.99.0.1", "b": "10.99.0.2", "error": None}
    assert w.log == []
