"""In flight by lot (data layout 4, scripts/lib/inflight.lua): what one deliver call hands
one client of an unordered channel is one member and one record field; a FIN marks it by
index, and a REQ, a TOUCH, a timeout, a dead broker, relay-admin and `msg` each see its
messages one by one. Store tests run on fakeredis, one Redis and the cluster; the last
ones run a real broker and its consumers."""

import random
import time

import pytest

from relay.codec import FRAME_RESPONSE, parse_record, record_id
from relay.store import codes
from relay.store import inflight
from relay.store.inflight import is_lot, lot_item
from relay.store.batchers import finishing_first
from relay.store.commit import GroupCommit
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.lookup import where
from relay.store.connection import connect
from relay.store.stats import in_flight
from tests.helpers.api import Api
from tests.helpers.store import (attempts, bodies, empty_channel, ids, mid, now_ms, ordered,
                                 queue, subscribed, wait_past)
from tests.helpers.wait import wait_for
from tests.helpers.wire import Wire


def deliver(store, groups, topic="t", channel="c"):
    """A broker's deliver call with lots allowed: (records per group, items per group, as
    relay/broker/client.py names them)."""
    got = store.run(store.deliver_op(topic, channel, groups, lots=True))
    return got, [inflight.items([record_id(r) for r in records], got.lot(n))
                 for n, records in enumerate(got)]


def members(store, topic="t", channel="c") -> list:
    return store.redis.zrange(ChannelKeys.of(topic, channel).inflight, 0, -1)


def in_flight_count(store) -> int:
    return store.reads.read_channel("t", "c")["in_flight_count"]


def lot_of_three(store):
    subscribed(store)
    store.publish("t", [b"1", b"2", b"3"])
    got, (items,) = deliver(store, [("a", 60_000, 3)])
    return got, items


def test_a_delivery_of_several_goes_in_flight_as_one_member_and_one_record(store):
    got, items = lot_of_three(store)
    c = ChannelKeys.of("t", "c")
    assert got.lots == [b"x00000000000001g"] and bodies(got[0]) == [b"1", b"2", b"3"]
    assert members(store) == [b"x00000000000001g a"]
    assert sorted(store.redis.hkeys(c.msgs)) == [b"x00000000000001g", b"x00000000000001g+"]
    assert store.reads.read_channel("t", "c") == empty_channel(
        in_flight_count=3, message_count=3, client_count=1)
    assert items == [lot_item(mid(n), b"x00000000000001g", n - 1) for n in (1, 2, 3)]


def test_one_message_goes_in_flight_by_itself(store):
    subscribed(store)
    store.publish("t", [b"1"])
    got, _ = deliver(store, [("a", 60_000, 5)])
    assert (got.lots, members(store)) == ([], [mid(1) + b" a"])


def test_an_ordered_channel_delivers_by_lot_and_each_fin_releases_its_key(store):
    """Since 0.6.1 (issue 59): one message of each free key in a lot; the FIN of one, by
    its item, lets its key's next one go, and the other key's waits."""
    ordered(store, channel="o")
    store.dedup.publish_keyed("t", [b"a1", b"b1", b"a2", b"b2"], None, 0,
                              [b"a", b"b", b"a", b"b"])
    got, ((a1, b1),) = deliver(store, [("a", 60_000, 5)], channel="o")
    assert (bodies(got[0]), got.lotted) == ([b"a1", b"b1"], True)
    assert members(store, channel="o") == [got.lot(0) + b" a"]
    assert store.finish("t", "o", [("a", b1)]) == [codes.DONE]
    got, _ = deliver(store, [("b", 60_000, 5)], channel="o")
    assert bodies(got[0]) == [b"b2"]
    assert store.finish("t", "o", [("a", a1)]) == [codes.DONE]
    got, _ = deliver(store, [("b", 60_000, 5)], channel="o")
    assert bodies(got[0]) == [b"a2"]


