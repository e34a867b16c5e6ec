"""Every Redis key relay uses, in one place.

All keys of a topic carry the hash tag `{topic}`, so each script touches one
Redis Cluster slot, and every key a script touches is declared in its KEYS: a
script whose slot is being moved then gets TRYAGAIN before it changes anything,
rather than failing half way on a key that moved. Scripts that fan out to a
topic's channels are given each channel's keys (CHANNEL_SUFFIXES order) and
check that they were given exactly the topic's channels.

The keys outside any topic (topics, brokers, reap claims, scanners, rq's) are only used by
plain commands, never in a script, so on Redis Cluster they may live anywhere. The node
keys (relay:due, relay:news; relay/store/nodes.py) are the exception: scripts write them
undeclared, one pair per node, in a slot of the node they run on.

Partitions. A topic of N partitions keeps its messages in N parts, each a topic of the
layout above with a hash tag of its own, so a slot of its own: part 0 is the topic
itself (`{T}`, so a topic of one partition is today's layout), part i is `{T/i}`
("/" is not allowed in topic names), or `{T/i/s}` when the topic's placement gives it a
salt s: on a cluster the salt puts the part's slot on the master it should go to
(relay/store/placement.py), and the salts are kept with the count, so every process names
the parts alike. Message ids are 16 hex digits, the first 4 the
part's number, so FIN, REQ and TOUCH find their part with no lookup. The count only
grows (a part dropped would strand its messages) and outlives a deleted topic.

    relay:topics                      SET   topic names (registry, outside scripts)
    relay:brokers                     ZSET  broker id -> expiry (ms) of its registration
    relay:broker:ID                   HASH  a live broker's addresses, ports, version (TTL)
    relay:broker:ID:clients           STRING JSON list of that broker's subscribed clients (TTL)
    relay:reap:ID                     STRING the reaper cleaning up after dead broker ID,
                                            then "done" (TTL; workers/reaper.py)
    relay:scanners                    ZSET  scanner id -> expiry (ms) of its registration;
                                            the live ones split the slots between them
    relay:layout                      STRING the data layout in force: the one every
                                            process writes (relay/store/layout.py)
    relay:processes                   ZSET  process id -> expiry (ms) of its registration:
                                            brokers, scanners and jobs (from release 0.2.0)
    relay:process:ID                  HASH  kind, release, layouts read and written,
                                            host, pid, library (its function library's
                                            name, from 0.6.2) (TTL; relay/store/layout.py)
    relay:partitions                  SET   the parts beyond the first of partitioned
                                            topics ("T/1", "T/2", ...), for the scanners
    relay:due                         ZSET  "<part> <channel>" -> that channel's score in
                                            its part's due index, or lower: the node due
                                            index, which the scanners read each pass
    relay:news                        HASH  part -> its news, bumped with every wake-up:
                                            the node news hash, which brokers read once a
                                            second, so a missed one is caught. One pair per
                                            node on a
                                            cluster: relay:{node-N}:due and :news, node-N
                                            hashing to the node's lowest slot
                                            (relay/store/nodes.py)
    relay:{T}:meta                    HASH  message_count, message_bytes; ttl_ms (the
                                            topic's message TTL, ttl.lua), channel_ttl
                                            (1: a channel has its own); retention_ms,
                                            retention_bytes (settings, absent: off),
                                            limited_channels (lib/limit.lua),
                                            ordered_channels (lib/order.lua) and
                                            the history's state: history_entries,
                                            history_messages, history_bytes (ever added),
                                            the same three history_start_* (the oldest
                                            entry's), history_first_ms, history_last_ms
                                            (lib/history.lua); dedup_ms (absent: off;
                                            relay/store/dedup.py); urgent_backlog (1: the
                                            backlog holds messages of priority 1-9,
                                            lib/append.lua); paused (1, or unpausing while
                                            its backlog goes to its channels in steps:
                                            pause_topic.lua)
    relay:{T}:history                 STREAM with retention on, a copy of every record
                                            published, an entry per publish call (per 64 KiB
                                            of it), id "<ms>-<count>": ms from its timestamp
                                            (made non-decreasing), count its first message's;
                                            fields l (the records' lengths), e, m, o (entries,
                                            messages, bytes before it, ever) and r (the
                                            records as queued: lib/history.lua)
    relay:{T}:dedup                   ZSET  publish key -> expiry (ms): keys published
                                            within the topic's dedup window (lib/dedup.lua;
                                            expires a window after its last write)
    relay:{T}:ids                     STRING last message id handed out (never deleted)
    relay:{T}:due                     ZSET  channel -> earliest in-flight deadline or
                                            deferred due time (ms); what the node due
                                            index is seeded from
    relay:{T}:channels                SET   channel names
    relay:{T}:backlog                 LIST  records published while the topic had no channel
    relay:{T}:backlog:deferred        ZSET  record -> due time (ms), same situation, deferred
    relay:{T}:trash:X:N               any   what an empty or delete took out (drop.lua), until
                                            freed (workers/operations.py); X is one drop's token
    relay:{T}:staging:X               LIST  the bodies of one MPUB too big for one call,
                                            staged by calls of 10,000 before its commit
                                            call (stage.lua; TTL until then), the ones its
                                            steps have not published yet
                                            (publish_commit.lua, publish_step.lua)
    relay:{T}:staging:X:channels      SET   a wide publish's channels that its current
                                            message has yet to reach (lib/wide.lua; TTL
                                            a day)
    relay:{T}:publishing              HASH  stage token X -> "<next count> <last count>
                                            <due ms, 0: now> <ms last advanced>
                                            <timestamp hex>": the committed staged publishes
                                            whose steps are not all done (lib/staged.lua);
                                            the scanner's sweep finishes one stalled for
                                            STALLED_MS (a dead broker's)
    relay:{T}:wake                    pub/sub: "V|" = whole topic has news, "V|C" = one
                                            channel, V the version it made
                                            (relay/broker/wakeups.py lists the rest)
    relay:{T}:tombstones              HASH  broker HTTP address -> end (ms) of its tombstone
                                            for the topic (nsqlookupd's /topic/tombstone; TTL)
    relay:{T}:deregistered            HASH  "" (the topic) or channel -> end (ms): lookupd's
                                            /topic/delete or /channel/delete forgot it (TTL)
    relay:{T}:version                 HASH  news: the part's news counted where the node's
                                            keys cannot be written (a stale slot map's),
                                            where the node news hash goes on from
                                            (lib/news.lua); channels: the last
                                            channel incarnation handed out (subscribe.lua);
                                            partitions: the topic's partition count (part
                                            0's only; absent: 1); placement: the salt of
                                            each part beyond the first, space-separated (0:
                                            none; absent: all 0), which its name carries
                                            (part_names); order_key: the topic's rule for
                                            a message's order key (part 0's;
                                            relay/store/ordering.py); priority_rule: its
                                            JSON field for a message's priority (part
                                            0's; relay/store/priorities.py); lots: the
                                            last number a lot of the part's channels
                                            took (lib/inflight.lua); never deleted
    relay:{T}:ch:C:queue              LIST  ready records
    relay:{T}:ch:C:urgent             HASH  priority (1-9) -> how many ready records of
                                            that priority wait in its list, a field only
                                            while some do (data layout 5; the channel
                                            meta's `urgent` says it may have some:
                                            lib/queue.lua)
    relay:{T}:ch:C:urgent:P           LIST  ready records of priority P (1-9), delivered
                                            before the queue's, the highest P first
    relay:{T}:ch:C:inflight           ZSET  "<id> <owner>" -> deadline (ms), or (data
                                            layout 4) "<lot> <owner>" for the messages one
                                            delivery handed one consumer (lib/inflight.lua)
    relay:{T}:ch:C:deferred           ZSET  id -> due time (ms)
    relay:{T}:ch:C:msgs               HASH  id -> record, for in-flight and deferred ids;
                                            <lot> -> its records' lengths, a newline, its
                                            records, and <lot>+ -> a 0 per message in
                                            flight, 1 once finished (data layout 4);
                                            on an ordered channel (data layout 3) also
                                            "<order key> <seq>" -> a message waiting behind
                                            its key's: its record, or "<due ms> <record>"
                                            for one due later (lib/order.lua)
    relay:{T}:ch:C:gate               HASH  an ordered channel's order key -> id of its one
                                            message out: queued, in flight or deferred
                                            (lib/order.lua; relay/store/ordering.py), then
                                            "<first seq> <next seq>" of those waiting in msgs
    relay:{T}:ch:C:key_of             HASH  id -> order key, for those same messages
    relay:{T}:ch:C:waiting            ZSET  on a channel ordered under data layout 2 (no
                                            order_seqs), the messages behind their key's,
                                            all at score 0: "<order key> <id> <due ms, 0:
                                            now> <record>", so a key's are in id order
    relay:{T}:ch:C:meta               HASH  message_count, requeue_count, timeout_count,
                                            dead_count, deleted_count (relay-admin msg
                                            --delete), expired_count, overflow_count;
                                            settings (paused, max_attempts ...; ttl_ms,
                                            ttl_from: the TTL in force, from "topic" or
                                            "channel", ttl.lua; max_depth, part_max_depth,
                                            overflow: lib/limit.lua; ordered: 1 on an
                                            ordered channel, counted in the topic meta's
                                            ordered_channels; order_seqs: 1 if those
                                            behind their keys wait in msgs, order_waiting:
                                            how many; rate_per_s, rate_burst: its rate
                                            limit, on every part, rate_tat: its bucket,
                                            on part 0: tokens.lua; lotted: the messages in
                                            flight in lots beyond one each; urgent: 1 once
                                            it had a message of priority 1-9,
                                            lib/queue.lua)
    relay:{T}:ch:C:consumers          HASH  broker id -> number of its subscribed clients
    relay:{T}:ch:C:dead               LIST  records past max attempts, or
                                            "<reason>:<record>" (expired, overflow:
                                            lib/deadletter.lua), until a scanner has
                                            published them to the dead-letter topic
    relay:{T}:ch:C:dead:lock          STRING the scanner forwarding them (short TTL)
    relay:{T}:ch:C:spark:Q:progress   HASH  claimed, finished, parked: micro-batches of
                                            Spark query consumer Q (relay/spark/batches.py)
    relay:{T}:ch:C:spark:Q:batch:N    LIST  the records Spark's batch N claimed, until the
                                            query's checkpoint holds it as done
    relay:{T}:ch:C:spark:Q:strays     SET   ids whose claim ran out before their batch was
                                            done: skipped when claimed again (expires)
    relay:{T}:ch:C:e2e:N              HASH  latency bucket -> FINs in half-window N of
                                            --e2e-processing-latency-window-time (expires)
    {X}:nothing                       never exists (X: a key's hash tag, or the whole
                                            key without one): /ping's probe of whether
                                            Redis takes writes SETs it XX
    {rq}:*                            rq's queue "relay": relay-admin's jobs and the
                                            `relay jobs` workers (workers/operations.py); one hash
                                            tag, so rq's transactions work on a cluster

"""

