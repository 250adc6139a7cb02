"""``tox -e fuzz``: the full-size fuzz runs. ``--fuzz-count N`` (or PYRDS_FUZZ_COUNT) sets the number of
inputs of each kind; without either the tests here are skipped, so a bare ``pytest`` stays quick."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-count",
        type=int,
        default=int(os.environ["PYRDS_FUZZ_COUNT"]) if os.environ.get("PYRDS_FUZZ_COUNT") else None,
        help="inputs of each kind (control records, wire inputs, PathEngine inputs); tox -e fuzz: 1000000",
    )


@pytest.fixture
def fuzz_count(request: pytest.FixtureRequest) -> int:
    count = request.config.getoption("--fuzz-count")
    if count is None:
        pytest.skip("full-size fuzz: run tox -e fuzz, or pass --fuzz-count N / PYRDS_FUZZ_COUNT=N")
    return int(count)
