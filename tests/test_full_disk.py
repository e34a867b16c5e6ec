"""A full disk under AOF (issue 36): the embedded server writes its AOF to a small
filesystem of the test's own (tmpfs, which needs root: the test skips without it) that
a ballast file fills. Publishes are refused with the cause, nothing acknowledged is lost,
and once the ballast goes Redis writes its AOF again by itself (no BGREWRITEAOF, no
restart): publishing takes again, and the AOF holds every acknowledged message."""

import os
import subprocess
import time

import pytest
import redis

from relay import embedded
from relay.codec import FRAME_ERROR, FRAME_RESPONSE
from tests.helpers.api import Api
from tests.helpers.processes import Processes
from tests.helpers.wire import Wire

CONF = os.path.join(os.path.dirname(os.path.dirname(__file__)), "conf", "redis.conf")
DISK = "8m"
BALLAST = 6_000_000     # bytes of the filesystem taken before Redis starts
BODY = 1000
CAUSE = "redis cannot write its AOF: No space left on device"


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of DISK mounted for this test, with the ballast in it: its path."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs",
                              str(disk)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem: {mounted.stderr.strip()}")
    (disk / "ballast").write_bytes(b"\0" * BALLAST)
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.fixture
def aof_on_small_disk(small_disk, tmp_path):
    """The embedded Redis (conf/redis.conf: AOF, fsync every second) with its data on
    the small disk, a broker and a scanner: (client, tcp port, Api)."""
    port = embedded.free_port()
    proc = embedded.start(port, str(small_disk / "redis"), CONF,
                          extra=("--enable-debug-command", "local"))   # DEBUG LOADAOF
    procs = Processes(f"redis://127.0.0.1:{port}/0", str(tmp_path))
    _, tcp_port = procs.broker()
    procs.scanner()
    yield redis.Redis(port=port), tcp_port, Api(tcp_port, procs.http_ports[tcp_port])
    procs.stop_all()
    proc.terminate()
    proc.wait(10)


def test_a_full_disk_refuses_publishes_with_the_cause_and_redis_resumes_by_itself(
        aof_on_small_disk, small_disk):
    client, port, api = aof_on_small_disk
    assert api.request("POST", "/topic/create?topic=t")[0] == 200
    assert api.request("POST", "/channel/create?topic=t&channel=c")[0] == 200
    acknowledged: list[bytes] = []
    wire = Wire(port)
    while True:
        bodies = [b"%06d" % (len(acknowledged) + i) + b"x" * (BODY - 6) for i in range(20)]
        reply = wire.mpub("t", bodies)
        if reply != (FRAME_RESPONSE, b"OK"):
            break
        acknowledged += bodies
    assert reply == (FRAME_ERROR, f"E_MPUB_FAILED MPUB failed: {CAUSE}".encode())
    assert Wire(port).pub("t", b"x") == (FRAME_ERROR, f"E_PUB_FAILED PUB failed: {CAUSE}"
                                         .encode())
    assert api.json("POST", "/pub?topic=t", b"x") == (503, {"message": CAUSE})
    assert api.request("GET", "/ping")[:2] == (500, f"NOK - {CAUSE}".encode())
    assert client.info("persistence")["aof_last_write_status"] == "err"

    (small_disk / "ballast").unlink()                    # space again
    freed = time.monotonic()
    while Wire(port).pub("t", b"again") != (FRAME_RESPONSE, b"OK"):
        time.sleep(0.05)
    resumed = time.monotonic() - freed
    assert client.info("persistence")["aof_last_write_status"] == "ok"
    assert api.request("GET", "/ping")[:2] == (200, b"OK")
    client.execute_command("DEBUG", "LOADAOF")   # the data as the AOF has it, reloaded
    assert client.llen("relay:{t}:ch:c:queue") == len(acknowledged) + 1

    consumer = Wire(port)
    consumer.identify()
    assert consumer.sub("t", "c", rdy=100) == (FRAME_RESPONSE, b"OK")
    delivered = []
    for _ in range(len(acknowledged) + 1):
        _, _, msg_id, got = consumer.message()
        delivered.append(got)
        consumer.command(b"FIN " + msg_id)
    assert delivered == acknowledged + [b"again"] and consumer.nothing()
    print(f"\nacknowledged={len(acknowledged)} delivered={len(delivered) - 1} "
          f"lost={len(set(acknowledged) - set(delivered))} resumed_after={resumed:.3f}s")
