"""pyrds.testing.kernelinfo: kernel lines, the 7.0 fix-series boundary and the fixed outcome of a race."""

from __future__ import annotations

import pytest

from pyrds.testing.kernelinfo import KernelRace, before_fix_series, kernel_line, race_recorded, short_alias


def test_kernel_lines_and_aliases() -> None:
    assert kernel_line("6.12.117+deb13-amd64") == (6, 12)
    assert kernel_line("weird") is None
    assert short_alias("6.1.0-56-amd64") == "6.1"
    assert short_alias("7.3.4+deb13-amd64") == "7.3"
    assert short_alias("weird") == "weird"


def test_fix_series_boundary() -> None:
    assert before_fix_series("6.1.0-56-amd64") and before_fix_series("6.12.117+deb13-amd64")
    assert not before_fix_series("7.0.1") and not before_fix_series("7.3.4+deb13-amd64")
    assert not before_fix_series("weird")  # unknown: strict
    race = KernelRace("r", "why")
    assert race.present("6.1.0-56-amd64") and not race.present("7.3.4+deb13-amd64")


@pytest.mark.parametrize("exact", [True, False])
def test_a_race_always_records_the_same_outcome(exact: bool, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(pytest.xfail.Exception) as exc:
        KernelRace("netem-resets", "fixed reason").record(exact, f"received {1999 if not exact else 2000}")
    assert str(exc.value) == "netem-resets (kernel < 7.0): fixed reason"  # the same whatever arrived
    assert ("NOT exact" in capsys.readouterr().out) is (not exact)


def test_a_recorded_race_marks_the_namespaces_for_a_rebuild() -> None:
    """The two-node fixture asks race_recorded() after each test and rebuilds the namespaces when a race was
    recorded: the kernel's RDS/TCP state there may be wedged."""
    race_recorded()
    assert race_recorded() is False
    with pytest.raises(pytest.xfail.Exception):
        KernelRace("reset-stall", "why").record(False, "1628 of 2000")
    assert race_recorded() is True
    assert race_recorded() is False  # cleared by the call