def test_fin_marks_each_message_and_the_last_takes_the_lot_away(store):
    _, items = lot_of_three(store)
    c = ChannelKeys.of("t", "c")
    assert store.finish("t", "c", [("a", items[0]), ("a", items[2])]) == [codes.DONE] * 2
    assert in_flight_count(store) == 1
    assert store.finish("t", "c", [("a", items[0])]) == [codes.NOT_IN_FLIGHT]
    assert store.finish("t", "c", [("b", items[1])]) == [codes.NOT_IN_FLIGHT]
    assert in_flight_count(store) == 1
    assert store.finish("t", "c", [("a", items[1])]) == [codes.DONE]
    assert (members(store), store.redis.hlen(c.msgs), in_flight_count(store)) == ([], 0, 0)
    assert store.redis.hget(c.meta, "lotted") in (None, b"0")


def test_many_fins_of_a_big_lot_in_one_call(store):
    subscribed(store)
    store.publish("t", [b"%d" % n for n in range(300)])
    _, (items,) = deliver(store, [("a", 60_000, 300)])
    assert len(members(store)) == 1
    assert store.finish("t", "c", [("a", i) for i in items[:250]]) == [codes.DONE] * 250
    assert in_flight_count(store) == 50
    assert store.finish("t", "c", [("a", i) for i in items[240:]]) == \
        [codes.NOT_IN_FLIGHT] * 10 + [codes.DONE] * 50
    assert (members(store), in_flight_count(store)) == ([], 0)


def test_a_whole_lot_of_the_most_messages_finishes_in_one_call(store):
    """A lot of LOT_MAX messages: FINs of a few marked one by one (one twice), then the
    others' in one call as one lot run (its indexes read in pieces: Lua's stack), ten of
    them twice."""
    subscribed(store)
    store.publish("t", [b"%d" % n for n in range(inflight.LOT_MAX)])
    _, (items,) = deliver(store, [("a", 60_000, inflight.LOT_MAX)])
    assert store.finish("t", "c", [("a", items[5]), ("a", items[9]), ("a", items[5])]) == \
        [codes.DONE, codes.DONE, codes.NOT_IN_FLIGHT]
    fins = [("a", i) for i in items[:3000] + items[2990:]]
    assert len(inflight.fin_args(fins)) == 2
    assert store.finish("t", "c", fins) == \
        [codes.DONE] * 5 + [codes.NOT_IN_FLIGHT] + [codes.DONE] * 3 + [codes.NOT_IN_FLIGHT] \
        + [codes.DONE] * 2990 + [codes.NOT_IN_FLIGHT] * 10 + [codes.DONE] * 1096
    assert (members(store), in_flight_count(store)) == ([], 0)


def test_fins_of_a_lot_go_as_runs_and_each_message_gets_its_code(store):
    """A lot's items that follow each other for one owner are one argument; another
    owner's, an id's, and the lot's again after them, runs of their own. The lot's
    owner finishes its messages; the other owner's FIN of one is refused as nsqd
    refuses a FIN of a message not in flight for it."""
    subscribed(store)
    store.publish("t", [b"1", b"2", b"3", b"4"])
    _, (items,) = deliver(store, [("a", 60_000, 3)])
    _, ((alone,),) = deliver(store, [("b", 60_000, 1)])
    fins = [("a", items[0]), ("a", items[1]), ("b", items[2]), ("b", alone),
            ("a", items[2]), ("a", items[0])]
    lot = items[0][16:32]
    assert inflight.fin_args(fins) == [
        "a", lot + b"00" + b"01" + items[0][:16] + items[1][:16], "b", lot + b"02" + items[2][:16],
        "b", alone, "a", lot + b"02" + b"00" + items[2][:16] + items[0][:16]]
    assert store.finish("t", "c", fins) == [codes.DONE, codes.DONE, codes.NOT_IN_FLIGHT,
                                            codes.DONE, codes.DONE, codes.NOT_IN_FLIGHT]
    assert (members(store), in_flight_count(store)) == ([], 0)


