"""Headless Chromium through Playwright's Python API, for the UI tests.

Playwright drives Debian's own /usr/bin/chromium (`make test-deps` installs it): no browser is
downloaded and `playwright install` is never needed. A page comes logged in to the test Airflow
through its `_token` cookie.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from playwright.sync_api import Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

# Chromium in a container as root on 2 shared cores: no sandbox (Playwright adds --no-sandbox),
# no GPU, /tmp instead of a small /dev/shm, no background traffic.
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    path = shutil.which("chromium")
    if path is None:
        raise RuntimeError("chromium not found: `apt-get install -y chromium` (make test-deps does it)")
    return path


@contextmanager
def airflow_page(url: str, token: str, width: int = 1400, height: int = 1000) -> Iterator[Page]:
    """A page of a fresh headless Chromium, logged in to the Airflow UI at `url` with `token`."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            context.add_cookies([{"name": "_token", "value": token, "url": url}])
            page = context.new_page()
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


@contextmanager
def airflow_page_at(services: Any, path: str, user: str | None = None) -> Iterator[Page]:
    """airflow_page on the test Airflow ``services`` (tpuflow_rehearsal.airflow_services), logged in as ``user``
    (its admin unless given) and opened at ``path`` of its UI."""
    token = services.token() if user is None else services.token(user)
    with airflow_page(services.url, token) as page:
        page.goto(f"{services.url}{path}")
        yield page


def wait_for(page: Page, expression: str, timeout: float = 60.0, what: str = "") -> Any:
    """The first truthy value of a JS expression, polled every 0.5 s; on timeout, fail showing the page text."""
    try:
        return page.wait_for_function(expression, timeout=timeout * 1000, polling=500).json_value()
    except PlaywrightTimeoutError:
        text = page.evaluate("document.body ? document.body.innerText : ''") or ""
        raise AssertionError(
            f"timed out after {timeout:.0f}s waiting for {what or expression}; page text: {text[:1500]!r}"
        ) from None
