"""Open the built documentation site in a real headless Chromium and check that pages render.

    make docs && python scripts/check_docs_site.py --site site --out docs-check

Serves `--site` on a loopback port, loads the home page and one API page, and fails unless:
every file the browser asked for was served (no missing stylesheet, script or font), the rendered
DOM has the page's title heading, the theme's navigation and (API page) the documented members, and
the screenshot shows the theme applied: a solid coloured header bar across the top and a page that
is not blank. The screenshots stay in `--out` for a person to look at.

Needs Chromium (Debian: `apt-get install chromium`) and Pillow; it is not part of CI, which has no
browser (docs/release.md).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

# (URL path, screenshot name, strings the rendered DOM must contain)
PAGES = (
    ("/", "home.png", ("<h1", "accelerando", "md-header", "md-nav", "Quick start", "--pre")),
    (
        "/api/accelerator/",
        "api-accelerator.png",
        ("md-header", "doc-heading", "Accelerator", "prepare", "backward"),
    ),
)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


class _Recorder(http.server.SimpleHTTPRequestHandler):
    """Serves the site and remembers (path, status) of every request the browser made."""

    seen: list[tuple[str, int]]

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.seen.append((self.path, int(code) if str(code).isdigit() else 0))

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, list[tuple[str, int]]]:
    seen: list[tuple[str, int]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(site))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
        f"--user-data-dir={profile}", "--window-size=1280,900", "--virtual-time-budget=5000", *args,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


def header_is_themed(png: Path) -> tuple[bool, str]:
    """The top band left of the search box is one non-white colour (the theme's header), and the page
    has content (many colours: text, code highlighting, links)."""
    from PIL import Image

    image = Image.open(png).convert("RGB")
    width, _ = image.size
    band = [image.getpixel((x, y)) for y in range(4, 44, 4) for x in range(0, width * 3 // 4, 8)]
    colour, count = Counter(band).most_common(1)[0]
    share = count / len(band)
    distinct = len(image.getcolors(maxcolors=1 << 24) or ())
    ok = share > 0.9 and sum(colour) < 3 * 235 and distinct > 50  # type: ignore[arg-type]
    return ok, f"header colour {colour} on {share:.0%} of the top band, {distinct} distinct colours"


def check(site: Path, out: Path, browser: str) -> list[str]:
    problems: list[str] = []
    out.mkdir(parents=True, exist_ok=True)
    server, seen = serve(site)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for path, name, needles in PAGES:
            url = base + path
            with tempfile.TemporaryDirectory() as profile:  # a fresh profile: nothing cached
                seen.clear()
                chromium(browser, Path(profile), f"--screenshot={out / name}", url)
                requests = len(seen)
                failed = [(p, code) for p, code in seen if code >= 400 and not p.endswith("favicon.ico")]
                if failed:
                    problems.append(f"{path}: the browser could not load {failed}")
                if not any(p.endswith(".css") for p, _ in seen):
                    problems.append(f"{path}: no stylesheet was requested")
                dom = chromium(browser, Path(profile), "--dump-dom", url).stdout
                missing = [n for n in needles if n not in dom]
                if missing:
                    problems.append(f"{path}: the rendered page lacks {missing}")
                ok, what = header_is_themed(out / name)
                print(f"{path}: {out / name}: {what}; {requests} files loaded, {len(dom)} characters of DOM")
                if not ok:
                    problems.append(f"{path}: the screenshot does not show the themed layout ({what})")
    finally:
        server.shutdown()
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=Path("site"), help="the built site (make docs)")
    parser.add_argument("--out", type=Path, default=Path("docs-check"), help="where the screenshots go")
    parser.add_argument("--browser", default=None, help="Chromium executable (default: found on PATH)")
    args = parser.parse_args(argv)
    browser = args.browser or next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        print(
            f"no Chromium found (looked for {', '.join(BROWSERS)}); apt-get install chromium", file=sys.stderr
        )
        return 2
    if not (args.site / "index.html").is_file():
        print(f"{args.site}/index.html does not exist: build the site first (make docs)", file=sys.stderr)
        return 2
    problems = check(args.site, args.out, browser)
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    print("docs site check: " + ("passed" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
