"""ClientFaults: faults clients cause are logged within a fixed budget, however many."""

import logging

from relay.log import ClientFaults


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record):
        self.lines.append((record.levelname, record.getMessage()))


def faults_logged(level: int) -> tuple[ClientFaults, Records]:
    logger = logging.getLogger(f"test.faults.{level}")
    logger.setLevel(level)
    records = Records()
    logger.handlers[:] = [records]
    logger.propagate = False
    return ClientFaults(logger, "HTTP requests"), records


def test_a_flood_of_faults_is_ten_debug_lines_and_a_summary_per_address():
    faults, records = faults_logged(logging.DEBUG)
    for i in range(20_000):
        faults.note("aborted", ("127.0.0.1", 5000 + i), "the connection ended mid-request")
    for i in range(8):
        faults.note("malformed", (f"10.0.0.{i}", 1), "400 Bad Request")
    faults.timer.kill()
    faults.summarize()
    assert records.lines[:10] == [("DEBUG", "aborted HTTP requests from 127.0.0.1: the "
                                            "connection ended mid-request")] * 10
    assert records.lines[10:] == [
        ("INFO", "20,000 aborted HTTP requests in the last 10 s from 127.0.0.1"),
        *[("INFO", f"1 malformed HTTP requests in the last 10 s from 10.0.0.{i}")
          for i in range(4)],
        ("INFO", "4 more faulty HTTP requests in the last 10 s from 4 other addresses")]


def test_each_window_starts_its_budget_afresh_and_info_level_logs_no_debug():
    faults, records = faults_logged(logging.INFO)
    faults.note("reset", ("::1", 1, 0, 0), "Connection reset by peer")
    faults.timer.kill()
    faults.summarize()
    faults.note("reset", ("::1", 1, 0, 0), "Connection reset by peer")
    faults.timer.kill()
    faults.summarize()
    faults.summarize()     # an empty window logs nothing
    assert records.lines == [("INFO", "1 reset HTTP requests in the last 10 s from ::1")] * 2
