"""``pyrds`` command: subcommand dispatch and the one place where errors become exit codes.

Exit codes: 0 success, 1 the operation failed (no reply, run error, OS error), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pyrds.cli import info, ping, stress
from pyrds.cli.common import UserError, describe_oserror


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyrds", description="RDS tools on the kernel or userspace backend")
    sub = parser.add_subparsers(dest="command", metavar="{ping,info,stress}")
    sub.required = True
    ping.add_parser(sub)
    info.add_parser(sub)
    stress.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage/help
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


if __name__ == "__main__":
    sys.exit(main())
