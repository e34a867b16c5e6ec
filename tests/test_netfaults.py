"""Network faults between hosts under load (scripts/netfaults.py, short runs): Redis,
the brokers and the clients each on a host of their own (network namespaces on a
private bridge, tests/helpers/netns.py). Whatever the fault, a PUB is answered within
--redis-timeout, nothing acknowledged is lost, and everything resumes without a
restart. Needs root, iproute2 and nftables (scripts/setup installs them when it can);
skipped with the reason otherwise."""

import pytest

from scripts import netfaults
from tests.helpers import netns

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

REDIS_TIMEOUT = 2.0
SLACK = 0.5     # a client's view of a refusal: the broker's deadline, plus the wire and a busy CPU


@pytest.fixture(scope="module")
def can_build_hosts():
    reason = netns.missing()
    if reason:
        pytest.skip(f"network faults: {reason}")


@pytest.fixture
def hosts(can_build_hosts):
    """Hosts of their own, removed with everything running on them whatever the outcome."""
    built = netns.Hosts()
    yield built
    built.close()


def run(hosts, scenario: str, fault: float) -> dict:
    args = netfaults.parse(["--fault", str(fault), "--warmup", "2", "--after", "3",
                            "--redis-timeout", f"{REDIS_TIMEOUT:g}s", "--drain-timeout", "20"])
    report = netfaults.run(scenario, args, hosts)
    print(report)
    return report


def check_common(report: dict) -> None:
    """What every fault must leave: no publish answered past --redis-timeout, every
    refusal nsqd's E_PUB_FAILED (failed, or of unknown outcome: sent and not answered),
    nothing acknowledged lost, no broker restarted."""
    assert report["acknowledged"] > 200
    assert (report["lost"], report["delivered"]) == (0, report["acknowledged"])
    assert set(report["refusals"]) <= {"E_PUB_FAILED PUB failed",
                                       "E_PUB_FAILED PUB outcome unknown"}
    assert report["slowest_publish_s"] <= REDIS_TIMEOUT + SLACK
    assert (report["brokers_restarted"], report["tracebacks"]) == (0, 0)


def test_a_10s_partition_from_redis_fails_publishes_in_time_then_resumes(hosts):
    report = run(hosts, "partition", 10)
    check_common(report)
    assert report["publishes_refused"] >= 8     # 4 producers, 10 s, 2 s each at most
    assert report["longest_publish_gap_s"] >= 9.5
    assert report["consumer_reconnects"] == 0   # the brokers kept them, heartbeats and all
    assert report["publish_resumed_s"] < 5.0
    assert report["delivery_resumed_s"] < 5.0


def test_a_consumer_cut_off_its_broker_reconnects_and_its_messages_go_to_others(hosts):
    report = run(hosts, "consumer", 6)
    check_common(report)
    assert report["packets_dropped"] > 0
    assert report["publishes_refused"] == 0
    assert report["consumer_reconnects"] >= 1
    assert report["delivery_resumed_s"] < 5.0   # the lone consumer's, back on its broker


def test_5_percent_packet_loss_to_redis_slows_nothing_past_the_timeout(hosts):
    report = run(hosts, "loss", 6)
    check_common(report)
    assert report["packets_dropped"] > 0
    assert report["longest_publish_gap_s"] < REDIS_TIMEOUT


def test_50ms_latency_to_redis_loses_nothing(hosts):
    report = run(hosts, "latency", 6)
    check_common(report)
    assert report["median_publish_s"] >= 0.05   # a PUB waits at least one round trip
    assert report["publishes_refused"] == 0
