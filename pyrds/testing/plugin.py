"""pytest plugin (entry point ``pytest11: pyrds``): backend fixtures for side-by-side RDS conformance tests.

Fixtures
- ``rds_backend``: ``"kernel"`` / ``"userspace"`` (parametrized). An unavailable backend is a SKIP with the
  reason (e.g. no AF_RDS on this kernel), never a pass.
- ``rds_socket_factory``: ``make() -> socket`` on the chosen backend; every socket is closed after the test.
- ``rds_pair``: two sockets bound on 127.0.0.1 (loop transport), 5 s timeouts.
- ``rds_two_nodes``: :class:`pyrds.testing.topology.TwoNodes`, node A and node B in two netns joined by a
veth,
  parametrized kernel-kernel, userspace-userspace, kernel-userspace, userspace-kernel (mixed, both
  directions).
  Each node's sockets live in an agent process inside its namespace (:mod:`pyrds.testing.agent`).
- ``rds_ib_pair``: :class:`pyrds.testing.ib.IbPair`, node A and node B on two addresses of one rxe device in
  the initial namespace, sockets pinned to RDS/IB; parametrized userspace-userspace (rds_rdma unloaded
  meanwhile; it runs first), kernel-kernel, userspace-kernel and kernel-userspace (not covered on one
  machine: a skip saying so). Its scenarios are marked ``rds_ib`` and run only with ``--rds-ib``, which runs
  nothing else (they need the initial namespace to themselves: a phase of their own after the main suite).
- ``rds_observe(key, value)``: record an observable for the report's divergence check.
- ``rds_message_count``: ``--rds-messages`` (default 2000; the kernel selftest uses 50000).
- ``rds_mainline_count``: ``--rds-mainline-messages`` (default 5000).
- ``rds_ib_selftest_count``: ``--rds-ib-selftest-messages`` (default 1000; issue 9 asks for 50000 on demand).
- ``rds_round``: 0, or with ``--rds-rounds N`` (N > 1) the test runs N times as ``[round1]``..``[roundN]``.

Hang guard: ``--rds-timeout`` (``$PYRDS_TEST_TIMEOUT``, default 900 s) fails a test with
:class:`RdsTestTimeout` (SIGALRM, main thread only) **only** when the test uses one of the fixtures above or
is marked ``@pytest.mark.rds_timeout`` (``rds_timeout(seconds)`` sets its own limit) or ``rds_differential``.
For a test that takes a message count it grows with the count over its default (:func:`count_scale`).
Every other test of a project that merely has pyrds installed is never timed by this plugin.

Every test item gets ``user_properties`` ``rds_scenario`` / ``rds_backend`` (kernel, userspace,
mixed:A-B) that
end up in the JUnit XML; ``--rds-results FILE`` also writes them, with outcomes, as JSON for
``python -m pyrds.testing.report``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

BACKENDS = ("kernel", "userspace")
PAIRS = ("kernel-kernel", "userspace-userspace", "kernel-userspace", "userspace-kernel")
#: the RDS/IB pairings, in the order they run: userspace-userspace first, with rds_rdma unloaded before the
#: kernel ever had an RDS/IB connection, then the others with it loaded again (pyrds.testing.ib.PAIRS; not
#: imported from there: ib imports the agent and info modules, which the plugin loads only when used)
IB_PAIRS = ("userspace-userspace", "kernel-kernel", "userspace-kernel", "kernel-userspace")
_unavailable_cache: dict[str, str | None] = {}


def backend_unavailable(name: str) -> str | None:
    """None when ``name`` can make sockets here, else why not (used as the skip reason)."""
    if name not in _unavailable_cache:
        _unavailable_cache[name] = _probe(name)
    return _unavailable_cache[name]


def _probe(name: str) -> str | None:
    import importlib

    if name == "kernel":
        import pyrds

        if not pyrds.kernel_available():
            return (
                "kernel backend: AF_RDS is not available on this kernel (rds module missing; run in the VM)"
            )
    try:
        mod = importlib.import_module(f"pyrds.{name}")
        getattr(mod, "RDSSocket")  # noqa: B009 - attribute presence is the probe
    except (ImportError, AttributeError) as exc:
        return f"{name} backend not importable: {exc}"
    try:
        import pyrds

        if name == "userspace":
            from pyrds.testing.agent import start_userspace_stack

            start_userspace_stack()
        pyrds.socket(name).close()  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - any failure to create a socket means unavailable
        return f"{name} backend cannot create a socket: {exc!r}"
    return None


def pair_label(pair: str) -> str:
    a, b = pair.split("-")
    return a if a == b else f"mixed:{pair}"


# ------------------------------------------------------------------------------------------------ options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pyrds", "pyrds conformance")
    group.addoption(
        "--rds-messages",
        type=int,
        default=int(os.environ.get("PYRDS_MESSAGES", "2000")),
        help="messages per direction in the selftest scenario (default 2000; kernel selftest: 50000)",
    )
    group.addoption(
        "--rds-mainline-messages",
        type=int,
        default=int(os.environ.get("PYRDS_MAINLINE_MESSAGES", "5000")),
        help="messages in the mainline selftest scenario (default 5000; the kernel's selftest: 50000)",
    )
    group.addoption(
        "--rds-ib-selftest-messages",
        type=int,
        default=int(os.environ.get("PYRDS_IB_SELFTEST_MESSAGES", "1000")),
        help="messages in the RDS/IB selftest scenario, both nodes together (default 1000, a few seconds a "
        "pairing; issue 9: 50000)",
    )
    group.addoption(
        "--rds-only",
        default=None,
        help="comma list of backend labels to keep: kernel,userspace,mixed (others deselected)",
    )
    group.addoption(
        "--rds-rounds",
        type=int,
        default=int(os.environ.get("PYRDS_ROUNDS", "1")),
        help="run each scenario that takes the rds_round fixture (the selftest scenarios) this many "
        "times in one session, as [round1]..[roundN] (default 1: no round in the test id)",
    )
    group.addoption("--rds-results", default=None, help="write per-test outcomes and observations as JSON")
    group.addoption(
        "--rds-ib",
        action="store_true",
        default=False,
        help="run the RDS/IB scenarios (marked rds_ib) and nothing else; without it they are deselected. "
        "They build an rxe device in the initial namespace and unload rds_rdma for a while, so they run in "
        "a session of their own, after the main suite (tox -e conformance does both in each guest)",
    )
    # a guard against hangs, not a speed limit: how busy the machine is must not decide an outcome (stalls are
    # detected by the scenarios themselves, as no progress for a while)
    group.addoption(
        "--rds-timeout",
        type=float,
        default=float(os.environ.get("PYRDS_TEST_TIMEOUT", "900")),
        help="fail a test that uses the pyrds fixtures or the rds_timeout marker when it runs longer "
        "than this many seconds (SIGALRM; default 900, 0 = off); other tests are never timed by pyrds",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rds_scenario(name): override the scenario name used in the report")
    config.addinivalue_line(
        "markers", "rds_differential: runs both backends at once (report column 'differential')"
    )
    config.addinivalue_line(
        "markers", "rds_ib: an RDS/IB scenario: runs only with --rds-ib (a session of its own)"
    )
    config.addinivalue_line(
        "markers",
        "rds_timeout(seconds=None): arm pyrds' hang guard (--rds-timeout, or the given seconds) for this "
        "test; tests that use the pyrds fixtures have it anyway, other tests never",
    )
    config._pyrds_results = {}  # type: ignore[attr-defined]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``rds_round``: 0 once by default (test ids unchanged); ``--rds-rounds N`` makes N rounds."""
    if "rds_round" not in metafunc.fixturenames:
        return
    rounds = int(metafunc.config.getoption("--rds-rounds"))
    if rounds < 1:
        raise pytest.UsageError(f"--rds-rounds must be >= 1, not {rounds}")
    if rounds > 1:  # overrides the rds_round fixture (0) by direct parametrization
        metafunc.parametrize("rds_round", range(rounds), ids=[f"round{i + 1}" for i in range(rounds)])


