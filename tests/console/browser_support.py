"""What every browser test shares: Chromium from Debian, a 1366x900 page that fails the test on
any Content-Security-Policy violation, sign-in, screenshots and the no-horizontal-overflow check.

Screenshots go to a temporary folder, so running the tests never changes the tracked
``docs/screenshots/``. ``EFFECT_LEDGER_SCREENSHOTS=docs/screenshots`` (the README's "refresh the
screenshots" command) writes them there instead.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
PASSWORD = "correct horse battery"
#: The smallest laptop screen the console is laid out for (issue 16): no page may scroll sideways.
VIEWPORT = {"width": 1366, "height": 900}

pytestmark_browser = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install chromium chromium-driver)"
    ),
]


def screenshot_folder() -> Path:
    """Where ``shot`` writes: ``$EFFECT_LEDGER_SCREENSHOTS`` if set, else a temporary folder."""
    chosen = os.environ.get("EFFECT_LEDGER_SCREENSHOTS")
    if chosen:
        return Path(chosen).resolve()
    return Path(tempfile.gettempdir()) / "effect-ledger-screenshots"


def expect(target: Any) -> Any:
    """Playwright's ``expect`` (imported late: without Playwright the tests are skipped)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(target)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API keeps an event loop in this thread while it runs; the ORM calls
    # the tests (and the database teardown) make between browser steps are still plain
    # synchronous code, so Django's async-context guard is switched off for this module only.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_api.sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=str(CHROMIUM),
                args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            )
            yield chromium
            chromium.close()


# Every Content-Security-Policy violation in a page, as the page's own listener sees it
# (the ``securitypolicyviolation`` event) and as Chromium logs it to the console.
CSP_LISTENER = """
document.addEventListener("securitypolicyviolation", (event) => {
  window.reportCspViolation(event.effectiveDirective + " blocked " + (event.blockedURI || "?")
    + " in " + event.documentURI + " (" + event.sourceFile + ":" + event.lineNumber + ")");
});
"""


@pytest.fixture
def csp_violations() -> list[str]:
    """What the ``page`` saw the Content-Security-Policy block; it must end empty."""
    return []


@pytest.fixture
def page(browser: Any, live_server: Any, csp_violations: list[str]) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT, base_url=live_server.url)
    context.set_default_timeout(10_000)
    context.expose_function("reportCspViolation", lambda text: csp_violations.append(text))
    context.add_init_script(CSP_LISTENER)
    tab = context.new_page()
    tab.on(
        "console",
        lambda message: (
            csp_violations.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    yield tab
    context.close()
    # Every browser test runs under the console's policy: a page it blocked is a failure.
    assert csp_violations == [], f"Content-Security-Policy violations: {csp_violations}"


def sign_in(page: Any, username: str) -> None:
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()


# The elements wider than the viewport, and the page's own scroll width, as the browser lays
# them out. A table inside a scrolling wrapper (overflow-x: auto) is not counted: it scrolls
# inside its box, the page does not.
OVERFLOW_PROBE = """
() => {
  const limit = document.documentElement.clientWidth;
  const wide = [];
  for (const element of document.body.querySelectorAll("*")) {
    const box = element.getBoundingClientRect();
    if (box.width === 0) continue;
    let clipped = false;
    for (let parent = element.parentElement; parent && parent !== document.body; parent = parent.parentElement) {
      const style = getComputedStyle(parent);
      if (["auto", "scroll", "hidden"].includes(style.overflowX)) { clipped = true; break; }
    }
    if (!clipped && box.right > limit + 1) {
      wide.push(element.tagName.toLowerCase() + (element.id ? "#" + element.id : "")
        + (element.className && typeof element.className === "string" ? "." + element.className.split(" ").join(".") : "")
        + " right=" + Math.round(box.right));
    }
  }
  return {scrollWidth: document.documentElement.scrollWidth, clientWidth: limit, wide: wide.slice(0, 10)};
}
"""


def assert_no_horizontal_overflow(page: Any) -> None:
    """The page as laid out now fits the viewport's width: nothing makes it scroll sideways."""
    found = page.evaluate(OVERFLOW_PROBE)
    assert found["scrollWidth"] <= found["clientWidth"] and not found["wide"], (
        f"{page.url} is wider than {found['clientWidth']} px: {found}"
    )


def shot(page: Any, name: str) -> None:
    """Check the page fits 1366 px, then save a full-page screenshot as ``name`` (see the module
    docstring for where)."""
    assert_no_horizontal_overflow(page)
    folder = screenshot_folder()
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / name), full_page=True)
