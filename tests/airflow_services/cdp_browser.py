"""Headless Chromium driven over the DevTools protocol (Debian's /usr/bin/chromium, no downloads).

Just enough for the UI tests: set the Airflow login cookie, open a page, wait for a JS
condition, click, press keys, read values and take a screenshot.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
import websocket

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
)


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    return None


class Browser:
    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        exe = chromium_path()
        if exe is None:
            raise RuntimeError("chromium not found: `apt-get install -y chromium` (make test-deps does it)")
        self.profile = Path(tempfile.mkdtemp(prefix="tpuflow-chromium-"))
        self.proc = subprocess.Popen(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        port = self._devtools_port(timeout=60)
        targets = requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self._ids = itertools.count(1)
        self.send("Page.enable")
        self.send("Network.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _devtools_port(self, timeout: float) -> int:
        marker = self.profile / "DevToolsActivePort"
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            if marker.exists() and (lines := marker.read_text().splitlines()):
                return int(lines[0])
            time.sleep(0.2)
        raise RuntimeError("chromium did not open its DevTools port")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JS error in {expression[:80]!r}: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def set_cookie(self, url: str, name: str, value: str) -> None:
        self.send("Network.setCookie", url=url, name=name, value=value, path="/")

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def wait_for(self, expression: str, timeout: float = 60.0, what: str = "") -> Any:
        deadline = time.time() + timeout
        value: Any = None
        while time.time() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:
                value = None
            if value:
                return value
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or expression}; page text: "
                             f"{(self.evaluate('document.body && document.body.innerText') or '')[:1500]!r}")

    def click_at(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def click_selector(self, selector: str) -> None:
        box = self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        self.click_at(*box)

    def click_text(self, text: str) -> None:
        """Click the innermost element whose text starts with `text`."""
        box = self.evaluate(
            "(() => { const els = [...document.querySelectorAll('body *')].filter(e =>"
            f" e.children.length === 0 && e.innerText && e.innerText.startsWith({json.dumps(text)}));"
            " if (!els.length) return null; const r = els[0].getBoundingClientRect();"
            " return [r.x + Math.min(r.width / 2, 20), r.y + r.height / 2]; })()"
        )
        if not box:
            raise AssertionError(f"no element with text {text!r} to click")
        self.click_at(*box)

    def press(self, key: str, code: str, key_code: int) -> None:
        for kind in ("rawKeyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key=key, code=code, windowsVirtualKeyCode=key_code)

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            _killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            shutil.rmtree(self.profile, ignore_errors=True)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
