"""``python -m trainer_hooks.maxtext [--check] [--allow-untested] <MaxText arguments>``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from trainer_hooks.maxtext import compat
from trainer_hooks.maxtext.hook import LOG_PREFIX
from trainer_hooks.maxtext.hook import main as run

PROG = "python -m trainer_hooks.maxtext"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [--check] [--allow-untested] [CONFIG.yml] [key=value ...]",
        description=(
            "Run MaxText's pre-training with the elastic sidecar's hooks. The arguments after the "
            "hook's own options are MaxText's, as for python -m maxtext.trainers.pre_train.train. "
            "Before MaxText starts, the installed MaxText, pathwaysutils, orbax-checkpoint and jax "
            "must be inside the window below; outside it the hook exits 2 naming the package and why."
        ),
        epilog=(
            "releases the hook was verified against (a release must meet every row of its package):\n\n"
            + compat.window_table()
            + f"\n\nAn untested release runs, with a WARNING, under --allow-untested or {compat.ENV_ALLOW_UNTESTED}=1."
            "\nA known defect is refused even then: install a release inside the window, or run MaxText"
            "\nwithout the hook.\n\nexit codes: 0 done (--check: compatible), 2 bad usage or incompatible,"
            "\n42 restart the job (elastic), 1 MaxText failed."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="print each package's version and whether it is inside the window; exit 0 or 2; start nothing",
    )
    p.add_argument(
        "--allow-untested",
        action="store_true",
        help=f"run untested releases with a warning (as {compat.ENV_ALLOW_UNTESTED}=1); known defects stay refused",
    )
    p.add_argument("maxtext_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> NoReturn:
    # The hook's options come first; everything from MaxText's first argument on is MaxText's,
    # and an option argparse does not know (an absl flag) passes through in its place.
    args, unknown = parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.allow_untested:
        # The hook reads the override from the environment at start; the flag is its spelling.
        os.environ[compat.ENV_ALLOW_UNTESTED] = "1"
    if args.check:
        raise SystemExit(compat.check_command(LOG_PREFIX))
    run([*unknown, *args.maxtext_args])


if __name__ == "__main__":
    main()