def _labels_of(item: pytest.Item) -> tuple[str, str] | None:
    mod = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
    if item.get_closest_marker("rds_differential") is not None:
        return f"{mod}::{getattr(item, 'originalname', item.name)}", "differential"
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    params: dict[str, Any] = dict(callspec.params)
    if "rds_backend" in params:
        backend = param_id = str(params.pop("rds_backend"))
    elif "_rds_topology" in params or "_rds_ib_topology" in params:
        key = "_rds_topology" if "_rds_topology" in params else "_rds_ib_topology"
        param_id = str(params.pop(key))  # "kernel-kernel": its id is both words, not the label
        backend = pair_label(param_id)
    else:
        return None
    name = getattr(item, "originalname", item.name)
    scenario = f"{mod}::{name}"
    if "[" in item.name and params:
        parts = item.name[item.name.index("[") + 1 : -1].split("-")
        drop = param_id.split("-")
        for i in range(len(parts) - len(drop) + 1):
            if parts[i : i + len(drop)] == drop:
                del parts[i : i + len(drop)]
                break
        if parts:
            scenario += "[" + "-".join(parts) + "]"
    marker = item.get_closest_marker("rds_scenario")
    if marker is not None:
        scenario = str(marker.args[0])
    return scenario, backend


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only = config.getoption("--rds-only")
    keep = {x.strip() for x in only.split(",")} if only else None
    ib_phase = bool(config.getoption("--rds-ib"))
    selected, deselected = [], []
    for item in items:
        if (item.get_closest_marker("rds_ib") is not None) != ib_phase:
            deselected.append(item)  # the IB phase runs the rds_ib scenarios and only them
            continue
        labels = _labels_of(item)
        if labels is not None:
            item.user_properties.append(("rds_scenario", labels[0]))
            item.user_properties.append(("rds_backend", labels[1]))
            if keep is not None and labels[1].split(":")[0] not in keep:
                deselected.append(item)
                continue
        selected.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


