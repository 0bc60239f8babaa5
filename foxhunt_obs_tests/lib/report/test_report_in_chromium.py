"""The weekly report's HTML in a real headless Chromium: it paints, every chart loads under the page's own
Content Security Policy, nothing overflows a 1280 px window, and an injected script does not run.

`make install` installs Chromium (Debian package); without it these tests skip and say why.
"""

from __future__ import annotations

import html
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from foxhunt_obs.lib.report import render_weekly_report
from foxhunt_obs_tests.lib.report.test_weekly_report import make_data

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (`make install` installs it)"),
    pytest.mark.timeout(180),
]
TIMEOUT_S = 60
WIDTH, HEIGHT = 1280, 2400
# hard names on purpose: markup, and a long word that must wrap instead of widening the tables
NAMES = (
    "ppo-ant",
    "<script>alert(1)</script>",
    "a-very-long-experiment-name-without-any-spaces-2026-11-16-ppo",
)

# Runs after load; measures before it adds its own marker so the marker cannot skew the layout.
PROBE = """
<script>
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var wide = [];
  document.querySelectorAll("table, img").forEach(function (el) {
    var box = el.parentElement;
    if (el.getBoundingClientRect().width > box.clientWidth + 1 || box.scrollWidth > box.clientWidth + 1) {
      wide.push(el.tagName + " " + Math.round(el.getBoundingClientRect().width) + ">" + box.clientWidth);
    }
  });
  var probe = {
    images: images.length,
    loaded: images.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length,
    natural: images.map(function (i) { return [i.naturalWidth, i.naturalHeight]; }),
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
    fits: document.documentElement.scrollWidth <= window.innerWidth,
    wide: wide,
  };
  var marker = document.createElement("pre");
  marker.id = "layout-probe";
  marker.textContent = JSON.stringify(probe);
  document.body.appendChild(marker);
});
</script>
"""


def _chromium(tmp: Path, *args: str) -> str:
    """Run headless Chromium once (fresh profile, bounded time, its whole process group killed on
    timeout) and return its stdout."""
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp)
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--window-size={WIDTH},{HEIGHT}",
        *args,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"chromium did not finish in {TIMEOUT_S}s: {' '.join(cmd)}\n{err.decode()[-2000:]}")
    finally:
        try:  # helpers (zygote, renderers) must not outlive the test
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {' '.join(cmd)}\n{err.decode()[-2000:]}"
    return out.decode("utf-8", "replace")


def _probe(dom: str) -> dict | None:
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom, re.S)
    return json.loads(html.unescape(found.group(1))) if found else None


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("report")
    report = render_weekly_report(make_data(names=NAMES))
    path = folder / "report.html"
    path.write_text(report.html, encoding="utf-8")
    return path, report.html


def test_screenshot_is_painted(page):
    from PIL import Image  # installed with matplotlib

    path, _ = page
    shot = path.parent / "shot.png"
    _chromium(path.parent, f"--screenshot={shot}", path.as_uri())
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(shot.read_bytes())) as img:
        rgb = img.convert("RGB")
    assert rgb.size == (WIDTH, HEIGHT)
    pixels = np.asarray(rgb, dtype=np.int16).reshape(-1, 3)
    painted = int((pixels != 255).any(axis=1).sum())
    assert painted > 0.05 * WIDTH * HEIGHT, f"only {painted} non-white pixels: a blank page?"
    # the first chart's biggest series is matplotlib blue: the charts were drawn, not just the text
    blue = int((np.abs(pixels - (0x1F, 0x77, 0xB4)) < 8).all(axis=1).sum())
    assert blue > 1000, f"{blue} chart-blue pixels: the charts did not paint"


def test_images_load_and_nothing_overflows(page):
    path, source = page
    # allow our probe script and nothing else: img-src stays data: only, as in the real page
    csp = "default-src 'none';"
    assert source.count(csp) == 1
    probed = source.replace(csp, "default-src 'none'; script-src 'unsafe-inline';").replace(
        "</body>", PROBE + "</body>"
    )
    copy = path.parent / "report-probed.html"
    copy.write_text(probed, encoding="utf-8")
    dom = _chromium(path.parent, "--dump-dom", "--virtual-time-budget=5000", copy.as_uri())
    assert "Weekly GPU cost report — week of 2026-11-16" in dom
    probe = _probe(dom)
    assert probe is not None, f"the probe script did not run; DOM tail: {dom[-1500:]}"
    assert probe["images"] == 3 and probe["loaded"] == 3, probe
    assert probe["natural"] == [[900, 400]] * 3, probe
    assert probe["innerWidth"] == WIDTH, probe
    assert probe["fits"] and probe["scrollWidth"] <= WIDTH, probe
    assert probe["wide"] == [], probe
    # the escaped name is text in the page, not an element
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom


def test_the_pages_policy_blocks_scripts(page):
    """Should escaping ever fail, the page's own CSP still refuses to run an inline script."""
    path, source = page
    copy = path.parent / "report-with-script.html"
    copy.write_text(source.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = _chromium(path.parent, "--dump-dom", "--virtual-time-budget=5000", copy.as_uri())
    assert "Weekly GPU cost report" in dom
    assert _probe(dom) is None
