"""Batchers: what a script's calls do beyond one call each, one batcher per script, in
the one module that the ScriptRunner and the group commit's lanes call. An Op is plain
data (runner.Op); its script's batcher

- merges the ops of one merge key into one call and splits the reply among them (FIN,
  REQ and TOUCH of one channel; the small publishes to one topic part);
- sends a call again when its reply asks for it: a fan-out given a stale channel list
  (scripts/lib/fanout.lua) goes again with the topic's real channels;
- goes on after a call: an MPUB too big for one call is staged, committed, then
  published in steps (publish_commit.lua, publish_step.lua);
- reads a reply where that needs more than the reply: the steps of a staged publish
  answer with the count its commit gave.

calls() turns a pipeline's ops into its calls: ops of one merge key in one call, then
FINs folded into the deliver call of their channel that follows them, then the FINs
left of one part's channels in one finish_many call, up to MAX_MERGED_ARGS each: a
flood of FINs makes many calls, never one Redis refuses. answers() hands each op its
result from the calls' results.
"""

import functools
from typing import Any, Callable, NamedTuple, Sequence

from relay.codec import MAX_PRIORITY
from relay.store.inflight import fin_count
from relay.store.keys import MESSAGE_SUFFIXES, ChannelKeys, hash_tag
from relay.store.replies import Published, Stepped
from relay.store.runner import MAX_CALL_ARGS, Continued, Op, identity

# a merged call stops growing here, leaving room for the deliver call a finish folds into
MAX_MERGED_ARGS = MAX_CALL_ARGS // 2
# channels in one finish_many call: Redis spends 15-50 us on each, so it stays short
# (at 100, one took 11.9 ms: no call over 10 ms, issue 57)
MANY_FINISHES = 50
# finish.lua's arguments before its (owner, id) pairs: the channel, wake-up and node
FINISH_HEAD = 3
STAGE_TTL_MS = 300_000
STALE = b"stale"
NO_FENCE = (-1, None)   # an order with no op before (Batchers._merge_items)


class FanOut(NamedTuple):
    """A call that names every channel of a topic part (fanout.lua): the part, how many
    of its keys come before the channels', and for drop.lua the prefix of its trash
    keys, as many as the channels need."""

    part: str
    head: int
    trash: str = ""


class Publishing(NamedTuple):
    """A small publish that may merge with others to its part (publish.lua): where it
    goes and its group (bodies, publish keys or None, registry commands, order keys or
    None, priorities or None)."""

    part: str
    number: int
    timestamp: bytes
    defer_ms: int
    group: tuple


class Staging(NamedTuple):
    """A stage call of an MPUB too big for one call: its bodies, where the next stage
    call starts and the commit call that follows the last."""

    bodies: Sequence[bytes]
    end: int
    commit: Op


class Steps(NamedTuple):
    """The steps of a committed staged publish, which answer with its last count."""

    part: str
    token: str
    last: int


def channel_keys(part: str, channels: Sequence[str]) -> list[str]:
    return [k for c in channels for k in ChannelKeys.of(part, c).all()]


def trash_keys(prefix: str, channels: int) -> list[str]:
    """drop.lua's trash keys: as many as there may be keys to detach (a channel's urgent
    lists among them, lib/queue.lua)."""
    return [f"{prefix}{i}" for i in range(1, 4 + (len(MESSAGE_SUFFIXES) + MAX_PRIORITY)
                                          * channels)]


def fanout_op(script: str, fan: FanOut, head_keys: Sequence[str], args: Sequence[Any],
              channels: Sequence[str], parse: Callable[[Any], Any] = identity,
              pre: tuple = (), job: Any = None) -> Op:
    """A call of a script that touches every channel of fan.part, named in `channels`
    (fanout.lua's layout): `head_keys`, then drop.lua's trash keys, then the channels'."""
    return Op(script, _fanned_keys(fan, head_keys, channels), [len(channels), *channels, *args],
              parse, pre, fan=fan, job=job)


def with_channels(op: Op, channels: Sequence[str]) -> Op:
    """The fan-out call `op`, naming `channels` instead."""
    assert op.fan is not None
    named = int(op.args[0])
    return op._replace(keys=_fanned_keys(op.fan, op.keys[:op.fan.head], channels),
                       args=[len(channels), *channels, *op.args[1 + named:]])


def _fanned_keys(fan: FanOut, head_keys: Sequence[str], channels: Sequence[str]) -> list[str]:
    trash = trash_keys(fan.trash, len(channels)) if fan.trash else []
    return [*head_keys, *trash, *channel_keys(fan.part, channels)]


def stale(raw: Any) -> list[str] | None:
    """The topic's real channels if a fan-out call was given a stale list."""
    if isinstance(raw, list) and raw[:1] == [STALE]:
        return sorted(c.decode() for c in raw[1:])
    return None


