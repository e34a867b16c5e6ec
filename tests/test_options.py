"""Options: nsqd's defaults, the precedence of sources, one-line errors, durations."""

import os
import socket

import pytest
from click.testing import CliRunner

from relay.errors import ConfigError
from relay.options import OPTION_NAMES, Options, load_options, parse_duration, redacted_url

NSQD_DEFAULTS = {
    "tcp_address": "0.0.0.0:4150",
    "http_address": "0.0.0.0:4151",
    "msg_timeout": 60_000,
    "max_msg_timeout": 900_000,
    "max_msg_size": 1_048_576,
    "max_body_size": 5_242_880,
    "max_rdy_count": 2500,
    "max_req_timeout": 3_600_000,
    "max_defer_timeout": 3_600_000,
    "client_timeout": 60_000,
    "max_heartbeat_interval": 60_000,
    "output_buffer_timeout": 250,
    "min_output_buffer_timeout": 25,
    "max_output_buffer_timeout": 30_000,
    "max_output_buffer_size": 65_536,
    "max_deflate_level": 6,
    "queue_scan_interval": 100,
}


def write(tmp_path, text, name="relay.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def config_error(**kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        load_options(**kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# -- defaults ----------------------------------------------------------------------

def test_defaults_are_nsqds():
    opts = load_options({}, None, environ={})
    assert {name: getattr(opts, name) for name in NSQD_DEFAULTS} == NSQD_DEFAULTS
    assert opts == Options()
    assert opts.heartbeat_interval == 30_000  # nsqd: client_timeout / 2
    assert opts.broadcast_address == socket.gethostname()
    assert opts.redis_url == "redis://127.0.0.1:6379/0"
    assert (opts.queue_scan_limit, opts.redis_timeout, opts.log_level) == (1000, 5000, "info")


def test_shipped_config_file_states_the_defaults():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    opts = load_options({}, os.path.join(here, "conf", "relay.toml"), environ={})
    assert opts == Options()


def test_flags_left_unset_are_ignored():
    flags = {name: None for name in OPTION_NAMES}
    assert load_options(flags, None, environ={}) == Options()


# -- precedence --------------------------------------------------------------------

def test_file_overrides_defaults(tmp_path):
    path = write(tmp_path, 'msg_timeout = "2m"\nmax_rdy_count = 100\n'
                           'tcp_address = "127.0.0.1:5150"\n')
    opts = load_options({}, path, environ={})
    assert (opts.msg_timeout, opts.max_rdy_count, opts.tcp_address) == (
        120_000, 100, "127.0.0.1:5150")
    assert opts.client_timeout == 60_000


def test_env_overrides_file_and_flags_override_env(tmp_path):
    path = write(tmp_path, 'msg_timeout = "2m"\nmax_rdy_count = 100\n'
                           'tcp_address = "127.0.0.1:5150"\nlog_level = "debug"\n')
    environ = {"RELAY_MSG_TIMEOUT": "3m", "RELAY_MAX_RDY_COUNT": "200",
               "RELAY_LOG_LEVEL": "warning"}
    opts = load_options({"msg_timeout": "4m", "log_level": None}, path, environ=environ)
    assert opts.msg_timeout == 240_000       # flag
    assert opts.max_rdy_count == 200         # env over file
    assert opts.log_level == "warning"       # env; the unset flag does not count
    assert opts.tcp_address == "127.0.0.1:5150"  # file
    assert opts.max_msg_size == 1_048_576    # default


def test_env_values_are_parsed():
    environ = {"RELAY_CLIENT_TIMEOUT": "10s", "RELAY_MAX_MSG_SIZE": "1024",
               "RELAY_MAX_REQ_TIMEOUT": "1h30m", "RELAY_WORKERS": "2",
               "RELAY_NOT_AN_OPTION": "x"}
    opts = load_options({}, None, environ=environ)
    assert (opts.client_timeout, opts.max_msg_size, opts.max_req_timeout, opts.workers) == (
        10_000, 1024, 5_400_000, 2)
    assert opts.heartbeat_interval == 5_000


def test_workers_auto_is_one_per_core_the_process_may_use(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5})
    assert load_options({"workers": "auto"}, None, environ={}).workers == 3
    assert load_options({}, None, environ={"RELAY_WORKERS": "AUTO"}).workers == 3
    assert load_options({}, write(tmp_path, 'workers = "auto"\n'), environ={}).workers == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert load_options({"workers": "auto"}, None, environ={}).workers == 1


