"""The short chaos run: brokers, scanners and Redis killed -9 under load, nothing lost."""

import json
import subprocess
import sys


def test_every_acknowledged_message_is_delivered_through_kills():
    out = subprocess.run(
        [sys.executable, "-m", "scripts.chaos", "--messages", "20000", "--brokers", "2",
         "--scanners", "2", "--kill-interval", "1.5", "--redis-kills", "2",
         "--appendfsync", "always"],
        capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    print(report)
    assert (report["messages"], report["acknowledged"], report["delivered"]) == (
        20000, 20000, 20000)
    assert (report["lost"], report["left_queued"], report["left_in_flight"],
            report["left_deferred"]) == (0, 0, 0, 0)
    assert report["kills"]["redis"] == 2
    assert sum(report["kills"].values()) >= 6
    assert report["seconds"] < 120
