"""placeholder"""

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sub.add_parser("estimate-memory")
