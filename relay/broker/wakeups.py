"""Wake-ups: how a broker hears that a topic it has consumers of has messages.

Scripts publish on the topic's wake channel (`relay:{T}:wake`): "" the topic has
messages, "C" channel C has, "!C" / "!" channel C / the topic was deleted, "~N:C"
channel C was emptied (the Nth time). A broker subscribes to the wake channels of
the topics it has consumers of:

- one Redis server: SUBSCRIBE on one connection;
- Redis Cluster: sharded pub/sub, SPUBLISH in the scripts and SSUBSCRIBE on a
  connection to the node that owns each channel's slot, one greenlet per node. When
  a slot moves, its node ends the subscription (SUNSUBSCRIBE) and the broker
  subscribes again where the slot now is.

A partitioned topic's parts (keys.py) each have their wake channel and version key:
the listener follows parts (a topic of one partition is its own part 0), and tells a
channel which of its parts has news. The once-a-second read also brings the topics'
partition counts: a channel whose topic grew joins its new parts.

Whenever a subscription is (re)made the topic's channels look again, as a wake-up
may have been missed meanwhile. Pub/sub is fire-and-forget, so nothing depends on a
wake-up arriving: each script that publishes one also bumps the topic's field in its
node's news hash (`relay:news`, one per node on a cluster: relay/store/nodes.py;
scripts/lib/news.lua), and once every CATCH_UP seconds the broker reads the versions
of all the topics it serves with one HMGET per node, a cost that does not grow with
the topics (a part without a field there, new on its node, or whose news a stale
slot map counted in its version key instead, is read from that key once, which sets
the field). The channels of a topic whose version moved look in Redis again and
compare their incarnation and empties with Redis', so a missed delete, empty, unpause or publish
is applied within a second, at a cost that does not grow with idle channels. Each
wake-up names the version it made, so a topic whose every version since the last
read was heard is not looked at again: the read costs deliver calls only where a
wake-up was missed. On a cluster the broker also checks the slots every
TOPOLOGY_EVERY seconds, so that the node keys it names follow a resharding.
"""

import logging
import time

import gevent
import gevent.event
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from relay.broker.context import BrokerContext
from relay.errors import StoreError
from relay.store import Store, connect_redis
from relay.store.connection import UNREACHABLE, is_cluster
from relay.store.keys import TopicKeys, split_part

log = logging.getLogger("relay.wakeups")

POLL = 0.05         # how often a node link of a cluster's sharded pub/sub looks
CATCH_UP = 1.0
CHECK_SLICE = 500     # parts whose versions are read in one go
TOPOLOGY_EVERY = 10.0
RELINK_PAUSE = 0.2


