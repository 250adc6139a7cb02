"""``python -m pyrds.dropin program.py``: an unmodified stdlib AF_RDS program gets the kernel's behaviour on
the userspace stack (host without AF_RDS)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import pyrds
from pyrds import dropin

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).with_name("data") / "stdlib_rds_program.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}

# what the kernel does for that program (the conformance suite checks each of these on the kernel:
# test_addressing bind rules, test_sendrecv SO_RCVBUF doubling and truncation, af_rds.c rds_create)
KERNEL = {
    "isinstance": True,
    "ports_ok": True,
    "rcvbuf": 8192,
    "rebind": "EINVAL",
    "poll_before": [],
    "sent": 9,
    "data": "hello rds",
    "from_sender": True,
    "empty_recv": "EAGAIN",
    "truncated": "0123",
    "send_unconnected": "ENOTCONN",
    "dgram": "ESOCKTNOSUPPORT",
}


def _expected() -> dict[str, object]:
    import select

    return {**KERNEL, "poll_after": [select.POLLIN]}  # registered for POLLIN: only that bit is reported


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120
    )


def test_program_runs_under_the_dropin_with_kernel_behaviour() -> None:
    proc = _run("-m", "pyrds.dropin", "--backend", "userspace", str(PROGRAM))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == _expected()


@pytest.mark.skipif(pyrds.kernel_available(), reason="this kernel has AF_RDS: the program runs without help")
def test_without_the_dropin_the_program_fails_here() -> None:
    proc = _run(str(PROGRAM))
    assert proc.returncode != 0 and "Address family not supported" in proc.stderr, proc.stderr
    # auto: the drop-in steps in because the kernel has no AF_RDS
    proc = _run("-m", "pyrds.dropin", str(PROGRAM))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == _expected()


def test_program_arguments_exit_status_and_sys_path(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    (tmp_path / "helper_mod.py").write_text("VALUE = 'from the program directory'\n")
    prog.write_text(
        "import sys, helper_mod\nprint(sys.argv, __name__, helper_mod.VALUE)\nsys.exit(int(sys.argv[2]))\n"
    )
    proc = _run("-m", "pyrds.dropin", str(prog), "first", "3")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.strip() == f"[{str(prog)!r}, 'first', '3'] __main__ from the program directory"
    proc = _run("-m", "pyrds.dropin", str(tmp_path / "missing.py"))
    assert proc.returncode == 2 and "can't open file" in proc.stderr


def test_patch_is_for_af_rds_only_and_reversible() -> None:
    dropin.install()
    try:
        assert dropin.installed()
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            assert type(tcp).__mro__[1] is dropin._ORIGINAL_SOCKET
            assert isinstance(tcp, socket.socket) and tcp.family == socket.AF_INET
            a, b = socket.socketpair()
            a.close()
            b.close()
        finally:
            tcp.close()
        rds = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK)
        try:
            assert isinstance(rds, pyrds.RDSSocketBase) and isinstance(rds, socket.socket)
            assert rds.backend == "userspace" and rds.gettimeout() == 0.0
            with pytest.raises(OSError) as info:
                socket.fromfd(rds.fileno(), socket.AF_RDS, socket.SOCK_SEQPACKET)
            assert info.value.errno == 95 and "fromfd" in str(info.value)
        finally:
            rds.close()
        with pytest.raises(OSError) as info:
            socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET, 1)
        assert info.value.errno == 94  # ESOCKTNOSUPPORT, as rds_create
    finally:
        dropin.uninstall()
    assert not dropin.installed() and socket.socket is dropin._ORIGINAL_SOCKET
