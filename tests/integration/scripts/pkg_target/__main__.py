"""Target for `accelerando launch -m pkg_target`."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[1] / "cli_report_env.py"), run_name="__main__")
