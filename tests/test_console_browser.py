"""The console in a real headless Chromium (Debian's, driven by Playwright): click from the
overview to a channel's dead letters, redrive one and see a consumer get it; pause a
channel and see its consumer stop; watch a page update by itself; log in and out. Each
page is saved as a screenshot (RELAY_CONSOLE_SCREENSHOTS: into that folder). Skipped
where no Chromium is installed, failed instead under RELAY_REQUIRE_CHROMIUM=1: .ci/run
installs it and sets that."""

import json
import os
import shutil
import time

import pytest

from relay.codec import make_record
from relay.store import Store, deadletter
from relay.store.connection import connect
from tests.helpers.wire import subscribed

pytestmark = pytest.mark.integration

CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium", shutil.which("chromium"),
                             shutil.which("chromium-browser")) if p and os.path.exists(p)),
                None)
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 8000


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        missing = "no Chromium here (apt-get install chromium; .ci/run does)"
        if os.environ.get("RELAY_REQUIRE_CHROMIUM") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, tmp_path):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    yield page
    context.close()


def shot(page, tmp_path, name: str) -> None:
    folder = os.environ.get("RELAY_CONSOLE_SCREENSHOTS") or str(tmp_path)
    page.screenshot(path=os.path.join(folder, f"console-{name}.png"), full_page=True)


def confirm(page) -> None:
    """Answer the confirmation page of the action just clicked."""
    page.get_by_role("button", name="Yes, ").click()


def test_redrive_a_dead_letter_and_pause_a_channel_by_clicking(processes, page, tmp_path):
    from playwright.sync_api import expect
    store = Store(connect(processes.redis_url))
    store.control.create_channel("orders", "billing")
    for n, body in ((7, b"lost order 7"), (8, b"lost order 8")):
        record = make_record(time.time_ns(), 5, b"%016x" % n, body)
        store.publish("orders.dead", [deadletter.envelope("orders", "billing", record)])
    _, broker_port = processes.broker()
    consumer = subscribed(broker_port, "orders", "billing", rdy=5)
    _, port = processes.console("--console-write")

    page.goto(f"http://127.0.0.1:{port}/")
    expect(page.locator("h1")).to_have_text("Overview")
    expect(page.locator(".uplot canvas").first).to_be_visible()
    shot(page, tmp_path, "overview")
    page.get_by_role("link", name="orders", exact=True).click()
    expect(page.locator("h1")).to_contain_text("Topic orders")
    shot(page, tmp_path, "topic")
    page.get_by_role("link", name="billing", exact=True).click()
    expect(page.locator(".card", has_text="consumers").locator("b")).to_have_text("1")
    shot(page, tmp_path, "channel")

    page.get_by_role("link", name="Dead letters").click()
    expect(page.locator("tbody tr")).to_have_count(2)
    shot(page, tmp_path, "dead-letters")
    page.locator("tr", has_text="0000000000000007").get_by_role("button",
                                                                 name="Redrive").click()
    expect(page.locator("h1")).to_have_text("Queue dead letters on orders/billing again?")
    confirm(page)
    expect(page.locator(".flash")).to_have_text("redrove 1 dead letter to orders/billing")
    expect(page.locator("tbody tr")).to_have_count(1)
    _, _, msg_id, body = consumer.message()
    assert (msg_id, body) == (b"0000000000000007", b"lost order 7")
    consumer.command(b"FIN " + msg_id)

    page.get_by_role("link", name="orders/billing").click()
    page.get_by_role("button", name="Pause").click()
    confirm(page)
    expect(page.locator(".flash")).to_have_text("paused orders/billing")
    expect(page.locator("b.state")).to_have_text("paused")
    store.publish("orders", [b"after the pause"])
    assert consumer.nothing(wait=1.0)
    page.get_by_role("button", name="Unpause").click()
    confirm(page)
    assert consumer.message()[3] == b"after the pause"


def test_pages_update_by_themselves(processes, page, tmp_path):
    from playwright.sync_api import expect
    store = Store(connect(processes.redis_url))
    store.control.create_channel("clicks", "stream")
    _, port = processes.console()
    page.goto(f"http://127.0.0.1:{port}/topics/clicks/stream")
    expect(page.locator("b.depth")).to_have_text("0")
    store.publish("clicks", [b"a", b"b", b"c"])
    expect(page.locator("b.depth")).to_have_text("3")     # no reload: the live fragment
    expect(page.locator(".uplot")).to_have_count(2)
    assert page.get_by_role("button", name="Empty").is_disabled()     # read-only


def test_log_in_and_out(processes, page, tmp_path):
    from playwright.sync_api import expect
    grants = tmp_path / "grants.json"
    grants.write_text(json.dumps({"s3cret": {"ttl": 3600, "identity": "ops", "authorizations": [
        {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]}}))
    _, port = processes.console("--console-auth-file", str(grants))
    page.goto(f"http://127.0.0.1:{port}/jobs")
    expect(page.locator("h1")).to_have_text("Log in")
    shot(page, tmp_path, "login")
    page.get_by_label("secret").fill("wrong")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator(".problem")).to_have_text("that secret grants nothing here")
    page.get_by_label("secret").fill("s3cret")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("h1")).to_have_text("Jobs")     # where it was going
    expect(page.locator(".user")).to_have_text("ops")
    page.get_by_role("button", name="Log out").click()
    expect(page.locator("h1")).to_have_text("Log in")
    page.goto(f"http://127.0.0.1:{port}/")
    expect(page.locator("h1")).to_have_text("Log in")
