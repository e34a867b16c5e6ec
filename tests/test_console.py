"""The web console through Flask's test client, on fakeredis, a real Redis and a cluster:
every page, every action with its confirmation, read-only refusals, grants, CSRF,
escaping of hostile bodies, and the live fragments."""

import json
import re
import time

import fakeredis
import pytest

from relay.codec import make_record
from relay.console.app import create_app
from relay.options import load_options
from relay.store import deadletter
from relay.store.connection import is_cluster
from relay.store.keys import ChannelKeys
from relay.store.stats import collect

pytestmark = pytest.mark.parametrize("backend", ["fakeredis", "redis", "cluster"], indirect=True)

HOSTILE = b'<script>alert("x")</script>&<img src=x onerror=alert(1)>'
GRANTS = {
    "ops-secret": {"ttl": 3600, "identity": "ops", "authorizations": [
        {"topic": ".*", "channels": [".*"], "permissions": ["publish", "subscribe"]}]},
    "orders-secret": {"ttl": 3600, "identity": "orders team", "authorizations": [
        {"topic": "^orders$", "channels": ["^billing$"], "permissions": ["subscribe"]}]},
    "nothing": {"ttl": 3600, "authorizations": []},
}


def console(store, tmp_path=None, write=True, auth=False, csrf=False):
    flags = {"console_write": write}
    if auth:
        path = tmp_path / "grants.json"
        path.write_text(json.dumps(GRANTS))
        flags["console_auth_file"] = str(path)
    app = create_app(store, load_options(flags, environ={}))
    app.config.update(TESTING=True, WTF_CSRF_ENABLED=csrf)
    return app.test_client()


def text(response) -> str:
    return response.get_data(as_text=True)


def letter(store, topic, channel, n, body=b"lost", reason="max_attempts"):
    """A dead letter of topic/channel, in the dead-letter topic as a scanner leaves it."""
    record = make_record(time.time_ns(), 5, b"%016x" % n, body)
    store.publish(f"{topic}.dead", [deadletter.envelope(topic, channel, record, reason)])


def act(client, action, /, **form):
    return client.post(f"/actions/{action}", data={"confirmed": "yes", **form})


@pytest.fixture
def orders(store):
    store.control.create_channel("orders", "billing")
    store.publish("orders", [b"one", b"two", HOSTILE])
    return store


def test_overview_shows_totals_topics_and_processes(orders):
    page = text(console(orders).get("/"))
    assert "<h1>Overview</h1>" in page
    assert re.search(r"<b>3</b>depth", page)
    assert '<a href="/topics/orders">orders</a>' in page
    assert re.search(r"<b>0</b>brokers", page) and "no live brokers" in page
    assert re.search(r"<b>0</b>scanners", page)
    memory = re.findall(r"<tr><td>(127\.0\.0\.1:\d+)</td><td>[\d.]+ (?:B|KiB|MiB)</td>", page)
    masters = 3 if is_cluster(orders.redis) else 0 if isinstance(
        orders.redis, fakeredis.FakeRedis) else 1
    assert len(memory) == masters


def test_overview_fragment_carries_rates_over_time(orders):
    now = [1000.0]
    app = create_app(orders, load_options({}, environ={}), clock=lambda: now[0])
    client = app.test_client()
    client.get("/live/overview")
    now[0] += 2
    orders.publish("orders", [b"x"] * 10)
    page = text(client.get("/live/overview"))
    [data] = re.findall(r'<script type="application/json" class="rates">(.*?)</script>',
                        page)
    rates = json.loads(data)
    assert rates["t"] == [1002.0]
    assert rates["message_count"] == [5.0]      # 10 published in 2 s
    assert rates["depth"] == [13]


def test_overview_is_read_once_a_second_however_many_ask(orders):
    now = [1000.0]
    app = create_app(orders, load_options({}, environ={}), clock=lambda: now[0])
    client = app.test_client()
    client.get("/")
    orders.publish("orders", [b"x"])
    assert re.search(r"<b>3</b>depth", text(client.get("/live/overview")))
    now[0] += 1
    assert re.search(r"<b>4</b>depth", text(client.get("/live/overview")))


def test_topic_page_shows_parts_settings_and_channels(orders):
    orders.expiry.set_ttl("orders", None, 60_000)
    page = text(console(orders).get("/topics/orders"))
    assert "Topic orders" in page
    assert "<tr><th>TTL</th><td>1m</td></tr>" in page
    assert '<a href="/topics/orders/billing">billing</a>' in page
    assert "<th>dedup window</th><td>off" in page


