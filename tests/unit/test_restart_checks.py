"""The restart scenarios' verdicts (pyrds/testing/restart.py): what counts as delivered twice, out of order or
more than was sent, so that both the host test and the conformance scenario fail on it."""

from __future__ import annotations

import pytest

from pyrds.testing.restart import check_across_restart, check_prefix_of_told, expected_per_socket, per_socket


def test_a_clean_restart_counts_what_died_with_the_service() -> None:
    got = [(1, 0, 0), (1, 1, 0), (1, 0, 1), (2, 0, 0)]
    old = per_socket(got, 1, 2)
    assert old == {0: [0, 1], 1: [0]}
    new = {0: [4, 5], 1: [1, 2]}
    assert check_across_restart(old, new, [6, 3]) == 2  # socket 0 lost 2 and 3


@pytest.mark.parametrize(
    ("new", "why"),
    [({0: [1, 2, 3], 1: []}, "twice"), ({0: [2, 4, 3], 1: []}, "in order"), ({0: [2, 3], 1: []}, "in order")],
)
def test_a_duplicate_a_reordering_or_a_missing_tail_fails(new: dict[int, list[int]], why: str) -> None:
    with pytest.raises(AssertionError, match=why):
        check_across_restart({0: [0, 1], 1: []}, new, [5, 0])


def test_the_survivor_may_not_get_more_than_the_sender_was_told() -> None:
    assert check_prefix_of_told({0: [0, 1], 1: []}, [3, 1]) == 2
    with pytest.raises(AssertionError, match="more received"):
        check_prefix_of_told({0: [0, 1, 2]}, [2])
    with pytest.raises(AssertionError, match="in order"):
        check_prefix_of_told({0: [1]}, [2])
    assert [expected_per_socket(10, 4, i) for i in range(4)] == [3, 3, 2, 2]