class WakeupListener:
    """Listens on the wake channels of the topics this broker has consumers of."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker
        # the catch-up read's Store, on the client's pool as broker.store, whose
        # partition counts it keeps up to date
        self.store = broker.store.sibling()
        self.topics: set[str] = set()          # the parts followed
        # per part: the version up to which all news was applied (read, or heard in turn)
        self.versions: dict[str, int] = {}
        self.unchecked: set[str] = set()       # parts with a channel new here
        self._wanted: dict | None = None
        # bumped when the parts followed change: the subscribing loops compare their
        # subscriptions with wanted() only then, not at every wake-up and poll (with
        # 5,000 topics that comparison was a third of an idle broker's CPU)
        self.generation = 0
        self._sorted: tuple[int, list[str]] = (-1, [])    # the parts followed, by generation
        self._last_reads: dict[int, dict] = {}   # each slice's last versions read, by its start
        # set when the parts followed change, or the pub/sub connection has something to
        # read: what the listener of one server waits for
        self._stirred = gevent.event.Event()

    def watch(self, part: str) -> None:
        """A channel of the part's topic is new here: listen, and check it on the next
        read (a delete may have come before the listening)."""
        self.topics.add(part)
        self.unchecked.add(part)
        self._changed()

    def unwatch(self, part: str) -> None:
        self.topics.discard(part)
        self.versions.pop(part, None)
        self._changed()

    def _changed(self) -> None:
        self._wanted = None
        self.generation += 1
        self._stirred.set()

    def wanted(self) -> dict:
        """The wake channels to listen on, and the part of each (kept until the parts
        followed change)."""
        if self._wanted is None:
            self._wanted = {TopicKeys.of(t).wake.encode(): t for t in self.topics}
        return self._wanted

    def messages_arrived(self, part: str, channel: str | None = None) -> None:
        """Tell the part's local channels (or the one named) to look in Redis."""
        index = split_part(part)[1]
        for local in self._local(part, channel):
            local.messages_arrived(index)

    def _local(self, part: str, channel: str | None = None) -> list:
        """This broker's channels of the part's topic (or the one named), from its index
        by topic: a wake-up costs its topic's channels, not all of them."""
        local = self.broker.topics.get(split_part(part)[0], {})
        if channel is None:
            return list(local.values())
        return [local[channel]] if channel in local else []

    def received(self, part: str, data: bytes) -> None:
        """A wake-up, "V|" and then: "" the part, "C" one channel, "!C" / "!" deleted,
        "~N:C" emptied (drop.lua); V the part's version it made (lib/news.lua)."""
        version, _, text = data.decode().partition("|")
        self._apply(part, text)
        if self.versions.get(part) == int(version) - 1:
            self.versions[part] = int(version)  # heard all news since the last read

    def _apply(self, part: str, text: str) -> None:
        if text.startswith("!"):
            for local in self._local(part, text[1:] or None):
                local.deleted()
        elif text.startswith("~"):
            empties, _, channel = text[1:].partition(":")
            for local in self._local(part, channel):
                local.emptied(int(empties), split_part(part)[1])
        else:
            self.messages_arrived(part, text or None)

    def catch_up(self) -> None:
        """Every CATCH_UP seconds, apply what a missed wake-up would have told."""
        checked, failing = float("-inf"), False
        while True:
            gevent.sleep(CATCH_UP)
            try:
                self.check_versions()
                if self.store.cluster and time.monotonic() - checked >= TOPOLOGY_EVERY:
                    checked = time.monotonic()
                    self.store.nodes.moved()
                if failing:
                    log.info("the topics' versions are read again")
                failing = False
            except StoreError as e:  # said once, until a read succeeds
                if not failing:
                    log.warning("could not read the topics' versions: %s", e)
                failing = True
            except Exception:  # never stop catching up
                log.exception("the topics' versions not checked")

    def check_versions(self) -> None:
        """Read the versions of the parts served, CHECK_SLICE parts at a time with the
        other greenlets let run in between (at 5,000 topics one read of them all held
        the loop 20 ms each second: the worst wait of a PUB to an idle consumer). The
        channels of those that moved (or are new here) look again and check their
        incarnation and empties there. Channels whose topic has more partitions now join
        the new parts."""
        if self._sorted[0] != self.generation:
            self._sorted = (self.generation, sorted(self.topics))
            self._last_reads = {}
        parts = self._sorted[1]
        for start in range(0, len(parts), CHECK_SLICE):
            if start:
                gevent.sleep(0)
            self._check_slice(start, parts[start:start + CHECK_SLICE])
        self._grow()

    def _check_slice(self, start: int, parts: list[str]) -> None:
        """The slice's versions read and applied; a read the same as the slice's last
        one, with no part new here, leaves nothing to do."""
        unchecked = self.unchecked.intersection(parts)
        self.unchecked -= unchecked
        try:
            read = self.store.reads.versions(parts)
            if not unchecked and read == self._last_reads.get(start):
                return
            moved = {t for t, v in read.items() if self.versions.get(t) != v}
            channels = [(part, local) for part in moved | (unchecked & read.keys())
                        for local in self._local(part)]
            if channels:
                states = self.store.reads.channel_states([(part, local.name)
                                                    for part, local in channels])
                for (part, local), (incarnation, empties) in zip(channels, states):
                    index = split_part(part)[1]
                    local.check(index, incarnation, empties)
                    if part in moved:
                        local.messages_arrived(index)
        except StoreError:
            self.unchecked |= unchecked
            raise
        self.versions.update((t, v) for t, v in read.items() if t in self.topics)
        self.unchecked |= unchecked - read.keys()
        self._last_reads[start] = read

    def _grow(self) -> None:
        """The local channels of topics whose partition count changed join new parts
        (the count read again by check_versions, or by anything else of the broker's)."""
        recounted = list(self.store.recounted)
        self.store.recounted.clear()
        for i, topic in enumerate(recounted):
            local = self.broker.topics.get(topic)
            try:
                if local and self.store.partitions(topic) > len(next(iter(local.values())).parts):
                    for channel in list(local.values()):
                        self.broker.grow(channel)
            except StoreError:
                self.store.recounted.update(recounted[i:])     # for the next read
                raise

    def run(self) -> None:
        client = self.broker.redis
        if is_cluster(client):
            # a client of its own: refreshing a slot map must not race the Store's use of it
            ShardedSubscriptions(self, self._own_cluster_client()).run()
            return
        while True:
            try:
                self._listen(client)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
                log.warning("wake-up subscription lost: %s; retrying", e)
                gevent.sleep(1.0)
                for topic in list(self.topics):
                    self.messages_arrived(topic)

    def _own_cluster_client(self):
        """A cluster client of this listener's own, made once the cluster answers."""
        while True:
            try:
                return connect_redis(self.broker.options, cluster=True)
            except UNREACHABLE as e:
                log.warning("redis unreachable: %s; retrying", e)
                gevent.sleep(1.0)

    def _listen(self, client) -> None:
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        subscribed: dict[bytes, str] = {}
        seen = -1       # the generation subscribed to
        try:
            while True:
                if seen != self.generation:
                    seen, want = self.generation, self.wanted()
                    added = [k for k in want if k not in subscribed]
                    removed = [k for k in subscribed if k not in want]
                    if added:
                        pubsub.subscribe(*added)
                    if removed:
                        pubsub.unsubscribe(*removed)
                    subscribed = want
                    for key in added:
                        self.messages_arrived(want[key])
                if not subscribed:
                    self._stirred.wait()
                    self._stirred.clear()
                    continue
                self._wait(pubsub.connection)
                message = pubsub.get_message(timeout=0)
                if message and message["type"] == "message":
                    topic = subscribed.get(message["channel"])
                    if topic is not None:
                        self.received(topic, message["data"])
        finally:
            pubsub.close()

    def _wait(self, connection) -> None:
        """Until the pub/sub connection has something to read or the parts followed
        change, the waiting done by this greenlet alone (a PubSub is not to be read from
        two): polling every 50 ms was a tenth of an idle broker's CPU at 5,000 topics."""
        if not connection.can_read(timeout=0):
            readable = gevent.get_hub().loop.io(getattr(connection, "_sock").fileno(), 1)
            readable.start(self._stirred.set)
            try:
                self._stirred.wait()
            finally:
                readable.close()
        self._stirred.clear()