from dataclasses import dataclass
from functools import lru_cache

from redis.crc import key_slot

from relay.codec import MAX_PARTITIONS  # noqa: F401  (the one limit, kept by the codec)
from relay.codec import MAX_PRIORITY

PREFIX = "relay"
TOPICS = f"{PREFIX}:topics"
SCANNERS = f"{PREFIX}:scanners"
PARTITIONS = f"{PREFIX}:partitions"
PART_MARK = "/"
# the topic meta's `paused` while an unpause hands its backlog over in steps
# (lib/backlog.lua's UNPAUSING)
UNPAUSING = b"unpausing"
PART_DIGITS = 4         # of the 16 in a message id: its priority's, then 3 of the part
PRIORITY_SHIFT = 12     # of those 4 digits' value: the priority is the top one
PART_MASK = 0xfff
BROKERS = f"{PREFIX}:brokers"
LAYOUT = f"{PREFIX}:layout"
PROCESSES = f"{PREFIX}:processes"
JOBS_QUEUE = "relay"    # the rq queue of the background jobs (workers/), under rq's keys


def broker_key(broker_id: str) -> str:
    return f"{PREFIX}:broker:{broker_id}"


def broker_clients_key(broker_id: str) -> str:
    return f"{PREFIX}:broker:{broker_id}:clients"


