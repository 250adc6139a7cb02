"""``pyrds`` command: subcommand dispatch and the one place where errors become exit codes.

Exit codes: 0 success, 1 the operation failed (no reply, run error, OS error), 2 usage error, 3 no stack
service running (``pyrds stack status|stop``). A usage error is one line on stderr naming the subcommand
(``pyrds info: unrecognized arguments: -x``), not a usage dump.
Also run as ``python -m pyrds``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn, cast

from pyrds.cli import info, ping, stack, stress
from pyrds.cli.common import UserError, describe_oserror


class OneLineParser(argparse.ArgumentParser):
    """argparse with usage errors as one line: ``pyrds info: unrecognized arguments: -x (see pyrds info -h)``.
    Subparsers are of this class too (add_subparsers uses the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} -h)\n")


class LazyVersionAction(argparse.Action):
    """``--version``: the distribution's version is looked up only when asked for (importlib.metadata costs
    ~1.5 s per process in a TCG guest, and every ``pyrds`` call builds this parser)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **_: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version")

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        import pyrds

        print(f"pyrds {pyrds.__version__} ({pyrds.DISTRIBUTION})")  # stdout, as argparse's "version" action
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="pyrds", description="RDS tools on the kernel or userspace backend")
    parser.add_argument("-V", "--version", action=LazyVersionAction)
    # the subcommands' parsers are OneLineParsers too (add_subparsers uses the parent's class)
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="{ping,info,stress,stack}"),
    )
    sub.required = True
    ping.add_parser(sub)
    info.add_parser(sub)
    stress.add_parser(sub)
    stack.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the subcommand that was given them, not by the top-level parser
            command = getattr(args, "command", None)
            owner = _subparsers(parser).get(command or "", parser)
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse already printed the help, the version or the error line
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        code: int = args.func(args)
        return code
    except UserError as exc:
        print(f"pyrds {args.command}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except OSError as exc:
        print(f"pyrds {args.command}: {describe_oserror(exc)}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, OverflowError) as exc:
        print(f"pyrds {args.command}: {exc}", file=sys.stderr)
        return 2


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


if __name__ == "__main__":
    sys.exit(main())