def test_redis_url_sources(tmp_path):
    path = write(tmp_path, 'redis_url = "redis://file:6379/0"\n')
    assert load_options({}, path, environ={}).redis_url == "redis://file:6379/0"
    env = {"REDIS_URL": "redis://plain:6379/1"}
    assert load_options({}, path, environ=env).redis_url == "redis://plain:6379/1"
    env["RELAY_REDIS_URL"] = "redis://relay:6379/2"
    assert load_options({}, path, environ=env).redis_url == "redis://relay:6379/2"
    flags = {"redis_url": "redis://flag:6379/3"}
    assert load_options(flags, path, environ=env).redis_url == "redis://flag:6379/3"
    # an empty REDIS_URL is no setting
    assert load_options({}, None, environ={"REDIS_URL": ""}).redis_url == \
        "redis://127.0.0.1:6379/0"


def test_config_path_from_relay_config(tmp_path):
    env_file = write(tmp_path, "max_rdy_count = 7\n", "env.toml")
    arg_file = write(tmp_path, "max_rdy_count = 9\n", "arg.toml")
    environ = {"RELAY_CONFIG": env_file}
    assert load_options({}, None, environ=environ).max_rdy_count == 7
    assert load_options({}, arg_file, environ=environ).max_rdy_count == 9


def test_process_environment_is_the_default(monkeypatch):
    for name in list(os.environ):
        if name.startswith("RELAY_") or name == "REDIS_URL":
            monkeypatch.delenv(name)
    monkeypatch.setenv("RELAY_MAX_RDY_COUNT", "33")
    assert load_options({}).max_rdy_count == 33


# -- errors ------------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [
    ("msg_timeout", "nonsense"),
    ("msg_timeout", "0"),
    ("msg_timeout", True),
    ("max_msg_timeout", "-5"),
    ("max_rdy_count", "abc"),
    ("max_rdy_count", 0),
    ("max_rdy_count", "2.5"),
    ("max_rdy_count", True),
    ("max_msg_size", -1),
    ("tcp_address", "nohost"),
    ("tcp_address", "127.0.0.1:99999"),
    ("tcp_address", "127.0.0.1:http"),
    ("http_address", "4151"),
    ("redis_url", "http://localhost:6379"),
    ("log_level", "loud"),
    ("max_deflate_level", 10),
    ("max_deflate_level", 0),
    ("client_timeout", 1),
    ("queue_scan_interval", "0ms"),
    ("queue_scan_limit", "0"),
    ("broadcast_address", ""),
    ("max_req_timeout", "-1s"),
    ("max_defer_timeout", "-1s"),
    ("max_defer_timeout", "-5"),
    ("max_defer_timeout", "a week"),
    ("e2e_processing_latency_percentiles", "0.99,1.5"),
    ("e2e_processing_latency_percentiles", "0"),
    ("e2e_processing_latency_percentiles", "p99"),
    ("e2e_processing_latency_window_time", "0s"),
    ("workers", "0"),
    ("workers", "all"),
])
def test_bad_flag_values(name, value):
    message = config_error(flags={name: value}, config=None, environ={})
    assert message.startswith(f"invalid {name}: ")
    assert len(message) > len(f"invalid {name}: ")