def process_key(process_id: str) -> str:
    return f"{PREFIX}:process:{process_id}"


def reap_claim_key(broker_id: str) -> str:
    return f"{PREFIX}:reap:{broker_id}"


def hash_tag(key: str) -> str:
    """The hash tag T of a key "...{T}..." (a topic part's, on relay's keys), which puts
    it in T's slot; "" for a key without one."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start + 1:end] if 0 <= start < end - 1 else ""


def nothing_key(key: str) -> str:
    """A key that never exists, in the slot of `key`: "{T}:nothing" for a key of hash
    tag T, else "{key}:nothing"."""
    return "{" + (hash_tag(key) or key) + "}:nothing"


# The keys that hold a channel's messages (an empty drops them); a channel's keys, in the
# order fan-out scripts are given them: the first four, the others, the order gate's last.
ORDER_SUFFIXES = ("gate", "key_of", "waiting")
# the field of a trashed msgs hash that counts the messages waiting behind their order
# keys in it (drop.lua)
WAITING_FIELD = b" waiting"

MESSAGE_SUFFIXES = ("queue", "inflight", "deferred", "msgs") + ORDER_SUFFIXES + ("urgent",)
CHANNEL_SUFFIXES = MESSAGE_SUFFIXES[:4] + ("meta", "consumers", "dead", "dead:lock") \
    + ORDER_SUFFIXES + ("urgent",)


def part_name(topic: str, index: int, salt: int = 0) -> str:
    """The name part `index` of a topic is stored under (TopicKeys.of takes it); a salt
    moves its slot (relay/store/placement.py)."""
    if index == 0:
        return topic
    name = f"{topic}{PART_MARK}{index}"
    return f"{name}{PART_MARK}{salt}" if salt else name


def part_names(topic: str, partitions: int, placement: str = "") -> list[str]:
    """The names of a topic's parts, given its placement (the salts of parts 1, 2, ...;
    those it lacks are 0)."""
    salts = [0, *(int(s) for s in placement.split())]
    return [part_name(topic, i, salts[i] if i < len(salts) else 0) for i in range(partitions)]


def split_part(part: str) -> tuple[str, int]:
    """(topic, index) of a part's name."""
    topic, mark, rest = part.partition(PART_MARK)
    return topic, int(rest.partition(PART_MARK)[0]) if mark else 0


