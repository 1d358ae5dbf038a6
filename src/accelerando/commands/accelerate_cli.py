"""`accelerate` served by accelerando: Accelerate's CLI module path, accelerando's command line.

Under the switch (`accelerando.as_accelerate()`), `accelerate.commands.accelerate_cli.main` is this
`main`; `accelerando launch --as_accelerate` also puts an `accelerate` executable running it first
on the training processes' PATH. It says so in one line on stderr before doing anything.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from accelerando import __version__
    from accelerando._as_accelerate import ACCELERATE_VERSION
    from accelerando.commands.main import main as accelerando_main

    print(
        f"accelerate: this is accelerando {__version__}'s command line (the as_accelerate switch is on; "
        f"reported as accelerate {ACCELERATE_VERSION})",
        file=sys.stderr,
        flush=True,
    )
    return accelerando_main(argv, prog="accelerate")


if __name__ == "__main__":
    sys.exit(main())
