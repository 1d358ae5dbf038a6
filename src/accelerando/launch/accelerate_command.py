"""`accelerando launch --as_accelerate`: the `accelerate` command inside the training processes.

The switch itself travels as ACCELERANDO_AS_ACCELERATE=1, exported like every launch setting; the
worker bootstrap imports accelerando before the script when it is set. This module adds the
command: a folder holding an `accelerate` executable that runs accelerando's command line goes
first on the processes' PATH, so a script that starts `accelerate env` or `accelerate launch ...`
itself gets accelerando's, as `import accelerate` does. The folder lives as long as the launch.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from accelerando import __version__
from accelerando._as_accelerate import ACCELERATE_VERSION
from accelerando.config import env

NOTICE = (
    "accelerando launch: --as_accelerate: in the training processes `import accelerate` gives accelerando "
    f"{__version__}'s modules (reported as accelerate {ACCELERATE_VERSION}) and the `accelerate` command "
    "runs accelerando's"
)


def command_text(python: str = sys.executable) -> str:
    """The `accelerate` executable: accelerando's command line with the switch on."""
    return (
        "#!/bin/sh\n"
        "# accelerando launch --as_accelerate: `accelerate` runs accelerando's command line\n"
        f'ACCELERANDO_AS_ACCELERATE=1 exec {shlex.quote(python)} -m accelerando.commands.accelerate_cli "$@"\n'
    )


@contextmanager
def accelerate_command_on_path() -> Iterator[dict[str, str]]:
    """Yield the PATH for the training processes: a temporary folder with `accelerate` first."""
    with tempfile.TemporaryDirectory(prefix="accelerando-as-accelerate-") as folder:
        command = Path(folder) / "accelerate"
        command.write_text(command_text())
        command.chmod(0o755)
        current = env.raw("PATH") or os.defpath
        yield {"PATH": folder + os.pathsep + current}
