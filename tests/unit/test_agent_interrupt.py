"""A request interrupted between request and reply (a test timeout's SIGALRM) must not leave a stale reply to
be read as the answer to the next request: the agent is marked unusable and the topology rebuilds it."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from pyrds.testing.agent import Agent, AgentError


class Interrupted(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Interrupted


def test_interrupted_request_poisons_agent() -> None:
    agent = Agent(name="t")
    try:
        jid = agent.request("job", "pyrds.testing.workloads:sleep", [], {"seconds": 1.5})
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            with pytest.raises(Interrupted):
                agent.wait(jid, 10)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        assert agent.broken is not None
        # without the guard this read the late reply of ``wait`` as the answer to getpid
        with pytest.raises(AgentError, match="unusable"):
            agent.request("getpid")
    finally:
        agent.close()
