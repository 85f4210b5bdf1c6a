"""The HTML report in a real browser: Debian's headless chromium opens the file `forgectl models
report --html` wrote, and the test checks what it rendered (the DOM after layout, the pixels of
the plots) and what it requested (a NetLog of every request, in which the page made none).

The NetLog check is first shown to catch a page that does make requests: a control page with an
image and a stylesheet on a local server is seen in the log, and the server sees the hits."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reconciler.present.report import CSP, PALETTE
from tests.registry import browser
from tests.registry.sample import cli

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def chromium() -> str:
    try:
        return browser.ensure_chromium()
    except browser.BrowserUnavailable as exc:
        pytest.fail(str(exc))


class _Probe(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        _Probe.hits.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def probe_server() -> Iterator[tuple[str, list[str]]]:
    """A server on 127.0.0.1 that records every request it gets."""
    _Probe.hits = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Probe)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Probe.hits
    finally:
        server.shutdown()
        server.server_close()


def offline(probe: str) -> tuple[str, ...]:
    """Flags: names resolve nowhere (only the probe server's address is reachable), and a NetLog."""
    return (f"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {probe.split('//')[1].split(':')[0]}",)


def test_the_netlog_sees_a_page_that_makes_requests(chromium: str, tmp_path: Path, probe_server: tuple[str, list[str]]) -> None:
    url, hits = probe_server
    page = tmp_path / "control.html"
    page.write_text(f'<!DOCTYPE html><html><head><link rel="stylesheet" href="{url}/style.css"></head>'
                    f'<body><img src="{url}/pixel.png" alt=""></body></html>')
    log = tmp_path / "control-netlog.json"
    proc = browser.run(chromium, page, tmp_path / "profile-control", *offline(url), f"--log-net-log={log}",
                       "--virtual-time-budget=5000", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = {r["url"] for r in browser.page_requests(log)}
    assert f"{url}/pixel.png" in seen and f"{url}/style.css" in seen, seen
    assert set(hits) >= {"/pixel.png", "/style.css"}


def test_report_renders_offline_in_chromium(chromium: str, local_project: dict[str, Any], tmp_path: Path,
                                             probe_server: tuple[str, list[str]]) -> None:
    url, hits = probe_server
    page = tmp_path / "report.html"
    out = cli("models", "report", "--specs", "specs", "--html", str(page))
    assert out.exit_code == 0, out.output
    text = page.read_text()
    assert CSP in text

    # what the browser made of it: the DOM after loading, and every request in a NetLog
    log = tmp_path / "report-netlog.json"
    dom = browser.run(chromium, page, tmp_path / "profile-dom", *offline(url), f"--log-net-log={log}",
                      "--virtual-time-budget=5000", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert len(re.findall(r"<svg\b", html)) == 2
    assert len(re.findall(r'<g class="point">', html)) == 20  # ten rows in each plot
    table = html[html.index('<table class="leaderboard">'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr") == 11  # header + ten rows
    assert table.count("★") == 4  # the Pareto front (tests/registry/test_registry.py works it out)
    assert "digits-mlp" in table and "base-onnx-int8" in table
    assert browser.page_requests(log) == []  # the page asked for nothing
    assert not [u for u in browser.all_urls(log) if u.startswith(("http://127.0.0.1", "file://")) and "report.html" not in u]
    assert hits == []

    # the full page, to look at (kept next to the test's files), and the first plot on its own
    shot = tmp_path / "report.png"
    proc = browser.run(chromium, page, tmp_path / "profile-shot", *offline(url), "--window-size=1280,1000",
                       "--virtual-time-budget=5000", f"--screenshot={shot}")
    assert proc.returncode == 0 and shot.stat().st_size > 20_000, proc.stderr[-2000:]
    svg = text[text.index("<svg"):text.index("</svg>") + len("</svg>")]
    plot_page = tmp_path / "plot.html"
    plot_page.write_text(f'<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="{CSP}">'
                         f'<style>body{{margin:0;background:#fff}}</style></head><body>{svg}</body></html>')
    plot_png = tmp_path / "plot.png"
    proc = browser.run(chromium, plot_page, tmp_path / "profile-plot", *offline(url), "--window-size=560,360",
                       "--virtual-time-budget=3000", f"--screenshot={plot_png}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    pixels = browser.read_png(plot_png)
    first, second = (tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in PALETTE[:2])
    # ten markers per plot, five per version: each colour covers well over a marker's worth
    assert browser.count_color(pixels, first) > 300, "the first version's markers were not drawn"
    assert browser.count_color(pixels, second) > 300, "the second version's markers were not drawn"
    assert browser.count_color(pixels, (0, 0, 0), tolerance=30) > 200  # the Pareto rings and the labels