def test_max_defer_timeout_follows_max_req_timeout_unless_set(tmp_path):
    assert load_options({"max_req_timeout": "2h"}, None, environ={}).max_defer_timeout == \
        7_200_000
    path = write(tmp_path, 'max_req_timeout = "30m"\nmax_defer_timeout = "7d"\n')
    opts = load_options({}, path, environ={})
    assert (opts.max_req_timeout, opts.max_defer_timeout) == (1_800_000, 604_800_000)
    opts = load_options({}, None, environ={"RELAY_MAX_DEFER_TIMEOUT": "10s"})
    assert (opts.max_req_timeout, opts.max_defer_timeout) == (3_600_000, 10_000)


def test_bad_max_defer_timeout_messages():
    assert config_error(flags={"max_defer_timeout": "-5"}, config=None, environ={}) == (
        "invalid max_defer_timeout: Must be greater than or equal to 0.")
    assert config_error(flags={"max_defer_timeout": "a week"}, config=None, environ={}) == (
        "invalid max_defer_timeout: not a duration: 'a week' (use e.g. 250ms, 60s, 15m, 1h)")


def test_bad_duration_message():
    assert config_error(flags={"msg_timeout": "nonsense"}, config=None, environ={}) == (
        "invalid msg_timeout: not a duration: 'nonsense' (use e.g. 250ms, 60s, 15m, 1h)")


def test_bad_env_and_file_values_name_the_option(tmp_path):
    assert config_error(flags={}, config=None,
                        environ={"RELAY_MAX_RDY_COUNT": "many"}).startswith(
        "invalid max_rdy_count: ")
    path = write(tmp_path, 'client_timeout = "forever"\n')
    assert config_error(flags={}, config=path, environ={}).startswith(
        "invalid client_timeout: ")
    path = write(tmp_path, "max_rdy_count = true\n")
    assert config_error(flags={}, config=path, environ={}).startswith(
        "invalid max_rdy_count: ")


def test_fractional_count_in_file_is_an_error(tmp_path):
    path = write(tmp_path, "max_rdy_count = 2.5\n")
    assert config_error(flags={}, config=path, environ={}).startswith(
        "invalid max_rdy_count: ")


def test_related_limits():
    assert config_error(flags={"msg_timeout": "16m"}, config=None, environ={}) == (
        "invalid msg_timeout: msg_timeout must not exceed max_msg_timeout")
    assert config_error(flags={"max_msg_size": 6_000_000}, config=None, environ={}) == (
        "invalid max_msg_size: max_msg_size must not exceed max_body_size")
    # raising both together is fine
    opts = load_options({"msg_timeout": "16m", "max_msg_timeout": "20m"}, None, environ={})
    assert (opts.msg_timeout, opts.max_msg_timeout) == (960_000, 1_200_000)


def test_unknown_key_in_file_is_an_error(tmp_path):
    path = write(tmp_path, 'msg_timeout = "1m"\nmsg-timeout = "2m"\nzzz = 1\n')
    assert config_error(flags={}, config=path, environ={}) == (
        f"config file {path}: unknown option msg-timeout")


def test_unreadable_or_invalid_file(tmp_path):
    missing = str(tmp_path / "missing.toml")
    assert config_error(flags={}, config=missing, environ={}) == (
        f"cannot read config file {missing}: No such file or directory")
    path = write(tmp_path, "msg_timeout = \n")
    assert config_error(flags={}, config=path, environ={}).startswith(
        f"config file {path} is not valid TOML: ")


def test_addresses_accepted():
    for addr in ("127.0.0.1:4150", ":4150", "[::1]:4150", "localhost:0"):
        assert load_options({"tcp_address": addr}, None, environ={}).tcp_address == addr


# -- durations ---------------------------------------------------------------------