def test_fins_merged_into_one_call_each_get_their_own_codes(store):
    """Two finish calls of one channel in a broker's pipeline go as one call (the group
    commit merges them: batchers.py); a lot run is one argument pair but a code per
    message, so each call gets its own."""
    subscribed(store)
    store.publish("t", [b"%d" % n for n in range(5)])
    _, (items,) = deliver(store, [("a", 60_000, 5)])
    commit = GroupCommit(store)
    try:
        first = commit.submit(store.finish_op("t", "c", [("a", i) for i in items[:3]]))
        second = commit.submit(store.finish_op("t", "c", [("a", items[3]), ("a", items[0])]))
        assert (first.get(timeout=5), second.get(timeout=5)) == (
            [codes.DONE] * 3, [codes.DONE, codes.NOT_IN_FLIGHT])
    finally:
        commit.stop()
    assert in_flight_count(store) == 1


def test_req_of_one_turns_the_lot_back_into_messages(store):
    _, items = lot_of_three(store)
    deadline = store.redis.zscore(ChannelKeys.of("t", "c").inflight, members(store)[0])
    assert store.finish("t", "c", [("a", items[0])]) == [codes.DONE]
    assert store.requeue("t", "c", [("a", items[1], 0)]) == [codes.DONE]
    assert bodies(queue(store, "t", "c")) == [b"2"]
    assert attempts(queue(store, "t", "c")) == [1]
    assert store.redis.zrange(ChannelKeys.of("t", "c").inflight, 0, -1, withscores=True) == \
        [(mid(3) + b" a", deadline)]
    assert in_flight_count(store) == 1
    # the broker still names the third by its lot item
    assert store.finish("t", "c", [("a", items[2])]) == [codes.DONE]
    assert (members(store), in_flight_count(store)) == ([], 0)


def test_touch_of_one_moves_its_deadline_alone(store):
    _, items = lot_of_three(store)
    deadline = int(store.redis.zscore(ChannelKeys.of("t", "c").inflight, members(store)[0]))
    [touched] = store.touch("t", "c", [("a", items[1], 600_000)])
    assert touched > deadline
    scores = dict(store.redis.zrange(ChannelKeys.of("t", "c").inflight, 0, -1,
                                     withscores=True))
    assert scores == {mid(1) + b" a": deadline, mid(2) + b" a": touched,
                      mid(3) + b" a": deadline}
    assert store.touch("t", "c", [("b", items[0], 600_000)]) == [codes.NOT_OWNER]


def test_a_lot_past_its_deadline_times_out_what_was_not_finished(store):
    subscribed(store)
    store.publish("t", [b"1", b"2", b"3"])
    _, (items,) = deliver(store, [("a", 1, 3)])
    assert store.finish("t", "c", [("a", items[1])]) == [codes.DONE]
    wait_past(store, now_ms(store) + 2)
    assert store.scan("t", "c")[:2] == (2, 0)
    assert (bodies(queue(store, "t", "c")), attempts(queue(store, "t", "c"))) == \
        ([b"1", b"3"], [1, 1])
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=2, timeout_count=2, message_count=3, client_count=1)
    assert store.finish("t", "c", [("a", items[0])]) == [codes.NOT_IN_FLIGHT]


def test_a_dead_brokers_lots_go_back_to_the_queue(store):
    subscribed(store, broker="dead")
    store.publish("t", [b"1", b"2", b"3", b"4"])
    _, items = deliver(store, [("dead:1", 60_000, 2), ("dead:2", 60_000, 2)])
    assert store.finish("t", "c", [("dead:2", items[1][0])]) == [codes.DONE]
    assert store.run(store.reap_op("t", "c", "dead")) == (0, 3)
    assert sorted(bodies(queue(store, "t", "c"))) == [b"1", b"2", b"4"]
    assert (members(store), in_flight_count(store)) == ([], 0)


def test_relay_admin_reads_and_requeues_a_lots_messages_one_by_one(store):
    _, items = lot_of_three(store)
    assert store.finish("t", "c", [("a", items[0])]) == [codes.DONE]
    listed = in_flight(store, "t", "c", 10)
    assert [(m["id"], m["owner"], m["attempts"]) for m in listed] == \
        [(mid(2).decode(), "a", 1), (mid(3).decode(), "a", 1)]
    found = where(store, "t", "c", mid(3))
    assert (found["state"], found["owner"], found["body"]) == ("in_flight", "a", b"3")
    assert where(store, "t", "c", mid(1))["state"] == "absent"
    assert store.control.requeue_in_flight("t", "c", [mid(3)]) == [1]
    assert bodies(queue(store, "t", "c")) == [b"3"]
    assert members(store) == [mid(2) + b" a"]
    assert in_flight_count(store) == 1


