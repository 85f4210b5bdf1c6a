"""Debian's headless chromium for the report tests: installed with apt-get on first use (as the
cluster set-up installs Debian's prometheus), run with no network, no sync, no background work."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from reconciler.targets.local.processes import ensure_package

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-default-apps", "--disable-extensions", "--hide-scrollbars",
         "--mute-audio", "--no-default-browser-check", "--disable-features=Translate,MediaRouter,OptimizationHints")


class BrowserUnavailable(RuntimeError):
    """Chromium is missing and could not be installed."""


def ensure_chromium() -> str:
    """Path of a chromium binary; installs Debian's `chromium` package when missing."""
    exe = os.environ.get("FORGE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    return ensure_package("/usr/bin/chromium", "chromium", error=BrowserUnavailable)


def run(exe: str, page: Path, profile: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Chromium on a file:// page with its own throw-away profile."""
    argv = [exe, *FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HOME": str(profile)})


def page_requests(netlog: Path) -> list[dict[str, str]]:
    """Requests a page made, from a chromium NetLog (`--log-net-log`): URL requests whose
    initiator is an origin (the page's), as opposed to the browser's own (`not an origin`)."""
    import json

    data = json.loads(netlog.read_text())
    names = {v: k for k, v in data["constants"]["logEventTypes"].items()}
    found = []
    for event in data["events"]:
        params = event.get("params") or {}
        if names.get(event["type"]) == "URL_REQUEST_START_JOB" and "url" in params and params.get("initiator") != "not an origin":
            found.append({"url": str(params.get("url")), "initiator": str(params.get("initiator"))})
    return found


def all_urls(netlog: Path) -> set[str]:
    """Every URL any event of a NetLog names."""
    import json

    data = json.loads(netlog.read_text())
    return {str(e["params"]["url"]) for e in data["events"] if isinstance(e.get("params"), dict) and "url" in e["params"]}


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG (what chromium writes)."""
    import struct
    import zlib

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    height = depth = color = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    bpp = 4 if color == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def count_color(png: tuple[int, int, list[bytes]], rgb: tuple[int, int, int], tolerance: int = 12) -> int:
    """Pixels within ``tolerance`` of ``rgb``."""
    width, _, rows = png
    bpp = len(rows[0]) // width if rows else 3
    n = 0
    for row in rows:
        for x in range(0, width * bpp, bpp):
            if abs(row[x] - rgb[0]) <= tolerance and abs(row[x + 1] - rgb[1]) <= tolerance and abs(row[x + 2] - rgb[2]) <= tolerance:
                n += 1
    return n