@pytest.mark.parametrize("text, ms", [
    ("250ms", 250),
    ("60s", 60_000),
    ("15m", 900_000),
    ("1h", 3_600_000),
    ("1h30m", 5_400_000),
    ("1m30s", 90_000),
    ("2s500ms", 2_500),
    ("1.5s", 1_500),
    ("0.5h", 1_800_000),
    ("0s", 0),
    ("60", 60),
    (" 60s ", 60_000),
    ("-5", -5),
    (60, 60),
    (1.9, 1),
    (0, 0),
])
def test_parse_duration(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", [
    "", " ", "s", "ms", "60 s", "1h 30m", "60x", "60sec", "60s5", "s60", "1e3",
    "abc", True, False, None,
])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


# -- the command line --------------------------------------------------------------

@pytest.fixture
def runner(monkeypatch, tmp_path):
    """A CliRunner in an empty directory (no conf/relay.toml) and a clean environment."""
    import gevent.monkey
    # `relay broker` patches the process for gevent before reading options; not here
    monkeypatch.setattr(gevent.monkey, "patch_all", lambda *a, **k: None)
    monkeypatch.chdir(tmp_path)
    env = {name: None for name in os.environ
           if name.startswith("RELAY_") or name == "REDIS_URL"}
    return CliRunner(env=env)


def test_cli_bad_flag_exits_2_with_one_line(runner):
    from relay.cli import main
    result = runner.invoke(main, ["broker", "--msg-timeout", "nonsense"])
    assert result.exit_code == 2
    assert result.stderr == ("relay: invalid msg_timeout: not a duration: 'nonsense' "
                             "(use e.g. 250ms, 60s, 15m, 1h)\n")
    assert result.stdout == ""


def test_e2e_quantiles_from_flag_env_and_file(runner, tmp_path):
    from relay.cli import main
    assert load_options({"e2e_processing_latency_percentiles": "0.99, 0.95"}, None,
                        environ={}).e2e_processing_latency_percentiles == (0.99, 0.95)
    assert load_options({}, None, environ={"RELAY_E2E_PROCESSING_LATENCY_PERCENTILES": "1.0"}
                        ).e2e_processing_latency_percentiles == (1.0,)
    config = tmp_path / "relay.toml"
    config.write_text("e2e_processing_latency_percentiles = [0.5]\n"
                      'e2e_processing_latency_window_time = "1m"\n')
    opts = load_options({}, str(config), environ={})
    assert (opts.e2e_processing_latency_percentiles,
            opts.e2e_processing_latency_window_time) == ((0.5,), 60_000)
    result = runner.invoke(main, ["broker", "--e2e-processing-latency-percentile", "2"])
    assert (result.exit_code, result.stderr) == (
        2, "relay: invalid e2e_processing_latency_percentiles: quantile 2.0 is not in (0, 1]\n")


def test_cli_bad_env_and_config(runner, tmp_path):
    from relay.cli import main
    result = runner.invoke(main, ["scanner"], env={"RELAY_QUEUE_SCAN_LIMIT": "0"})
    assert result.exit_code == 2
    assert result.stderr.startswith("relay: invalid queue_scan_limit: ")
    assert result.stderr.count("\n") == 1

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "relay.toml").write_text("bogus = 1\n")
    result = runner.invoke(main, ["scanner"])
    assert result.exit_code == 2
    assert result.stderr == "relay: config file conf/relay.toml: unknown option bogus\n"


@pytest.mark.parametrize("url,shown", [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://:s3cret@db:6379/0", "redis://:***@db:6379/0"),
    ("redis://app:p@ss@w0rd@db:6379/0", "redis://app:***@db:6379/0"),
    ("rediss://token@db/0", "rediss://***@db/0"),
    ("redis://db:6379/0?password=s3cret&socket_timeout=2",
     "redis://db:6379/0?password=***&socket_timeout=2"),
    ("unix:///run/redis.sock?db=1&password=s3cret", "unix:///run/redis.sock?db=1&password=***"),
])
def test_redis_urls_are_shown_without_their_password(url, shown):
    assert redacted_url(url) == shown
