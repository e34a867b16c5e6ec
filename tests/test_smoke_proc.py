import pytest

from tests.helpers.wire import Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out


def test_pub_sub_fin(broker):
    p = Wire(broker)
    assert p.pub("smoke", b"hi") == (0, b"OK")
    c = Wire(broker)
    assert c.sub("smoke", "ch", rdy=1) == (0, b"OK")
    ts, attempts, msg_id, body = c.message()
    assert (attempts, msg_id, body) == (1, b"0000000000000001", b"hi")