def test_an_emptied_channel_counts_no_lot(store):
    lot_of_three(store)
    store.control.empty_channel("t", "c")
    assert in_flight_count(store) == 0
    store.publish("t", [b"4", b"5"])
    _, (items,) = deliver(store, [("a", 60_000, 2)])
    assert in_flight_count(store) == 2


def test_deliver_many_puts_each_channels_group_in_a_lot(store):
    subscribed(store, channel="c")
    subscribed(store, channel="d")
    store.publish("t", [b"1", b"2"])
    replies = store.run(store.deliver_many_op("t", [("c", [("a", 60_000, 2, 0)]),
                                                    ("d", [("b", 60_000, 2, 0)])], 0, True))
    assert [(r.lots, bodies(r[0])) for r in replies] == [
        ([b"x00000000000001g"], [b"1", b"2"]), ([b"x00000000000002g"], [b"1", b"2"])]
    assert [members(store, channel=ch) for ch in ("c", "d")] == \
        [[b"x00000000000001g a"], [b"x00000000000002g b"]]


def test_a_stale_item_of_an_earlier_lot_finishes_only_its_own_message(store):
    """A client's REQ of the first message of its lot turns the lot back into messages;
    that message goes out again to the same client first in a new lot, with another
    one. The FIN of the first lot's other message, by the item the client was given
    then, finishes that message and leaves the new lot's second one in flight: it
    marked it finished once (lots named after their first message), which the client's
    own FIN then got refused, and the lot took it away undelivered."""
    subscribed(store)
    store.publish("t", [b"x", b"y"])
    _, ((x, y),) = deliver(store, [("a", 60_000, 2)])
    assert store.requeue("t", "c", [("a", x, 0)]) == [codes.DONE]
    store.publish("t", [b"w"])
    got, ((x_again, w),) = deliver(store, [("a", 60_000, 2)])
    assert bodies(got[0]) == [b"x", b"w"]
    assert store.finish("t", "c", [("a", y)]) == [codes.DONE]
    assert store.finish("t", "c", [("a", w), ("a", x_again)]) == [codes.DONE, codes.DONE]
    assert in_flight_count(store) == 0
    assert store.reads.read_channel("t", "c")["depth"] == 0


class Consumers:
    """Three clients of one channel, as a broker names their messages, against a model:
    no finished message comes again, no message is finished twice, and on an ordered
    channel each key's messages come in publish order, one at a time."""

    def __init__(self, store, channel, ordered_channel):
        self.store, self.channel, self.ordered = store, channel, ordered_channel
        self.held = {}                      # item -> (owner, key, seq)
        self.finished = set()               # (key, seq)
        self.next = {}                      # key -> its next seq to finish

    def deliver(self, owner, timeout_ms, count, fins=()):
        op = self.store.deliver_op("t", self.channel, [(owner, timeout_ms, count)], lots=True)
        if fins:
            op = finishing_first(op, self.store.finish_op("t", self.channel, fins))
        got = self.store.run(op)
        self.settled(fins, got.finished)
        ids = [record_id(r) for r in got[0]]
        for item, record in zip(inflight.items(ids, got.lot(0)), got[0]):
            key, _, seq = parse_record(record)[3].partition(b"/")
            assert (key, int(seq)) not in self.finished
            if self.ordered:
                assert int(seq) == self.next.get(key, 0), (key, seq)
            self.held[item] = (owner, key, int(seq))

    def settled(self, fins, codes_):
        for (_, item), code in zip(fins, codes_):
            _, key, seq = self.held.pop(item)
            if code == codes.DONE:
                assert (key, seq) not in self.finished
                self.finished.add((key, seq))
                self.next[key] = max(self.next.get(key, 0), seq + 1)

    def some(self, rng, share):
        return [(owner, item) for item, (owner, _, _) in self.held.items()
                if rng.random() < share]


