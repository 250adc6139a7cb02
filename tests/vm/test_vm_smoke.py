"""Boot real bookworm 6.1 guests through the harness (slow: ~30-60 s per boot under TCG).

Runs only when asked: ``PYRDS_RUN_VM_TESTS=1 python -m pytest tests/vm -v`` (on the host, never in a guest).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("PYRDS_RUN_VM_TESTS") != "1", reason="set PYRDS_RUN_VM_TESTS=1 to boot VMs"
    ),
    pytest.mark.skipif(os.environ.get("PYRDS_IN_GUEST") == "1", reason="host-side test (boots guests)"),
]

CHECK = textwrap.dedent(
    """
    import os, socket, sys
    s = socket.socket(21, socket.SOCK_SEQPACKET)
    s.bind(("127.0.0.1", 0))
    print("GUEST-AF_RDS-OK", s.getsockname(), "in_guest=" + os.environ.get("PYRDS_IN_GUEST", "?"))
    import pyverbs, pyrds
    print("GUEST-IMPORTS-OK", pyverbs.__file__, pyrds.__file__)
    import subprocess
    nft = ["nft", "list", "table", "inet", "pyrds_pin_hooks"]
    table = subprocess.run(nft, capture_output=True, text=True)
    if all(f"hook {h} " in table.stdout for h in ("prerouting", "input", "forward", "output", "postrouting")):
        print("GUEST-NF-PINNED")
    sys.exit(7)
    """
)


def _vm(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vm", "run", "--timeout", str(timeout - 60), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_af_rds_socket_in_guest_and_exit_status() -> None:
    res = _vm("--", "python3", "-c", CHECK)
    assert "GUEST-AF_RDS-OK" in res.stdout, res.stdout + res.stderr
    assert "in_guest=1" in res.stdout
    assert "GUEST-IMPORTS-OK" in res.stdout, res.stderr
    assert "GUEST-NF-PINNED" in res.stdout, res.stdout  # vm/guest.py pin_netfilter_hooks
    assert res.returncode == 7, res.stderr  # CMD's status comes back to the host
    assert "boot to CMD" in res.stderr


def test_a_kernel_panic_is_reported_with_the_guest_console() -> None:
    """A guest kernel that dies mid-command (here: sysrq crash) ends the run with status 125 and the console's
    last lines (the panic) in the harness's report."""
    res = _vm("--", "sh", "-c", "echo c > /proc/sysrq-trigger; sleep 60")
    assert res.returncode == 125, res.stdout + res.stderr
    assert "no exit status" in res.stderr
    assert "Kernel panic - not syncing" in res.stderr and "sysrq" in res.stderr.lower(), res.stderr


def test_junit_is_copied_back(tmp_path: Path) -> None:
    test_file = tmp_path / "test_in_guest.py"
    test_file.write_text("import socket\n\ndef test_rds():\n    socket.socket(21, 5).close()\n")
    junit = tmp_path / "out" / "junit.xml"
    res = _vm(
        "--junit", str(junit), "--", "python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)
    )
    assert res.returncode == 0, res.stdout + res.stderr
    xml = junit.read_text()
    assert 'tests="1"' in xml and 'failures="0"' in xml


@pytest.mark.parametrize("transport", ["ib", "tcp"])
def test_two_guests_rds_echo(transport: str) -> None:
    """RDS between two guests joined by a QEMU socket netdev: IB over rdma_rxe, and RDS/TCP, pinned with
    SO_RDS_TRANSPORT on both ends (the echo client fails on any lost or corrupted round trip)."""
    res = _vm(
        "--topology",
        "two-guests",
        "--peer-cmd",
        f"python3 -m vm.rds_echo serve --transport {transport}",
        "--",
        "python3",
        "-m",
        "vm.rds_echo",
        "client",
        "--transport",
        transport,
        "--count",
        "50",
        timeout=1200,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"round trips over {transport}" in res.stdout


@pytest.mark.parametrize(
    ("server", "client"),
    [("userspace", "kernel"), ("kernel", "userspace")],
    ids=["kernel-to-userspace", "userspace-to-kernel"],
)
def test_two_guests_ib_mixed(server: str, client: str) -> None:
    """RDS/IB over rdma_rxe between a kernel node and a userspace node, each in its own guest: the client
    dials, so ``kernel-to-userspace`` is the kernel's rds_rdma connecting to the userspace stack's rdma_cm
    listener (port 18634), which one machine cannot host (tests/conformance/test_ib.py reports it as not
    covered). The userspace guest unloads rds_rdma first (while the kernel's rds_rdma is loaded, port 18634
    is the kernel's and the userspace stack is active-only); the echo client fails on any lost or corrupted
    round trip."""

    def cmd(role: str, backend: str) -> str:
        unload = "modprobe -r rds_rdma && " if backend == "userspace" else ""
        return f"{unload}exec python3 -m vm.rds_echo {role} --transport ib --backend {backend}"

    res = _vm(
        "--topology",
        "two-guests",
        "--peer-cmd",
        f"sh -c '{cmd('serve', server)}'",
        "--",
        "sh",
        "-c",
        cmd("client", client) + " --count 40 --size 65536 --timeout 30",
        timeout=1200,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"40 x 65536 B round trips over ib ({client} client)" in res.stdout