class RdsTestTimeout(Exception):
    """A conformance test exceeded --rds-timeout (a hang is a failure, never a pass or a stuck run)."""


# the fixtures this plugin defines: a test that uses any of them (directly or through another fixture) is a
# pyrds test and gets the hang guard
PLUGIN_FIXTURES = frozenset(
    {
        "rds_backend",
        "rds_socket_factory",
        "rds_pair",
        "rds_two_nodes",
        "_rds_topology",
        "rds_ib_pair",
        "_rds_ib_topology",
        "rds_observe",
        "rds_message_count",
        "rds_mainline_count",
        "rds_ib_selftest_count",
        "rds_round",
    }
)


def timeout_for(item: pytest.Item) -> float:
    """Seconds after which the hang guard fails ``item``; 0 when the plugin leaves the test alone (it uses no
    pyrds fixture and has neither the ``rds_timeout`` nor the ``rds_differential`` marker)."""
    limit = float(item.config.getoption("--rds-timeout") or 0)
    marker = item.get_closest_marker("rds_timeout")
    if marker is not None:
        seconds = marker.args[0] if marker.args else marker.kwargs.get("seconds")
        if seconds is not None:
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
                raise TypeError(f"rds_timeout(seconds): a number >= 0, not {seconds!r}")
            return float(seconds)
        return limit
    if item.get_closest_marker("rds_differential") is not None:
        return limit
    names = set(getattr(item, "fixturenames", ()))
    if PLUGIN_FIXTURES.intersection(names):
        return limit * count_scale(item.config, names)
    return 0.0


#: the message counts the default hang guard is sized for (the options' defaults)
DEFAULT_COUNTS = {
    "rds_mainline_count": ("--rds-mainline-messages", 5000),
    "rds_message_count": ("--rds-messages", 2000),
    "rds_ib_selftest_count": ("--rds-ib-selftest-messages", 1000),
}


