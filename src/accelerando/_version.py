"""The release's version, written in this one place.

setuptools reads it for the package metadata (pyproject's `dynamic = ["version"]`), the package
re-exports it as `accelerando.__version__`, and `accelerando env` prints it. A PEP 440 pre-release
(`rcN`) is skipped by a plain `pip install accelerando` while a final release exists and is picked
by `pip install --pre accelerando`.
"""

__version__ = "1.0.0rc1"
