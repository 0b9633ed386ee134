"""Opening a page in headless Chromium (Debian's `chromium`; .ci/run installs it when missing), as
a person's browser would, and reading back what its layout engine made of it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

# Appended to a copy of the page under test: every chart's rendered box and drawn shapes, measured by
# Chromium's own layout (getBBox is 0x0 for anything that was not laid out).
_PROBE = """<script>
const charts = [...document.querySelectorAll("svg.chart")].map(svg => {
  const box = svg.getBoundingClientRect();
  const shapes = [...svg.querySelectorAll("rect, polyline, circle, line")]
      .filter(e => { const b = e.getBBox(); return b.width > 0 || b.height > 0; }).length;
  return {title: svg.getAttribute("aria-label"), width: box.width, height: box.height, shapes: shapes};
});
const out = document.createElement("pre");
out.id = "probe";
out.textContent = JSON.stringify({charts: charts, tables: document.querySelectorAll("table").length,
  title: document.title, external: [...document.querySelectorAll("[src], link[href]")].length});
document.body.appendChild(out);
</script>"""


# .ci/run installs Chromium and sets this, so there a missing browser fails the test instead of skipping it.
REQUIRE_VARIABLE = "TGICTL_TEST_REQUIRE_CHROMIUM"


def chromium() -> str:
    """The browser's path. Without one the test skips, saying so in pytest's summary (-ra), unless .ci/run
    requires it (REQUIRE_VARIABLE=1): a new user's test line needs no browser."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "chromium is not installed (apt-get install -y chromium; .ci/run installs it and requires this test)"
        if os.environ.get(REQUIRE_VARIABLE) == "1":
            raise RuntimeError(message)
        pytest.skip(message)
    return found


def flags(profile: Path) -> list[str]:
    return [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--no-first-run", f"--user-data-dir={profile}"]


def probe_page(page: Path) -> dict[str, Any]:
    """Open a copy of `page` with the probe appended; returns what the probe measured."""
    with tempfile.TemporaryDirectory(prefix="tgictl-chromium-") as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"), encoding="utf-8")
        done = subprocess.run([*flags(Path(tmp) / "profile"), "--dump-dom", copy.as_uri()],
                              capture_output=True, text=True, timeout=120, check=False)
    start = done.stdout.find('<pre id="probe">')
    if done.returncode != 0 or start < 0:
        raise AssertionError(f"chromium failed ({done.returncode}): {done.stderr[-2000:]}")
    text = done.stdout[start + len('<pre id="probe">'): done.stdout.index("</pre>", start)]
    return json.loads(text.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


def screenshot(page: Path, png: Path, width: int = 1240, height: int = 2400) -> None:
    with tempfile.TemporaryDirectory(prefix="tgictl-chromium-") as tmp:
        subprocess.run([*flags(Path(tmp) / "profile"), f"--screenshot={png}", f"--window-size={width},{height}",
                        page.as_uri()], capture_output=True, timeout=120, check=True)