def count_scale(config: pytest.Config, fixturenames: set[str]) -> float:
    """How much longer than at the default message count a scenario may take: the hang guard (and the
    scenario's own overall bound) grow with its message count option (:data:`DEFAULT_COUNTS`), so a
    50,000-message run on a busy machine is not failed by a limit sized for 5,000 (a stall still fails it)."""
    scale = 1.0
    for name, (option, default) in DEFAULT_COUNTS.items():
        if name in fixturenames:
            scale = max(scale, float(config.getoption(option)) / default)
    return scale


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    limit = timeout_for(item)
    if not limit or threading.current_thread() is not threading.main_thread():
        return (yield)

    def on_alarm(signum: int, frame: Any) -> None:
        raise RdsTestTimeout(f"{item.nodeid} exceeded {limit:g} s (pyrds hang guard, --rds-timeout)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return (yield)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Fold setup/call/teardown into one outcome per test (controller side, works under xdist)."""
    config = getattr(pytest_runtest_logreport, "_config", None)
    if config is None:
        return
    results: dict[str, dict[str, Any]] = config._pyrds_results
    entry = results.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed", "props": {}})
    for k, v in report.user_properties:
        if k.startswith("rds_"):
            entry["props"][k] = v
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" or entry["outcome"] != "failed" else "failed"
        entry.setdefault("longrepr", str(report.longrepr)[-4000:])
    elif report.skipped and entry["outcome"] == "passed":
        if hasattr(report, "wasxfail"):
            entry["outcome"] = "xfailed"
            entry["reason"] = str(report.wasxfail)  # what the test saw (shown beside the divergence)
        else:
            entry["outcome"] = "skipped"
            lr = report.longrepr
            entry["reason"] = lr[2] if isinstance(lr, tuple) else str(lr)
    entry["duration"] = entry.get("duration", 0.0) + report.duration
    # where the time went (pyrds.testing.timings): the test's wall-clock span and the xdist worker that ran it
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if isinstance(start, float) and isinstance(stop, float):
        entry["start"] = min(entry.get("start", start), start)
        entry["stop"] = max(entry.get("stop", stop), stop)
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
    if isinstance(worker, str):
        entry["worker"] = worker


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    pytest_runtest_logreport._config = session.config  # type: ignore[attr-defined]
    session.config._pyrds_session_start = time.time()  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--rds-results")
    if not path or hasattr(session.config, "workerinput"):
        return
    import platform

    data = {
        "kernel_release": platform.release(),  # the report's kernel alias (major.minor) comes from it
        "tests": list(session.config._pyrds_results.values()),  # type: ignore[attr-defined]
        # epoch seconds (controller): with each test's start/stop/worker they show start-up and idle workers
        "session_start": getattr(session.config, "_pyrds_session_start", None),
        "session_finish": time.time(),
    }
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(params=BACKENDS)
def rds_backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    reason = backend_unavailable(name)
    if reason:
        pytest.skip(reason)
    return name


@pytest.fixture
def rds_socket_factory(rds_backend: str) -> Iterator[Callable[[], Any]]:
    import pyrds

    made: list[Any] = []

    def make() -> Any:
        sock = pyrds.socket(rds_backend)  # type: ignore[arg-type]
        made.append(sock)
        return sock

    yield make
    for sock in made:
        with contextlib.suppress(Exception):
            sock.close()


@pytest.fixture
def rds_pair(rds_socket_factory: Callable[[], Any]) -> tuple[Any, Any]:
    a, b = rds_socket_factory(), rds_socket_factory()
    for s in (a, b):
        s.bind(("127.0.0.1", 0))
        s.settimeout(5.0)
    return a, b


@pytest.fixture(scope="session", params=PAIRS)
def _rds_topology(request: pytest.FixtureRequest) -> Iterator[Any]:
    from pyrds.testing.topology import TwoNodes, netns_supported

    pair: str = request.param
    reason = netns_supported()
    if reason:
        pytest.skip(reason)
    for backend in set(pair.split("-")):
        reason = backend_unavailable(backend)
        if reason:
            pytest.skip(reason)
    nodes = TwoNodes.create(pair.split("-"))
    yield nodes
    nodes.destroy()


@pytest.fixture
def rds_two_nodes(_rds_topology: Any) -> Iterator[Any]:
    from pyrds.testing.kernelinfo import race_recorded

    race_recorded()  # only races recorded by this test count below
    if not _rds_topology.healthy():
        # an earlier test left an agent unusable (timeout) or met a known kernel race (the kernel's RDS/TCP
        # state may be wedged): fresh namespaces and agents
        _rds_topology.rebuild()
    yield _rds_topology
    if race_recorded():
        _rds_topology.suspect = True
    _rds_topology.clear_netem()
    for n in _rds_topology.nodes:
        n.close_sockets()


@pytest.fixture(scope="session", params=IB_PAIRS)
def _rds_ib_topology(request: pytest.FixtureRequest) -> Iterator[Any]:
    """One IB pairing (pyrds.testing.ib), built once per session and pairing, in the order of the params:
    userspace-userspace first (rds_rdma unloaded while it lives, before the kernel had any RDS/IB
    connection), then the pairings with rds_rdma loaded. The rxe fabric is built with the first pairing and
    removed at the end of the session."""
    from pyrds.testing import ib

    pair: str = request.param
    reason = ib.not_covered(pair) or ib.ib_unavailable()
    if "kernel" in pair.split("-"):
        reason = reason or backend_unavailable("kernel")
    # no userspace probe here: it would start this namespace's shared stack, which attaches RDS/IB once the
    # rxe device exists; each userspace node starts a stack of its own, and a failure to do so fails the test
    if reason:
        pytest.skip(reason)
    fabric = getattr(request.config, "_pyrds_ib_fabric", None)
    if fabric is None:
        fabric = ib.IbFabric.create()
        request.config._pyrds_ib_fabric = fabric  # type: ignore[attr-defined]
        request.config.add_cleanup(fabric.destroy)
    try:
        nodes = ib.IbPair.create(pair, fabric)
    except ib.UnsafeUnload as exc:
        pytest.skip(str(exc))
    yield nodes
    nodes.destroy()


@pytest.fixture
def rds_ib_pair(_rds_ib_topology: Any) -> Iterator[Any]:
    if not _rds_ib_topology.healthy():
        pytest.fail(f"{_rds_ib_topology.label}: an agent of this IB pairing died or timed out earlier")
    yield _rds_ib_topology
    _rds_ib_topology.close_sockets()


@pytest.fixture
def rds_observe(request: pytest.FixtureRequest) -> Callable[[str, Any], None]:
    def observe(key: str, value: Any) -> None:
        request.node.user_properties.append((f"rds_obs.{key}", repr(value)))

    return observe


@pytest.fixture
def rds_round() -> int:
    """Which round of a repeated scenario this is (0-based); 0 unless ``--rds-rounds N`` > 1."""
    return 0


@pytest.fixture
def rds_mainline_count(request: pytest.FixtureRequest) -> int:
    count: int = request.config.getoption("--rds-mainline-messages")
    return count


@pytest.fixture
def rds_ib_selftest_count(request: pytest.FixtureRequest) -> int:
    count: int = request.config.getoption("--rds-ib-selftest-messages")
    return count


@pytest.fixture
def rds_message_count(request: pytest.FixtureRequest) -> int:
    count: int = request.config.getoption("--rds-messages")
    return count


@pytest.fixture
def rds_count_scale(request: pytest.FixtureRequest) -> float:
    """The factor the hang guard of this test grows by with its message count (:func:`count_scale`): a
    scenario multiplies its own overall bound by it, so that bound stays below the guard at every count."""
    return count_scale(request.config, set(request.fixturenames))
