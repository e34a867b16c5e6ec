"""relay-admin config, dlq and redrive: a channel's max attempts and its dead letters."""

import json

from relay.admin import steering
from relay.store import deadletter
from relay.codec import parse_record
from relay.store.keys import ChannelKeys
from tests.helpers.admin import ok, ok_json, run
from tests.helpers.jobs import work


def dead_letters(store, *bodies, max_attempts=1):
    """Publish bodies on t/c and deliver them past max_attempts; a scanner forwards them."""
    store.subscribe("t", "c", "b1")
    store.publish("t", list(bodies))
    for _ in range(max_attempts + 1):
        [records] = store.deliver("t", "c", [("a", 60_000, len(bodies))], max_attempts)
        if records:
            store.requeue("t", "c", [("a", parse_record(r)[2], 0) for r in records])
    assert deadletter.forward(store, "t", "c", deadletter.DEFAULT_TEMPLATE) == len(bodies)


def test_config_shows_the_value_in_force_and_where_it_comes_from(store, backend, monkeypatch,
                                                                  tmp_path):
    monkeypatch.chdir(tmp_path)     # no conf/relay.toml, no RELAY_ variable
    for name in ("RELAY_CONFIG", "RELAY_MAX_ATTEMPTS", "RELAY_DEAD_LETTER_TOPIC"):
        monkeypatch.delenv(name, raising=False)
    store.subscribe("t", "c", "b1")
    assert ok(backend, "config", "t/c") == ["setting            value   source",
                                            "max-attempts       0       default",
                                            "dead-letter-topic  t.dead  default"]
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "relay.toml").write_text('dead_letter_topic = "{topic}-dlq"\n')
    monkeypatch.setenv("RELAY_MAX_ATTEMPTS", "3")
    assert ok_json(backend, "config", "t/c") == {
        "max-attempts": {"value": 3, "source": "RELAY_MAX_ATTEMPTS"},
        "dead-letter-topic": {"value": "t-dlq", "source": "conf/relay.toml"}}
    (tmp_path / "other.toml").write_text("max_attempts = 4\n")
    monkeypatch.delenv("RELAY_MAX_ATTEMPTS")
    assert ok(backend, "--config", "other.toml", "config", "t/c")[1:] == [
        "max-attempts       4       other.toml", "dead-letter-topic  t.dead  default"]

    ok(backend, "config", "t/c", "max-attempts", "5")
    ok(backend, "config", "t/c", "dead-letter-topic", "poison")
    assert ok(backend, "config", "t/c") == ["setting            value   source",
                                            "max-attempts       5       channel setting",
                                            "dead-letter-topic  poison  channel setting"]
    assert store.channel_setting("t", "c", "max_attempts") == "5"
    assert ok_json(backend, "config", "t/c", "max-attempts", "--unset") == {
        "max-attempts": {"value": 0, "source": "default"},
        "dead-letter-topic": {"value": "poison", "source": "channel setting"}}
    monkeypatch.setenv("RELAY_MAX_ATTEMPTS", "many")
    result = run(backend, "config", "t/c")
    assert (result.exit_code, result.stderr) == (
        1, "relay-admin: invalid max_attempts: Not a valid integer.\n")


def test_config_refuses_bad_values_and_targets(store, backend):
    store.subscribe("t", "c", "b1")
    for args, message in [
        (("t/c", "max-attempts", "x"), "max-attempts must be a whole number 0-65535, not 'x'"),
        (("t/c", "max-attempts", "70000"),
         "max-attempts must be a whole number 0-65535, not '70000'"),
        (("t/c", "dead-letter-topic", "a/b"), "invalid topic name 'a/b'"),
        (("t/c", "max-attempts"), "give a value for max-attempts, or --unset"),
        (("t/nope",), "channel t/nope not found"),
    ]:
        result = run(backend, "config", *args)
        assert (result.exit_code, result.stderr) == (1, f"relay-admin: {message}\n"), args


def test_dlq_lists_readable_letters(store, backend):
    dead_letters(store, b"first", b"line\nbreak", b"\xff")
    lines = ok(backend, "dlq", "t/c")
    assert lines[0].split() == ["id", "attempts", "published", "reason", "body"]
    rows = [line.split(maxsplit=4) for line in lines[1:]]
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [
        ("0000000000000001", "1", "max_attempts", "first"),
        ("0000000000000002", "1", "max_attempts", "line\\nbreak"),
        ("0000000000000003", "1", "max_attempts", "/w==")]
    letters = ok_json(backend, "dlq", "t/c", "-n", "2")
    assert [(x["id"], x["body"]) for x in letters] == [("0000000000000001", "first"),
                                                        ("0000000000000002", "line\nbreak")]
    store.subscribe("t", "empty", "b1")
    assert ok(backend, "dlq", "t/empty") == ["no dead letters for t/empty"]


def test_redrive_inline_and_as_a_job(store, backend, monkeypatch):
    dead_letters(store, b"a", b"b")
    assert ok(backend, "redrive", "t/c") == ["redrove 2 dead letters to t/c"]
    queue = ChannelKeys.of("t", "c").queue
    assert [parse_record(r)[1:] for r in store.redis.lrange(queue, 0, -1)] == [
        (0, b"0000000000000001", b"a"), (0, b"0000000000000002", b"b")]
    assert ok(backend, "dlq", "t/c") == ["no dead letters for t/c"]

    store.redis.delete(queue)
    dead_letters(store, b"c")
    monkeypatch.setattr(steering, "INLINE_LIMIT", 0)
    queued = ok_json(backend, "redrive", "t/c", "--background")
    assert (queued["status"], queued["operation"], queued["target"]) == (
        "queued", "redrive", "t/c")
    work(backend)
    [job] = ok_json(backend, "jobs")["jobs"]
    assert (job["state"], job["done"], job["total"]) == ("finished", 1, 1)
    assert [parse_record(r)[3] for r in store.redis.lrange(queue, 0, -1)] == [b"c"]


def test_stats_count_dead_letters(store, backend):
    dead_letters(store, b"x")
    [topic] = [t for t in ok_json(backend, "stats")["topics"] if t["topic_name"] == "t"]
    assert topic["channels"][0]["dead_count"] == 1
    assert json.loads(run(backend, "stats", "t/c", "--json").stdout)["topics"][0][
        "channels"][0]["dead_count"] == 1
