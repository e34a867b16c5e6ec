"""`relay-admin upgrade status|finish`: the live processes of a rolling upgrade, the
data layout in force, and putting the next one in force (relay/store/layout.py)."""

import collections

import click

from relay.admin.args import fail, redis_options
from relay.admin.text import show, table
from relay.store import layout


@click.group()
def upgrade():
    """The releases live on this Redis and the data layout in force."""


@upgrade.command()
@redis_options(any_layout=True)
def status(store, as_json):
    """Every live broker, scanner and jobs worker with its release and the layouts it
    reads and writes, the layout in force, and what blocks the next one."""
    deployment = layout.Deployment.read(store.redis)
    target = deployment.next_layout()
    blockers = deployment.blockers(target) if target is not None else []
    data = {"layout": deployment.layout, "release": layout.RELEASE,
            "reads": list(layout.READS), "writes": list(layout.WRITES),
            "processes": [p.as_dict() for p in deployment.processes],
            "next": {"layout": target, "blocked_by": [p.id for p in blockers]}}
    show(data, as_json, _status_text(deployment, target, blockers))


@upgrade.command()
@redis_options(any_layout=True)
def finish(store, as_json):
    """Put in force the newest layout this release writes, once every live process reads
    it; until then each process writes the layout in force. Then delete the function
    libraries of releases no live process runs."""
    in_force, blockers = layout.finish(store.redis)
    if blockers:
        fail(f"layout {layout.Deployment.read(store.redis).next_layout()} not put in "
             f"force: {_counted(blockers)} still live; replace them, then run this again")
    deleted, silent = layout.prune_libraries(store.redis)
    lines = [f"data layout {in_force} is in force; relay {layout.RELEASE} writes no newer one"]
    if deleted:
        lines.append(f"function libraries of no live process deleted: {', '.join(deleted)}")
    if silent:
        lines.append(f"function libraries kept: {_counted(silent)} live, of a release that "
                     "does not say which it uses")
    show({"layout": in_force, "libraries_deleted": deleted}, as_json, "\n".join(lines))


def _status_text(deployment: layout.Deployment, target: int | None,
                 blockers: list[layout.Process]) -> str:
    in_force = deployment.layout
    lines = [f"data layout in force: {'-' if in_force is None else in_force}"
             + (f" ({layout.LAYOUTS[in_force]})" if in_force in layout.LAYOUTS else ""),
             f"relay {layout.RELEASE} reads {_layouts(layout.READS)} and writes "
             f"{_layouts(layout.WRITES)}", ""]
    rows = [[p.kind, p.id, p.host or "-", p.release, _layouts(p.reads),
             "-" if p.writes is None else p.writes] for p in deployment.processes]
    lines.append(table(rows, ["kind", "process", "host", "release", "reads", "writes"])
                 if rows else "no live broker, scanner or jobs worker")
    lines.append("")
    if target is None:
        lines.append(f"next layout: none (relay {layout.RELEASE} writes none newer)")
    elif blockers:
        lines.append(f"next layout: {target}, blocked by {_counted(blockers)} "
                     f"(they do not read layout {target})")
    else:
        lines.append(f"next layout: {target}, ready: `relay-admin upgrade finish`")
    return "\n".join(lines)


def _layouts(numbers) -> str:
    return ",".join(map(str, numbers))


def _counted(processes: list[layout.Process]) -> str:
    """"2 brokers of 0.1.0 or earlier and 1 scanner of 0.1.0 or earlier"."""
    counts = collections.Counter((p.kind, p.release) for p in processes)
    return " and ".join(f"{n} {'jobs worker' if kind == 'jobs' else kind}{'s' * (n > 1)} "
                        f"of {release}" for (kind, release), n in sorted(counts.items()))
