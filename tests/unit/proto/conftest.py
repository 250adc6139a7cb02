"""Hypothesis in these tests: no per-example deadline. A deadline is a timing assertion (200 ms per
example by default), and on a busy 2-core CI machine an example of the framer or path engine has taken
longer for no fault of the code (``test_proto_framer_cong``, seen under ``-n 2``). Speed is measured in
benchmarks, never in unit tests."""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("pyrds-unit", deadline=None)
settings.load_profile("pyrds-unit")
