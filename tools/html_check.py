#!/usr/bin/env python3
"""Open torchdoctor HTML reports in headless Chromium: console errors, requests, a screenshot.

    python3 tools/html_check.py report.html [more.html ...] [--png-dir DIR] [--width 1000]

For each file: Chromium loads it from disk (``--headless=new``, its own logging on stderr);
every console message is a failure — the report has no script, so the only messages a page
can produce are load errors, and the page's Content-Security-Policy turns any attempted
request (image, font, style, frame) into such a message ("violates the following Content
Security Policy directive"). With ``--png-dir`` a full-width screenshot is written per file
(the README's screenshot comes from here). Exit 0 when every file is clean, 1 otherwise,
2 when Chromium is missing (``apt-get install chromium`` on Debian).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONSOLE = re.compile(r":CONSOLE[^\]]*\]\s*(.*)")


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def check(browser: str, html: Path, png: Path | None, width: int, height: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="td-chromium-") as profile:
        cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}",
               "--no-first-run", "--disable-extensions", "--disable-background-networking",
               f"--window-size={width},{height}"]
        cmd += [f"--screenshot={png}"] if png else ["--dump-dom"]
        r = subprocess.run(cmd + [html.resolve().as_uri()], capture_output=True, text=True,
                           timeout=120)
    problems = [m.group(1) for m in CONSOLE.finditer(r.stderr)]
    if r.returncode != 0:
        problems.append(f"chromium exited with {r.returncode}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--png-dir", type=Path)
    ap.add_argument("--width", type=int, default=1000)
    ap.add_argument("--height", type=int, default=2400)
    a = ap.parse_args()
    browser = chromium()
    if browser is None:
        print("chromium not found (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    bad = 0
    for f in a.files:
        png = (a.png_dir / (f.stem + ".png")) if a.png_dir else None
        if png:
            png.parent.mkdir(parents=True, exist_ok=True)
        problems = check(browser, f, png, a.width, a.height)
        size = f.stat().st_size
        status = "ok" if not problems else f"{len(problems)} console message(s)"
        print(f"{f}: {size / 1024:.0f} KiB, {status}" + (f", screenshot {png}" if png else ""))
        for p in problems:
            print(f"    {p[:300]}")
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