class ShardedSubscriptions:
    """SSUBSCRIBE each wake channel on the node that owns its slot (Redis Cluster 7+)."""

    def __init__(self, listener: WakeupListener, cluster):
        self.listener = listener
        self.cluster = cluster
        self.links: dict[str, NodeLink] = {}
        self.moved = False
        self.seen = -1      # the listener's generation reconciled

    def run(self) -> None:
        """Until killed (a stopping broker), with the node links: left running, a link
        would log its node's loss after the broker's stopping line, which says in one
        line what failed."""
        unreachable = False
        try:
            while True:
                try:
                    self._reconcile()
                    unreachable = False
                except UNREACHABLE as e:  # the cluster gone: said once, until it is back
                    if not unreachable:
                        log.warning("wake-up subscriptions not reconciled: %s", e)
                    unreachable = self.moved = True
                except Exception:  # the catch-up read covers us meanwhile; never stop
                    log.exception("wake-up subscriptions not reconciled")
                    self.moved = True
                gevent.sleep(POLL)
        finally:
            for link in self.links.values():
                link.stop()

    def _reconcile(self) -> None:
        """Each wanted channel on a link to the node that serves it now: looked at when
        the channels wanted changed, a slot moved or a link died."""
        if (not self.moved and self.seen == self.listener.generation
                and not any(link.dead for link in self.links.values())):
            return
        self.seen = self.listener.generation
        if self.moved:
            self.moved = False
            self.cluster.nodes_manager.initialize()
        by_node: dict[str, set] = {}
        for channel in self.listener.wanted():
            try:
                node = self.cluster.get_node_from_key(channel)
            except redis.exceptions.RedisError:
                self.moved = True
                continue
            by_node.setdefault(node.name, set()).add(channel)
            if node.name not in self.links or self.links[node.name].dead:
                self.links[node.name] = NodeLink(self, node)
        for name, link in list(self.links.items()):
            link.wanted(by_node.get(name, set()))
            if link.dead or (not link.want and not link.subscribed):
                link.stop()
                del self.links[name]


