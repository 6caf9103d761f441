"""What every browser test shares: Chromium from Debian, a 1366x900 page (and a 390x844 phone)
that fails the test on any Content-Security-Policy violation, sign-in, screenshots and the
no-horizontal-overflow check.

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
#: A phone held upright (issue 39 item 2: an approval email's link opens here).
PHONE = {"width": 390, "height": 844}

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


def open_tab(browser: Any, base_url: str, viewport: dict[str, int], csp_violations: list[str]) -> Any:
    """A new page of its own context at ``viewport`` whose Content-Security-Policy violations are
    appended to ``csp_violations``; close it with ``tab.context.close()``."""
    context = browser.new_context(viewport=viewport, base_url=base_url)
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
    return tab


@pytest.fixture
def page(browser: Any, live_server: Any, csp_violations: list[str]) -> Iterator[Any]:
    tab = open_tab(browser, live_server.url, VIEWPORT, csp_violations)
    yield tab
    tab.context.close()
    # Every browser test runs under the console's policy: a page it blocked is a failure.
    assert csp_violations == [], f"Content-Security-Policy violations: {csp_violations}"


@pytest.fixture
def phone(browser: Any, live_server: Any, csp_violations: list[str]) -> Iterator[Any]:
    """A page at ``PHONE`` size, under the same Content-Security-Policy check as ``page``."""
    tab = open_tab(browser, live_server.url, PHONE, csp_violations)
    yield tab
    tab.context.close()
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


def shot(page: Any, name: str, *, full_page: bool = True) -> None:
    """Check the page fits its viewport's width, then save a screenshot as ``name`` (see the
    module docstring for where): the whole page, or with ``full_page=False`` its first screen."""
    assert_no_horizontal_overflow(page)
    folder = screenshot_folder()
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / name), full_page=full_page)
