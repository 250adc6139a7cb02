"""Stack-wide control: sysctl-like settings through the service, embedded Service, service death."""

from __future__ import annotations

import errno
import threading

import pytest

from pyrds.userspace import control
from pyrds.userspace.client import RDSSocket
from pyrds.userspace.service import Service


def test_sysctl_roundtrip_and_unknown_name() -> None:
    values = control.sysctl_get()
    assert values["reconnect_min_delay_ms"] == 1 and values["reconnect_max_delay_ms"] == 1000
    control.sysctl_set("reconnect_max_delay_ms", 500)
    assert control.sysctl_get()["reconnect_max_delay_ms"] == 500
    with pytest.raises(OSError) as ei:
        control.sysctl_set("no_such_knob", 1)
    assert ei.value.errno == errno.ENOENT
    control.force_reconnect()  # no connections: a no-op, but the knob exists


def test_tcp_user_timeout_setting_is_bounded() -> None:
    """``rds_tcp_user_timeout_ms`` (pyrds only): 30 s by default; TCP_USER_TIMEOUT takes 0 .. 2**31 - 1 ms,
    anything else is EINVAL and leaves the value as it was."""
    assert control.sysctl_get()["rds_tcp_user_timeout_ms"] == 30_000
    for bad in (-1, 1 << 31):
        with pytest.raises(OSError) as ei:
            control.sysctl_set("rds_tcp_user_timeout_ms", bad)
        assert ei.value.errno == errno.EINVAL
    assert control.sysctl_get()["rds_tcp_user_timeout_ms"] == 30_000
    control.sysctl_set("rds_tcp_user_timeout_ms", 0)
    assert control.sysctl_get()["rds_tcp_user_timeout_ms"] == 0


def test_embedded_service_in_a_thread_and_its_death() -> None:
    svc = Service()
    svc.bind()
    th = threading.Thread(target=svc.serve_forever, daemon=True)
    th.start()
    s = RDSSocket()
    s.bind(("127.0.0.1", 4700))
    assert s.getsockname() == ("127.0.0.1", 4700)
    svc.stop()
    th.join(5)
    assert not th.is_alive()
    with pytest.raises(OSError) as ei:
        s.getsockname()
    assert ei.value.errno == errno.EPIPE
