"""A rolling upgrade from the previous release under load (scripts/rolling_upgrade.py):
its brokers, scanner and jobs worker replaced one at a time by this checkout's, then
`relay-admin upgrade finish`; every acknowledged message delivered, no publish waiting
longer than a broker's replacement, no traceback. The previous release is the script's
PREVIOUS: the next release that changes a layout names this one there, and passes too."""

import json
import subprocess
import sys

import pytest

from relay.store import runner
from scripts.compare import ROOT
from scripts.rolling_upgrade import PREVIOUS

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

OLD, NEW = "0.5.0", "0.6.2"     # the previous release (PREVIOUS) and this one


def upgrade(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "scripts.rolling_upgrade", "--rate", "400",
                          "--settle", "1.5", *args], capture_output=True, text=True,
                         timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    print(json.dumps(report, indent=1))
    return report


def processes(report: dict) -> list:
    return [(s["step"], s["status"]["layout"], s["status"]["processes"])
            for s in report["steps"]]


def test_the_previous_release_is_in_this_clone():
    """The upgrade runs the release named PREVIOUS from a git worktree."""
    found = subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{PREVIOUS}^{{commit}}"],
                           capture_output=True, text=True)
    assert found.returncode == 0, (f"commit {PREVIOUS} is not in this clone (a shallow "
                                   f"clone? `git fetch --unshallow`): {found.stderr}")


@pytest.mark.parametrize("kill", [False, True], ids=["drained", "killed"])
def test_a_rolling_upgrade_under_load_loses_nothing(kill):
    report = upgrade(*(["--kill"] if kill else []))
    assert report["acknowledged"] > 1000
    assert (report["lost"], report["left_queued"], report["left_in_flight"],
            report["left_deferred"]) == (0, 0, 0, 0)
    assert report["tracebacks"] == []
    steps = processes(report)
    if kill:    # the killed broker is live in the registry until its registration expires
        steps = [(step, layout, {k: n for k, n in live.items() if k != "broker " + OLD})
                 if step.startswith(("broker 2", "upgrade")) else (step, layout, live)
                 for step, layout, live in steps]
    assert steps == [
        ("previous release serving", 4, {"broker " + OLD: 2, "jobs " + OLD: 1,
                                         "scanner " + OLD: 1}),
        ("scanner replaced", 4, {"broker " + OLD: 2, "jobs " + OLD: 1, "scanner " + NEW: 1}),
        ("jobs worker replaced", 4, {"broker " + OLD: 2, "jobs " + NEW: 1,
                                     "scanner " + NEW: 1}),
        ("broker 1 replaced", 4, {"broker " + OLD: 1, "broker " + NEW: 1, "jobs " + NEW: 1,
                                  "scanner " + NEW: 1}),
        ("broker 2 " + ("killed -9 and replaced" if kill else "replaced"), 4,
         {"broker " + NEW: 2, "jobs " + NEW: 1, "scanner " + NEW: 1}),
        ("upgrade finish", 5, {"broker " + NEW: 2, "jobs " + NEW: 1, "scanner " + NEW: 1})]
    # the previous release's function library, which no live process uses then, is gone
    libraries = report["finish"].pop("libraries")
    own = runner.load_library().name
    old = [name for name in libraries["before"] if name != own]
    assert (len(old), libraries["after"]) == (1, [own])
    assert report["finish"] == {
        "returncode": 0, "output": "data layout 5 is in force; relay 0.6.2 writes no newer one"
                                   f"\nfunction libraries of no live process deleted: {old[0]}"}
    # the ordered channels, made under layouts 4 and 5, wait numbered in msgs and each
    # delivered every producer's messages in order
    ordered = report["ordered"]
    assert (ordered["held"]["gate"], ordered["after"]["gate"]) == ("numbered", "numbered")
    assert ordered["held"]["received"] == report["acknowledged"]
    assert ordered["after"]["received"] > 100
    assert (ordered["held"]["out_of_order"], ordered["after"]["out_of_order"]) == (0, 0)
    # under layout 5 the backlog drained through lots, and missed nothing
    assert report["backlog"]["lost"] == 0
    assert report["backlog"]["most_lots_in_flight"] > 0
    # under layout 5 a message of priority 9 overtakes 20 plain ones
    assert (report["priority"]["status"], report["priority"]["first"],
            report["priority"]["id"][0]) == (200, "urgent", "9")
    # a producer waits no longer than a broker's replacement (its port unserved) and a retry
    longest_replacement = max(s.get("unserved_s", 0) for s in report["steps"])
    assert report["longest_publish_wait_ms"] < (longest_replacement + 2) * 1000