def part_slot(part: str) -> int:
    """The cluster slot of a part's keys."""
    return key_slot(topic_prefix(part).encode())


def id_part(msg_id: bytes) -> int:
    """The part a message id names, in its first 4 hex digits after the first, which is
    the message's priority (data layout 5: codec.MAX_PRIORITY); -1 if they are not
    (no part has it)."""
    try:
        head = int(msg_id[:PART_DIGITS], 16)
    except ValueError:
        return -1
    return head & PART_MASK if head >> PRIORITY_SHIFT <= MAX_PRIORITY else -1


def id_priority(msg_id: bytes) -> int:
    """A message's priority (0-9), its id's first digit (data layout 5)."""
    return int(msg_id[:1], 16)



def topic_prefix(topic: str) -> str:
    return f"{PREFIX}:{{{topic}}}:"


def trash_prefix(topic: str, token: str) -> str:
    """Prefix of the trash keys of one drop: trash key = prefix + number."""
    return topic_prefix(topic) + f"trash:{token}:"


def staging_key(topic: str, token: str) -> str:
    """The bodies of one MPUB too big for one call, until its steps have published them."""
    return topic_prefix(topic) + f"staging:{token}"


def snapshot_key(stage: str) -> str:
    """The channels a wide publish's current message has yet to reach (lib/wide.lua)."""
    return stage + ":channels"


def dedup_key(part: str) -> str:
    """The publish keys a part remembers within its dedup window (lib/dedup.lua)."""
    return topic_prefix(part) + "dedup"


def channel_prefix(topic: str) -> str:
    """Prefix of a topic's channel keys: channel key = prefix + name + ":" + suffix."""
    return topic_prefix(topic) + "ch:"


@dataclass(frozen=True)
class TopicKeys:
    name: str
    meta: str
    ids: str
    channels: str
    backlog: str
    backlog_deferred: str
    due: str
    wake: str
    tombstones: str
    deregistered: str
    version: str
    history: str
    publishing: str

    @classmethod
    @lru_cache(maxsize=16384)
    def of(cls, topic: str) -> "TopicKeys":
        p = topic_prefix(topic)
        return cls(topic, p + "meta", p + "ids", p + "channels", p + "backlog",
                   p + "backlog:deferred", p + "due", p + "wake", p + "tombstones",
                   p + "deregistered", p + "version", p + "history", p + "publishing")


@dataclass(frozen=True)
class ChannelKeys:
    topic: str
    name: str
    queue: str
    inflight: str
    deferred: str
    msgs: str
    meta: str
    consumers: str
    dead: str
    dead_lock: str
    gate: str
    key_of: str
    waiting: str
    urgent: str

    @classmethod
    @lru_cache(maxsize=65536)
    def of(cls, topic: str, channel: str) -> "ChannelKeys":
        """Cached: the broker builds keys for every FIN."""
        p = channel_prefix(topic) + channel + ":"
        return cls(topic, channel, *(p + s for s in CHANNEL_SUFFIXES))

    def urgent_list(self, priority: int) -> str:
        """The ready records of one priority 1-9 (scripts/lib/queue.lua)."""
        return f"{self.urgent}:{priority}"

    def spark(self, consumer: str, part: str) -> str:
        """A Spark query's progress, strays or one batch's claims (relay/spark/batches.py)."""
        return f"{channel_prefix(self.topic)}{self.name}:spark:{consumer}:{part}"

    def e2e(self, slot: int) -> str:
        """FIN latency buckets of one half-window (relay/store/latency.py)."""
        return f"{channel_prefix(self.topic)}{self.name}:e2e:{slot}"

    def all(self) -> list[str]:
        return [self.queue, self.inflight, self.deferred, self.msgs, self.meta,
                self.consumers, self.dead, self.dead_lock, self.gate, self.key_of, self.waiting,
                self.urgent]