def test_channel_page_shows_counts_consumers_and_settings(orders):
    client = console(orders)
    page = text(client.get("/topics/orders/billing"))
    assert 'class="depth">3</b>depth' in page
    assert "no consumers" in page and "nothing in flight" in page
    assert "<th>ordered</th><td>no</td>" in page
    assert "<th>TTL</th><td>none</td>" in page
    orders.expiry.set_ttl("orders", "billing", 30_000)
    assert "<th>TTL</th><td>30s (channel&#39;s)</td>" in text(client.get("/topics/orders/billing"))


def test_unknown_topic_or_channel_is_a_clear_404(orders):
    client = console(orders)
    missing = client.get("/topics/nope")
    assert missing.status_code == 404 and "no topic &#39;nope&#39;" in text(missing)
    assert client.get("/topics/orders/nope").status_code == 404
    assert client.get("/topics/orders/billing/dead").status_code == 200


def test_peek_shows_next_messages_with_bodies_escaped(orders):
    page = text(console(orders).get("/topics/orders/billing/peek?n=5"))
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(" in page
    assert page.count("<tr><td>0</td>") == 3
    assert console(orders).get("/topics/orders/billing/peek?what=bogus").status_code == 400


def test_find_a_message_in_each_channel(orders):
    client = console(orders)
    page = text(client.get("/find?topic=orders&id=0000000000000001"))
    assert "Message 0000000000000001 of orders" in page
    assert "<td>queued</td>" in page
    bad = client.get("/find?topic=orders&id=zz")
    assert bad.status_code == 400 and "16 hex digits" in text(bad)
    assert client.get("/find?topic=orders&id=00000000000000ff").status_code == 404


def test_dead_letters_listed_with_reason_and_hostile_bodies_escaped(orders):
    letter(orders, "orders", "billing", 7, HOSTILE, "expired")
    page = text(console(orders).get("/topics/orders/billing/dead"))
    assert "<td>0000000000000007</td><td>expired</td><td>5</td>" in page
    assert "<script>alert" not in page and "&lt;img src=x" in page


def test_redrive_one_dead_letter_after_confirming(orders):
    for n in (7, 8):
        letter(orders, "orders", "billing", n)
    client = console(orders)
    ask = client.post("/actions/redrive", data={"topic": "orders", "channel": "billing",
                                                "id": "0000000000000007"})
    assert "Queue dead letters on orders/billing again?" in text(ask)
    assert len(orders.redis.lrange(ChannelKeys.of("orders", "billing").queue, 0, -1)) == 3
    done = act(client, "redrive", topic="orders", channel="billing", id="0000000000000007")
    assert done.status_code == 302
    queue = orders.redis.lrange(ChannelKeys.of("orders", "billing").queue, 0, -1)
    assert len(queue) == 4
    page = text(client.get(done.location))
    assert "redrove 1 dead letter to orders/billing" in page
    assert "0000000000000008" in page and "<td>0000000000000007</td>" not in page


def test_redrive_all_dead_letters(orders):
    for n in (7, 8, 9):
        letter(orders, "orders", "billing", n)
    client = console(orders)
    done = act(client, "redrive", topic="orders", channel="billing", all="yes")
    assert "redrove 3 dead letters to orders/billing" in text(client.get(done.location))
    assert orders.reads.read_channel("orders", "billing")["depth"] == 6


def test_pause_unpause_empty_delete_each_confirmed(orders):
    client = console(orders)
    target = {"topic": "orders", "channel": "billing"}
    for name in ("pause", "empty", "delete"):
        ask = client.post(f"/actions/{name}", data=target)
        assert ask.status_code == 200 and "Yes, " + name in text(ask)
    assert not orders.reads.read_channel("orders", "billing")["paused"]
    act(client, "pause", **target)
    assert orders.reads.read_channel("orders", "billing")["paused"]
    act(client, "unpause", **target)
    assert not orders.reads.read_channel("orders", "billing")["paused"]
    emptied = act(client, "empty", **target)
    assert "emptied orders/billing: 3 messages dropped" in text(client.get(emptied.location))
    assert orders.reads.read_channel("orders", "billing")["depth"] == 0
    act(client, "delete", **target)
    assert orders.reads.channel_names("orders") == []
    act(client, "delete", topic="orders")
    assert "orders" not in orders.reads.topic_names()


def test_create_channel_from_latest_and_earliest(orders):
    orders.history.set_retention("orders", 3_600_000, 0)
    orders.publish("orders", [b"kept"])
    client = console(orders)
    act(client, "create", topic="orders", name="audit", start="earliest")
    assert orders.reads.read_channel("orders", "audit")["depth"] == 1
    act(client, "create", topic="orders", name="fresh", start="latest")
    assert orders.reads.read_channel("orders", "fresh")["depth"] == 0
    bad = act(client, "create", topic="orders", name="bad name!")
    assert bad.status_code == 400 and "invalid channel name" in text(bad)


def test_replay_by_time(orders):
    orders.history.set_retention("orders", 3_600_000, 0)
    orders.control.create_channel("orders", "audit")
    orders.publish("orders", [b"a", b"b"])
    client = console(orders)
    act(client, "empty", topic="orders", channel="audit")
    done = act(client, "replay", topic="orders", channel="audit", since="1h")
    assert "replayed 2 messages to orders/audit" in text(client.get(done.location))
    both = act(client, "replay", topic="orders", channel="audit", since="1h",
               from_time="2026-01-01T00:00:00Z")
    assert both.status_code == 400
    bad = act(client, "replay", topic="orders", channel="audit", since="soon")
    assert bad.status_code == 400 and "not a duration" in text(bad)


def test_read_only_refuses_every_action_and_changes_nothing(orders):
    client = console(orders, write=False)
    assert "disabled" in text(client.get("/topics/orders/billing"))
    for name in ("pause", "empty", "delete", "redrive", "replay", "create"):
        refused = act(client, name, topic="orders", channel="billing")
        assert refused.status_code == 403 and "read-only" in text(refused)
    assert orders.reads.channel_names("orders") == ["billing"]
    assert orders.reads.read_channel("orders", "billing")["depth"] == 3
    assert not orders.reads.read_channel("orders", "billing")["paused"]


def test_bad_action_input_is_a_clear_message(orders):
    client = console(orders)
    assert act(client, "nope", topic="orders").status_code == 404
    missing = act(client, "redrive", topic="orders")
    assert missing.status_code == 400 and "redrive needs a channel" in text(missing)
    none = act(client, "redrive", topic="orders", channel="billing")
    assert none.status_code == 400 and "choose the dead letters" in text(none)
    assert act(client, "pause", topic="nope").status_code == 404


def test_csrf_token_is_required_on_every_change(orders):
    client = console(orders, csrf=True)
    refused = act(client, "pause", topic="orders", channel="billing")
    assert refused.status_code == 400 and "CSRF" in text(refused)
    assert not orders.reads.read_channel("orders", "billing")["paused"]
    page = text(client.get("/topics/orders/billing"))
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    assert act(client, "pause", topic="orders", channel="billing",
               csrf_token=token).status_code == 302
    assert orders.reads.read_channel("orders", "billing")["paused"]


def test_login_is_required_and_grants_are_checked(orders, tmp_path):
    client = console(orders, tmp_path, auth=True)
    first = client.get("/topics/orders")
    assert first.status_code == 302 and first.location.startswith("/login")
    assert client.get("/live/overview").status_code == 302
    wrong = client.post("/login", data={"secret": "guess"})
    assert wrong.status_code == 401 and "grants nothing" in text(wrong)
    assert client.post("/login", data={"secret": "nothing"}).status_code == 401
    client.post("/login", data={"secret": "orders-secret"})
    assert "orders team" in text(client.get("/"))
    topic_wide = act(client, "pause", topic="orders")
    assert topic_wide.status_code == 403 and "do not allow" in text(topic_wide)
    assert not collect(orders, "orders")["topics"][0]["paused"]
    assert act(client, "pause", topic="orders", channel="billing").status_code == 302
    assert orders.reads.read_channel("orders", "billing")["paused"]
    client.post("/logout")
    assert client.get("/").status_code == 302


def test_no_secret_in_pages_or_cookies(orders, tmp_path):
    client = console(orders, tmp_path, auth=True)
    answer = client.post("/login", data={"secret": "ops-secret"})
    cookies = " ".join(answer.headers.getlist("Set-Cookie"))
    assert "ops-secret" not in cookies
    for path in ("/", "/topics/orders", "/topics/orders/billing", "/jobs", "/find"):
        assert "ops-secret" not in text(client.get(path))


def test_big_operations_run_as_jobs_with_a_progress_page(orders, monkeypatch):
    monkeypatch.setattr("relay.console.actions.INLINE_LIMIT", 2)
    client = console(orders)
    queued = act(client, "empty", topic="orders", channel="billing")
    assert queued.status_code == 302 and queued.location.startswith("/jobs/")
    page = text(client.get(queued.location))
    assert "empty orders/billing" in page and "queued" in page
    assert "no `relay jobs` worker is running" in page
    assert orders.reads.read_channel("orders", "billing")["depth"] == 3     # no worker yet
    assert "empty orders/billing" in text(client.get("/jobs"))
    assert client.get("/jobs/nope").status_code == 404
