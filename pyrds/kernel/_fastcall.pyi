# Types of the optional C module pyrds/kernel/_fastcall.c (built by setup.py when a C compiler is there).
from collections.abc import Callable
from typing import Any, Final

RECV: Final[int]
RECV_INTO: Final[int]
SENDTO: Final[int]
SENDMSG: Final[int]

class FastCall:
    def __init__(
        self,
        kind: int,
        name: str,
        fallback: Callable[..., Any],
        method: Callable[..., Any],
        view: Any = ...,
        state: list[Any] | None = ...,
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    @property
    def fallback(self) -> Callable[..., Any]: ...
    @property
    def __name__(self) -> str: ...