@pytest.mark.parametrize("ordered_channel", [False, True], ids=["unordered", "ordered"])
def test_random_deliveries_fins_reqs_touches_and_timeouts_lose_nothing(store,
                                                                       ordered_channel):
    """Lots given to three clients, FINs by item (folded into deliver calls or not),
    REQs (mostly of a lot's first message), TOUCHes and timeouts at random, then a
    drain: every message finished once. With lots named after their first message
    (0.6.0), the ordered case finished 115 of 150: a FIN by an item of a lot turned back
    into messages marked the message at its index in a new lot of the same name."""
    channel = "o" if ordered_channel else "c"
    (ordered if ordered_channel else subscribed)(store, channel=channel)
    keys = [b"k%d" % (n % 5) for n in range(150)]
    sent = [b"k%d/%d" % (n % 5, n // 5) for n in range(150)]     # a key's in order
    store.dedup.publish_keyed("t", sent, None, 0, keys)
    model = Consumers(store, channel, ordered_channel)
    for seed in range(3):
        rng = random.Random(seed)
        for _ in range(400):
            roll, owner = rng.random(), rng.choice(["b1:a", "b1:b", "b1:c"])
            if roll < 0.35:
                model.deliver(owner, rng.choice([1, 60_000]), rng.randint(1, 6),
                              model.some(rng, 0.3))
            elif roll < 0.6 and model.held:
                fins = model.some(rng, 0.5)
                model.settled(fins, store.finish("t", channel, fins))
            elif roll < 0.7 and model.held:     # a lot's first message, mostly
                firsts = [i for i in model.held if i.endswith(b"00")] or list(model.held)
                item = rng.choice(firsts)
                store.requeue("t", channel, [(model.held.pop(item)[0], item, 0)])
            elif roll < 0.75 and model.held:
                item = rng.choice(list(model.held))
                store.touch("t", channel, [(model.held[item][0], item, 60_000)])
            elif roll < 0.85:
                wait_past(store, now_ms(store) + 2)
                store.scan("t", channel)
    for _ in range(200):                    # the drain
        if len(model.finished) == len(sent):
            break
        wait_past(store, now_ms(store) + 2)
        store.scan("t", channel)
        model.deliver("b1:d", 60_000, 50, model.some(random.Random(0), 1.0))
    assert len(model.finished) == len(sent)
    assert store.reads.read_channel("t", channel)["depth"] == 0


def test_lots_are_numbered_in_their_topic_part_and_no_name_is_an_id(store):
    """A call takes a number for each of its groups in one go: its lots use the first
    ones, the rest are never used; a call that makes no lot takes none."""
    subscribed(store)
    store.publish("t", [b"%d" % n for n in range(1, 6)])
    got, _ = deliver(store, [("a", 60_000, 2), ("b", 60_000, 1), ("c", 60_000, 2)])
    assert got.lots == [b"x00000000000001g", b"", b"x00000000000002g"]
    got, _ = deliver(store, [("a", 60_000, 2)])
    assert got.lots == []      # one message left: no lot, no number taken
    store.publish("t", [b"6", b"7"])
    got, _ = deliver(store, [("a", 60_000, 2)])
    assert got.lots == [b"x00000000000004g"]
    assert store.redis.hget(TopicKeys.of("t").version, "lots") == b"4"
    assert not is_lot(mid(15) + b" a") and is_lot(b"x00000000000004g a")
    assert ids([]) == []


# -- a real broker ---------------------------------------------------------------

@pytest.mark.integration
def test_a_consumer_gets_every_message_once_through_lots(processes, redis_url):
    _, port = processes.broker()
    api = Api(port, processes.http_ports[port])
    redis_client = connect(redis_url)
    c = ChannelKeys.of("t", "c")
    wire = Wire(port)
    wire.identify()
    assert wire.sub("t", "c", rdy=50) == (FRAME_RESPONSE, b"OK")
    assert api.request("POST", "/mpub?topic=t",
                       b"\n".join(b"%d" % n for n in range(200)))[0] == 200
    held = [wire.message() for _ in range(50)]
    assert wire.nothing()
    lots = [m for m in redis_client.zrange(c.inflight, 0, -1) if is_lot(m)]
    assert lots and redis_client.zcard(c.inflight) < 50
    assert api.json("GET", "/stats?format=json&topic=t&channel=c")[1][
        "topics"][0]["channels"][0]["in_flight_count"] == 50
    wire.command(b"REQ " + held[7][2] + b" 0")
    for message in held[:7] + held[8:]:
        wire.command(b"FIN " + message[2])
    got = [m[3] for m in held]
    while len(got) < 201:
        message = wire.message()
        got.append(message[3])
        wire.command(b"FIN " + message[2])
    assert wait_for(lambda: redis_client.zcard(c.inflight) == 0)
    assert wire.nothing()
    wire.close()
    assert sorted(got) == sorted([b"%d" % n for n in range(200)] + [held[7][3]])
    assert redis_client.hlen(c.msgs) == 0


@pytest.mark.integration
def test_a_message_requeued_and_delivered_again_first_in_a_lot_loses_none(processes,
                                                                          redis_url):
    """A consumer's REQ of the first message of its lot, which comes back to it first in
    a lot with a new message: the FINs of the other message of the first lot, and of the
    two, all take (the new message was lost once: test above)."""
    _, port = processes.broker()
    redis_client = connect(redis_url)
    c = ChannelKeys.of("t", "c")
    inflight_key = c.inflight
    wire = Wire(port)
    wire.identify()
    assert wire.sub("t", "c", rdy=2) == (FRAME_RESPONSE, b"OK")
    assert Wire(port).mpub("t", [b"x", b"y"]) == (FRAME_RESPONSE, b"OK")
    x, y = wire.message(), wire.message()
    assert [x[3], y[3]] == [b"x", b"y"]
    assert len([m for m in redis_client.zrange(inflight_key, 0, -1) if is_lot(m)]) == 1
    wire.command(b"RDY 1")          # no credit while y is held
    wire.command(b"REQ " + x[2] + b" 0")
    assert wait_for(lambda: redis_client.llen(c.queue) == 1)      # x, first
    assert Wire(port).pub("t", b"w") == (FRAME_RESPONSE, b"OK")
    assert wire.nothing()
    wire.command(b"RDY 3")
    again, w = wire.message(), wire.message()
    assert [(again[3], again[1]), w[3]] == [(b"x", 2), b"w"]
    assert len([m for m in redis_client.zrange(inflight_key, 0, -1) if is_lot(m)]) == 1
    for message in (y, w, again):
        wire.command(b"FIN " + message[2])
    assert wire.nothing()
    assert wait_for(lambda: redis_client.zcard(inflight_key) == 0)
    wire.close()


@pytest.mark.integration
def test_a_fin_after_the_brokers_own_timeout_still_names_the_lot(processes, redis_url):
    """No scanner runs, so the lot is still in flight in Redis when the FINs come after
    the broker forgot the messages (its msg_timeout): they name the lot all the same."""
    _, port = processes.broker()
    redis_client = connect(redis_url)
    wire = Wire(port)
    wire.identify(msg_timeout=1000)
    assert wire.sub("t", "c", rdy=10) == (FRAME_RESPONSE, b"OK")
    assert Wire(port).mpub("t", [b"1", b"2", b"3"]) == (FRAME_RESPONSE, b"OK")
    held = [wire.message() for _ in range(3)]
    assert [m for m in redis_client.zrange(ChannelKeys.of("t", "c").inflight, 0, -1)
            if is_lot(m)]
    time.sleep(1.5)
    for message in held:
        wire.command(b"FIN " + message[2])
    assert wire.nothing()
    assert wait_for(lambda: redis_client.zcard(ChannelKeys.of("t", "c").inflight) == 0)
    wire.close()


def test_a_scan_times_out_lots_up_to_its_limit_of_messages(store):
    subscribed(store)
    store.publish("t", [b"%d" % n for n in range(9)])
    deliver(store, [("a", 1, 3), ("b", 1, 3), ("c", 1, 3)])
    wait_past(store, now_ms(store) + 2)
    assert store.scan("t", "c", limit=4)[:2] == (6, 0)      # two lots: the first had 3
    assert store.scan("t", "c", limit=4)[:2] == (3, 0)
    assert store.reads.read_channel("t", "c")["in_flight_count"] == 0
    assert len(queue(store, "t", "c")) == 9