def stage_op(stage: str, bodies: Sequence[bytes], start: int, commit: Op) -> Op:
    """A stage call (stage.lua) of the bodies from `start`, going on to the next one,
    then to `commit`: each in a pipeline of its own."""
    end = start + MAX_CALL_ARGS - 3     # with its key, its TTL and whether first
    return Op("stage", [stage], [STAGE_TTL_MS, int(start == 0), *bodies[start:end]],
              calls=-(-(len(bodies) - start) // (end - start)) + 1,
              job=Staging(bodies, end, commit))


def items_merging(op: Op, shared: int) -> Op:
    """`op`, merging with the calls of its script on the same keys and `shared` leading
    args into one call of all their items: FIN, REQ and TOUCH of one channel."""
    return op._replace(merge=(op.script, tuple(op.keys), tuple(op.args[:shared])),
                       size=len(op.args) - shared)


# -- the batchers, by script ----------------------------------------------------------

class Batcher:
    """A script's calls, each one call read by its op's parse; a fan-out given a stale
    channel list goes again with the real ones, which the Store learns. `store`: the
    Store whose calls these are, which builds the calls that merge or go on."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def combine(self, ops: list[Op]) -> Op:
        """One call doing the work of ops of one merge key, in order."""
        raise NotImplementedError(ops[0].script)

    def split(self, value: Any, ops: list[Op]) -> list:
        """Each op's result (a value, or a StoreError for that op alone) from the parsed
        result of the call combine() made of them."""
        raise NotImplementedError(ops[0].script)

    def again(self, op: Op, raw: Any) -> Op | None:
        """The call to send in the place of `op`, whose reply was `raw`, or None."""
        real = stale(raw) if op.fan is not None else None
        if real is None:
            return None
        self.store.learn_channels(op.fan.part, real)
        return with_channels(op, real)

    def goes_on(self, op: Op) -> bool:
        """Whether a call may go on after `op` (its order waits until it is done)."""
        return False

    def next(self, op: Op, raw: Any) -> Op | None:
        """The call that goes on after `op`, which replied `raw`, or None."""
        return None

    def read(self, op: Op, raw: Any) -> Any:
        return op.parse(raw)

    def built(self, op: Op) -> Op:
        """`op` as sent alone (a small publish is built where it merges)."""
        return op


class Items(Batcher):
    """FIN, REQ or TOUCH: the calls of one channel as one call of all their items,
    `stride` args each after the `shared` leading ones, one code per item in the reply."""

    def __init__(self, store: Any, shared: int, stride: int) -> None:
        super().__init__(store)
        self.shared, self.stride = shared, stride

    def combine(self, ops: list[Op]) -> Op:
        head = list(ops[0].args[:self.shared])
        return ops[0]._replace(args=head + [a for op in ops for a in op.args[self.shared:]],
                               merge=None)

    def split(self, value: Any, ops: list[Op]) -> list:
        out, start = [], 0
        for op in ops:
            stop = start + (len(op.args) - self.shared) // self.stride
            out.append(value[start:stop])
            start = stop
        return out


class Finishes(Items):
    """FINs: a code per message, and an argument may name a run of a lot's messages
    (inflight.fin_args)."""

    def split(self, value: Any, ops: list[Op]) -> list:
        out, start = [], 0
        for op in ops:
            stop = start + fin_count(op.args[self.shared + 1::2])
            out.append(value[start:stop])
            start = stop
        return out


class Publish(Batcher):
    """Small publishes to one part, with the same delay, keyed-ness and ordered-ness, as
    one publish.lua call of their groups, built with the channel list known now."""

    def combine(self, ops: list[Op]) -> Op:
        p = ops[0].job
        return self.store.inline_publish_op(p.part, p.number, p.timestamp, p.defer_ms,
                                            [op.job.group for op in ops])

    def split(self, value: Any, ops: list[Op]) -> list:
        return Published.split(value, [len(op.job.group[0]) for op in ops],
                               bool(ops[0].job.group[1]))

    def built(self, op: Op) -> Op:
        return self.combine([op]) if op.merge is not None else op


class Stage(Batcher):
    """A stage call goes on to the next one, then to the commit."""

    def goes_on(self, op: Op) -> bool:
        return True

    def next(self, op: Op, raw: Any) -> Op | None:
        staging = op.job
        if staging.end < len(staging.bodies):
            return stage_op(op.keys[0], staging.bodies, staging.end, staging.commit)
        return staging.commit


class Commit(Batcher):
    """A staged publish's commit goes on to its steps."""

    def goes_on(self, op: Op) -> bool:
        return True

    def next(self, op: Op, raw: Any) -> Op | None:
        if isinstance(raw, list):   # wide (lib/wide.lua): the count, the first slice
            last, channels = int(raw[0]), [c.decode() for c in raw[1:]]
        else:
            last, channels = int(raw), None
        steps = Steps(op.fan.part, op.job, last)
        return self.store.publish_step_op(steps.part, steps.token, channels)._replace(job=steps)


class Step(Batcher):
    """A staged publish's steps follow each other until none is left, and answer with
    its last count; a step alone (a scanner finishing a stalled one) with a Stepped."""

    def goes_on(self, op: Op) -> bool:
        return op.job is not None

    def next(self, op: Op, raw: Any) -> Op | None:
        stepped = Stepped.parse(raw)
        if op.job is None or not stepped.more:
            return None
        return self.store.publish_step_op(op.job.part, op.job.token,
                                          stepped.channels)._replace(job=op.job)

    def read(self, op: Op, raw: Any) -> Any:
        return Stepped.parse(raw) if op.job is None else op.job.last


class Batchers:
    """The batcher of each script, for one Store's calls."""

    def __init__(self, store: Any) -> None:
        self.default = Batcher(store)
        self.by_script: dict[str, Batcher] = {
            "finish": Finishes(store, FINISH_HEAD, 2), "requeue": Items(store, 3, 3),
            "touch": Items(store, 0, 3), "publish": Publish(store), "stage": Stage(store),
            "publish_commit": Commit(store), "publish_step": Step(store)}
        self.staged = {script: self.by_script[script]
                       for script in ("stage", "publish_commit", "publish_step")}

    def of(self, op: Op) -> Batcher:
        return self.by_script.get(op.script, self.default)

    def goes_on(self, op: Op) -> bool:
        """Whether a call may go on after `op`: a staged publish's (Batcher.goes_on)."""
        staged = self.staged.get(op.script)
        return staged is not None and staged.goes_on(op)

    def calls(self, ops: list[Op], orders: list | None = None) -> list["Call"]:
        """The calls that do the ops' work: ops of one merge key in one call, then
        finishes folded into the delivers that follow them, then the finishes left of
        one part's channels in one call. `orders`: each op's order
        (GroupCommit.submit), which a merged call of ops with a lane key keeps."""
        return _merge_finishes(_fold_finishes(
            self._merge_items(ops, orders or [None] * len(ops))))

    def _merge_items(self, ops: list[Op], orders: list) -> list["Call"]:
        """Ops of the same merge key as one call each, up to MAX_MERGED_ARGS of their
        size; the others alone. A call stands where its first op was, so a merged call
        of ops with a lane key (small publishes to a part) takes no op of an order after
        another op of that order to the same part, or one of no lane key (a connection's
        MPUB of 100 between its PUBs): a connection's publishes to a part keep their
        order."""
        groups: list[list[int]] = []
        open_groups: dict = {}      # merge key -> (group index, size so far)
        # per order, and per (order, lane key): (the index of its last op, that op's group)
        fences: dict = {}
        for i, (op, order) in enumerate(zip(ops, orders)):
            fence, fenced_in = fences.get(order, NO_FENCE)
            if op.lane is not None:     # the later of its order's and its order's to the part
                on_lane = fences.get((order, op.lane), NO_FENCE)
                if on_lane[0] > fence:
                    fence, fenced_in = on_lane
            index, size = open_groups.get(op.merge, (None, 0)) if op.merge else (None, 0)
            if op.merge is None:
                index = len(groups)
                groups.append([i])
            else:
                if index is None or size + op.size > MAX_MERGED_ARGS or (
                        op.lane is not None and groups[index][0] < fence
                        and fenced_in != index):
                    index, size = len(groups), 0
                    groups.append([])
                groups[index].append(i)
                open_groups[op.merge] = (index, size + op.size)
            if order is not None:
                fences[order if op.lane is None else (order, op.lane)] = (i, index)
        return [self._combined([ops[i] for i in members], members) for members in groups]

    def _combined(self, ops: list[Op], members: list[int]) -> "Call":
        """The call of ops merged, or of one op as it is sent alone. A publish is built
        here, even alone, so every publish of a pipeline has the channel list known now:
        one built before another lane learned a new channel would be sent again (stale)
        after the later publishes of its connection had run."""
        batcher = self.of(ops[0])
        if len(ops) == 1:
            return Call(batcher.built(ops[0]), [(members, _alone, None)])
        return Call(batcher.combine(ops), [(members, functools.partial(_split, batcher, ops),
                                            None)])


class Call(NamedTuple):
    """A call of a pipeline, and whom it answers: per group of input ops (their indexes),
    the split of its result (or of that result's `part` attribute) into theirs."""

    op: Op
    answers: list[tuple[list[int], Callable[[Any], list], str | None]]


def _alone(value: Any) -> list:
    return [value]


def _split(batcher: Batcher, ops: list[Op], value: Any) -> list:
    return batcher.split(value, ops)


def _nth(j: int, split: Callable[[Any], list], value: Any) -> list:
    """A merged call's answers to the ops of its j-th call: split of that call's reply."""
    return split(value[j])


def finishing_first(deliver: Op, finish: Op) -> Op:
    """A deliver call of the same channel that also does a finish call's work first."""
    args, finished = deliver.args, finish.args[FINISH_HEAD:]
    pairs = int(args[2])
    return deliver._replace(args=[*args[:2], pairs + len(finished) // 2,
                                  *args[3:3 + 2 * pairs], *finished,
                                  *args[3 + 2 * pairs:]])


def finishing_together(finishes: Sequence[Op]) -> Op:
    """One call (finish_many.lua) doing the work of finish calls of channels of one
    part: its reply is the list of theirs, in order."""
    first = finishes[0]
    call_keys, args = list(first.keys[9:11]), list(first.args[1:FINISH_HEAD])
    for op in finishes:
        call_keys += op.keys[:9]
        args += [op.args[0], (len(op.args) - FINISH_HEAD) // 2, *op.args[FINISH_HEAD:]]
    return Op("finish_many", call_keys, args)


def _fold_finishes(calls: list[Call]) -> list[Call]:
    """Fold each finish call into the deliver call of its channel that follows it, when
    nothing but publishes touches that channel in between: one script call then frees
    RDY credit and uses it (finishing_first). The finishes' answers are read from the
    deliver's reply (Delivered.finished)."""
    folded: set[int] = set()
    waiting: dict[str, int] = {}    # a channel's inflight key -> its finish call's index
    for i, call in enumerate(calls):
        op = call.op
        if op.script == "finish":
            waiting[op.keys[0]] = i
        elif op.script == "deliver" and op.keys[1] in waiting:
            j = waiting.pop(op.keys[1])
            folded.add(j)
            calls[i] = Call(finishing_first(op, calls[j].op),
                            call.answers + [(members, split, "finished")
                                            for members, split, _ in calls[j].answers])
        elif op.script != "publish" and waiting:
            for key in set(op.keys).intersection(waiting):
                del waiting[key]
    return [call for i, call in enumerate(calls) if i not in folded]


def _merge_finishes(calls: list[Call]) -> list[Call]:
    """The finish calls of different channels of one part as one call, where the first
    stands (finishing_together), up to MANY_FINISHES channels and MAX_MERGED_ARGS: a
    wide topic's consumers each FIN their own channel, a call each before. One joins
    only if nothing but publishes touched its channel since that place, so it overtakes
    nothing of its own channel (a REQ of the same id, say). A call touches the keys of
    one part (its hash tag), so only that part's open place hears of it."""
    out: list[Call] = []
    groups: dict[int, list[Call]] = {}      # place in `out` -> the finish calls there
    sizes: dict[int, int] = {}
    open_at: dict[str, int] = {}            # a part's hash tag -> its open place
    touched: dict[str, set] = {}            # a part's hash tag -> keys touched since
    for call in calls:
        op = call.op
        tag = hash_tag(op.keys[0]) if op.keys else ""
        if op.script == "finish":
            at = open_at.get(tag)
            if (at is not None and op.keys[0] not in touched[tag]
                    and len(groups[at]) < MANY_FINISHES
                    and sizes[at] + len(op.args) <= MAX_MERGED_ARGS):
                groups[at].append(call)
                sizes[at] += len(op.args)
                continue
            open_at[tag], touched[tag] = len(out), set()
            groups[len(out)], sizes[len(out)] = [call], len(op.args)
        elif op.script != "publish":
            for keys in (touched.values() if not tag else
                         [touched[tag]] if tag in touched else []):
                keys.update(op.keys)
        out.append(call)
    for at, members in groups.items():
        if len(members) > 1:
            out[at] = Call(finishing_together([m.op for m in members]),
                           [(indexes, functools.partial(_nth, j, split), None)
                            for j, member in enumerate(members)
                            for indexes, split, _ in member.answers])
    return out


def answers(calls: list[Call], results: list, count: int) -> list:
    """What each of `count` input ops gets from the calls' results: its value, or an
    exception (the call's, or its own within a merged call)."""
    out: list = [None] * count
    for call, value in zip(calls, results):
        for members, split, part in call.answers:
            if isinstance(value, (Exception, Continued)):
                parts = [value] * len(members)
            else:
                parts = split(value if part is None else getattr(value, part))
            for i, answer in zip(members, parts):
                out[i] = answer
    return out
