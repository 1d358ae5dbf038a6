"""MkDocs hook (mkdocs.yml `hooks:`): a guide added to docs/ joins the nav's "Guides" by itself.

`mkdocs build --strict` fails on a page missing from the nav, and guides are added by many branches
at once; listing each by hand would turn every such merge into a red CI. Pages listed in mkdocs.yml
keep their place and title; an unlisted `docs/*.md` is appended to "Guides", titled by its heading.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def listed(nav: list[Any]) -> set[str]:
    """Every page path named anywhere in a nav tree."""
    found: set[str] = set()
    for item in nav:
        values = item.values() if isinstance(item, dict) else [item]
        for value in values:
            found |= {value} if isinstance(value, str) else listed(value)
    return found


def on_config(config: Any) -> Any:
    nav = config["nav"]
    known = listed(nav)
    unlisted = sorted(p.name for p in Path(config["docs_dir"]).glob("*.md") if p.name not in known)
    if unlisted:
        guides = next(item["Guides"] for item in nav if isinstance(item, dict) and "Guides" in item)
        guides.extend(unlisted)
    return config