class NodeLink:
    """One node's sharded subscriptions, read by its own greenlet."""

    def __init__(self, owner: ShardedSubscriptions, node):
        self.owner = owner
        self.node = node
        self.want: set = set()
        self.subscribed: set = set()
        self.changed = False    # want changed since _run last subscribed to it
        self.dead = False
        # no retries: a node that died is left at once, for the node the slots map names
        self.client = redis.Redis(host=node.host, port=node.port, retry=Retry(NoBackoff(), 0),
                                  **_auth(owner.cluster.get_redis_connection(node)))
        self.greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        self.greenlet.kill()

    def wanted(self, channels: set) -> None:
        """The channels this node's link is to subscribe to now."""
        if channels != self.want:
            self.want, self.changed = channels, True

    def _run(self) -> None:
        listener = self.owner.listener
        pubsub = self.client.pubsub()
        self.changed = True
        try:
            self._check_master()
            while True:
                topics = listener.wanted()
                if self.changed:
                    # a change made while these calls wait is applied next time round
                    self.changed, want = False, self.want
                    added, removed = want - self.subscribed, self.subscribed - want
                    for channel in added:  # one per call: one call's channels share a slot
                        pubsub.ssubscribe(channel)
                    for channel in removed:
                        pubsub.sunsubscribe(channel)
                    self.subscribed = set(want)
                    for channel in added:
                        if channel in topics:
                            listener.messages_arrived(topics[channel])
                if not self.subscribed:
                    gevent.sleep(POLL)
                    continue
                message = pubsub.get_message(timeout=POLL)
                if message:
                    self._handle(message, topics)
        except (redis.exceptions.MovedError, redis.exceptions.AskError) as e:
            log.info("wake-up channel's slot moved from %s (%s): subscribing again",
                     self.node.name, e)
            self.owner.moved = True
        except redis.exceptions.RedisError as e:
            log.warning("wake-up subscriptions on %s lost: %s", self.node.name, e)
            self.owner.moved = True
            gevent.sleep(RELINK_PAUSE)  # a failover takes seconds: no reconnecting in a loop
        finally:
            self.dead = True
            for topic in listener.wanted().values():
                listener.messages_arrived(topic)
            pubsub.close()
            self.client.close()

    def _check_master(self) -> None:
        """A slots map read from a node that has not yet heard of a failover names the
        old master, which may be back as a replica: subscriptions there would stay
        after the map is right."""
        try:
            role = self.client.execute_command("ROLE")[0]
        except redis.exceptions.ResponseError:
            return  # ROLE not allowed to this user: trust the map
        if role != b"master":
            raise redis.exceptions.RedisError(f"{self.node.name} is a {role.decode()} now")

    def _handle(self, message: dict, topics: dict) -> None:
        kind, channel = message["type"], message["channel"]
        if kind == "smessage" and channel in topics:
            self.owner.listener.received(topics[channel], message["data"])
        elif kind == "sunsubscribe" and channel in self.subscribed and channel in self.want:
            # the node gave the slot away: subscribe where it is now
            self.subscribed.discard(channel)
            self.changed = True     # subscribed again here if the map still says so
            self.owner.moved = True
            if channel in topics:
                self.owner.listener.messages_arrived(topics[channel])


def _auth(connection_pool_holder) -> dict:
    """Username and password of a cluster node's client, for its pub/sub connections."""
    kwargs = connection_pool_holder.connection_pool.connection_kwargs
    return {k: kwargs[k] for k in ("username", "password") if kwargs.get(k)}
