"""One Options dataclass: nsqd's option names and defaults (nsqd/options.go).

Durations are kept in milliseconds. Sources, lowest first: defaults, the config
file (TOML, nsqd's names with underscores), `RELAY_<NAME>` environment variables
(and `REDIS_URL`), command-line flags (nsqd's names with dashes).
"""

import dataclasses
import datetime
import os
import re
import socket
import tomllib
from dataclasses import dataclass, field

from marshmallow import Schema, ValidationError, fields, post_load, validate

from relay.codec import MAX_PARTITIONS, is_valid_name
from relay.errors import ConfigError
from relay.log import LEVELS

DURATION = "duration"
DEFAULT_CONFIG = "conf/relay.toml"
DEFAULT_DEAD_LETTER_TOPIC = "{topic}.dead"
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)")


def redacted_url(url: str) -> str:
    """A Redis URL for logs and messages: its password (in the user part, however many
    '@' it holds, or a `password=` argument) as ***."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    where, question, query = rest.partition("?")
    credentials, at, host = where.rpartition("@")
    if at:
        user, colon, _ = credentials.partition(":")
        where = f"{user}:***@{host}" if colon else f"***@{host}"
    query = re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", query)
    return f"{scheme}://{where}{question}{query}"


def parse_duration(value) -> int:
    """'60s', '15m', '1h30m', '250ms', '7d' or a number of milliseconds -> milliseconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {value!r} (use e.g. 250ms, 60s, 15m, 1h)")
    return int(sum(float(n) * _UNITS[u] for n, u in parts))


def parse_time(value: str) -> int:
    """ISO 8601 (UTC unless it says otherwise) -> ms since the epoch."""
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"not a time: {value!r} (use ISO 8601, e.g. "
                         f"2026-11-25T10:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)


def parse_moment(value: str) -> int:
    """ms since the epoch (digits), or ISO 8601 as parse_time -> ms since the epoch."""
    return int(value) if value.isdigit() else parse_time(value)


def parse_size(value) -> int:
    """'1GB', '500MB', '64KiB' or a number of bytes -> bytes (KB, MB, GB, TB in powers of
    1000; KiB, MiB, GiB, TiB in powers of 1024)."""
    text = str(value).strip()
    match = _SIZE.fullmatch(text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a size: {value!r} (use e.g. 1GB, 500MB, 64KiB, 1000000)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


BROKER, SCANNER, JOBS, REDIS, CONSOLE = "broker", "scanner", "jobs", "redis", "console"


def _opt(default, help, kind=None, used_by=(BROKER,), **meta):
    """An option, with the processes that use it: their flags and --help list it."""
    return field(default=default, metadata={"help": help, "kind": kind, "used_by": used_by,
                                            **meta})


@dataclass(frozen=True)
class Options:
    tcp_address: str = _opt("0.0.0.0:4150", "<addr>:<port> to listen on for TCP clients")
    workers: int = _opt(1, "broker processes sharing the ports (SO_REUSEPORT), forked and "
                        "kept running by this one; auto: one per core this process may "
                        "use (default 1: this process serves)")
    http_address: str = _opt("0.0.0.0:4151", "<addr>:<port> for the HTTP API (empty: none)")
    lookupd_http_address: str = _opt("", "<addr>:<port> for nsqlookupd's HTTP API alone, "
                                     "e.g. 0.0.0.0:4161 (default none: it is on "
                                     "--http-address too)")
    broadcast_address: str = _opt(socket.gethostname(), "address this broker is known by")
    tombstone_lifetime: int = _opt(45_000, "how long a broker tombstoned for a topic (nsqlookupd's "
                                   "/topic/tombstone) is left out of /lookup", DURATION)
    redis_url: str = _opt("redis://127.0.0.1:6379/0", "Redis holding all queue state",
                          used_by=(BROKER, SCANNER, JOBS, REDIS, CONSOLE), secret=True)
    msg_timeout: int = _opt(60_000, "default time to wait for a FIN before requeueing", DURATION)
    max_msg_timeout: int = _opt(900_000, "largest msg_timeout a client may ask for", DURATION)
    max_msg_size: int = _opt(1_048_576, "largest message body in bytes")
    max_body_size: int = _opt(5_242_880, "largest command body in bytes (MPUB, IDENTIFY)")
    max_rdy_count: int = _opt(2500, "largest RDY count a client may send")
    max_req_timeout: int = _opt(3_600_000, "largest REQ delay (and DPUB defer, unless "
                                "--max-defer-timeout is set)", DURATION)
    max_defer_timeout: int = _opt(None, "largest DPUB and /pub?defer= defer, e.g. 7d "
                                  "(default: --max-req-timeout's value)", DURATION)
    client_timeout: int = _opt(60_000, "close a client silent this long (heartbeat = half)",
                               DURATION)
    max_heartbeat_interval: int = _opt(60_000, "largest heartbeat_interval in IDENTIFY",
                                       DURATION)
    output_buffer_timeout: int = _opt(250, "default output_buffer_timeout", DURATION)
    min_output_buffer_timeout: int = _opt(25, "smallest output_buffer_timeout in IDENTIFY",
                                          DURATION)
    max_output_buffer_timeout: int = _opt(30_000, "largest output_buffer_timeout in IDENTIFY",
                                          DURATION)
    max_output_buffer_size: int = _opt(65_536, "largest output_buffer_size in IDENTIFY")
    max_deflate_level: int = _opt(6, "largest deflate_level in IDENTIFY")
    https_address: str = _opt("0.0.0.0:4152", "<addr>:<port> for the HTTP API over TLS "
                              "(served when --tls-cert is set; empty: none)")
    tls_cert: str = _opt("", "path to the certificate file (turns TLS on)")
    tls_key: str = _opt("", "path to the private key file")
    tls_root_ca_file: str = _opt("", "CA file that verifies client certificates")
    tls_client_auth_policy: str = _opt("", "require or require-verify a client certificate "
                                           "(both verify it against --tls-root-ca-file)")
    tls_required: int = _opt(0, "0: TLS optional; 1 (tcp-https): TCP clients must "
                                "upgrade; 2 (true): also no plain HTTP API")
    tls_min_version: str = _opt("tls1.2", "oldest TLS version accepted (tls1.0 .. tls1.3)")
    snappy: bool = _opt(True, "allow snappy compression in IDENTIFY")
    deflate: bool = _opt(True, "allow deflate compression in IDENTIFY")
    auth_http_address: str = _opt("", "<addr>:<port> of auth servers, comma separated "
                                      "(turns AUTH on)")
    auth_http_request_method: str = _opt("get", "how to ask them: get or post")
    auth_file: str = _opt("", "JSON file of secret -> auth server reply, for AUTH "
                              "without an auth server")
    queue_scan_interval: int = _opt(100, "how often scanners look for due messages", DURATION,
                                    used_by=(SCANNER,))
    queue_scan_limit: int = _opt(1000, "messages a scanner moves per channel per call",
                                 used_by=(SCANNER,))
    max_attempts: int = _opt(0, "deliveries of a message before it goes to the dead-letter "
                             "topic (0: unlimited, as nsqd); relay-admin config sets it "
                             "per channel. Scanners take the brokers' value: with it, "
                             "the messages their sweep expires are dead letters too",
                             used_by=(BROKER, SCANNER))
    dead_letter_topic: str = _opt(DEFAULT_DEAD_LETTER_TOPIC, "where dead letters go ({topic} is "
                                  "the topic's name); relay-admin config sets it per channel",
                                  used_by=(SCANNER,))
    commit_lanes: int = _opt(4, "Redis pipelines a broker keeps in flight at once")
    redis_timeout: int = _opt(5000, "give up on a Redis call after this long", DURATION,
                              used_by=(BROKER, SCANNER, CONSOLE))
    wait_replicas: int = _opt(0, "replicas that must hold a publish before it is "
                              "acknowledged (WAIT; 0: the master alone)",
                              used_by=(BROKER, SCANNER, CONSOLE))
    topic_partitions: int = _opt(1, "partitions of each topic created from now on, each "
                                 "a slot of its own (relay-admin create --partitions sets "
                                 "one topic's)", used_by=(BROKER, SCANNER))
    retention_time: int = _opt(0, "how long each topic created from now on keeps a copy of "
                               "every message published, for replay (0: none, as nsqd; "
                               "relay-admin retention sets one topic's)", DURATION,
                               used_by=(BROKER, SCANNER))
    e2e_processing_latency_percentiles: tuple = _opt(
        (), "quantiles of publish-to-FIN time shown in /stats, e.g. 0.99,0.95 (empty: off)",
        flag="e2e-processing-latency-percentile")
    e2e_processing_latency_window_time: int = _opt(
        600_000, "time window over which those quantiles are computed", DURATION)
    log_level: str = _opt("info", "debug, info, warn, error or fatal, as nsqd (or warning)",
                          used_by=(BROKER, SCANNER, JOBS, CONSOLE))
    console_address: str = _opt("127.0.0.1:4180", "<addr>:<port> of the web console",
                                used_by=(CONSOLE,))
    console_write: bool = _opt(False, "let the web console change things (pause, empty, "
                               "delete, redrive, replay, create); without it, read-only",
                               used_by=(CONSOLE,), switch=True)
    console_auth_file: str = _opt("", "JSON file of secret -> grants (--auth-file's format): "
                                  "the console asks for a login and checks each action "
                                  "against the user's grants", used_by=(CONSOLE,))

    def __post_init__(self) -> None:
        """An unset --max-defer-timeout follows --max-req-timeout, so DPUB keeps nsqd's
        bound unless a longer one is asked for."""
        if self.max_defer_timeout is None:
            object.__setattr__(self, "max_defer_timeout", self.max_req_timeout)

    @property
    def heartbeat_interval(self) -> int:
        return self.client_timeout // 2


def _address(value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not (sep and port.isdigit() and int(port) <= 65535):
        raise ValidationError(f"not a <host>:<port> address: {value!r}")


class _Duration(fields.Field):
    def _deserialize(self, value, attr, data, **kwargs):
        try:
            return parse_duration(value)
        except ValueError as e:
            raise ValidationError(str(e)) from None


class _Count(fields.Integer):
    """A whole number, from TOML or a flag/env string; 2.5 is an error, not 2."""

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, float) or isinstance(value, bool):
            raise ValidationError(f"not a whole number: {value!r}")
        return super()._deserialize(value, attr, data, **kwargs)


class _Workers(_Count):
    """A count, or `auto`: one per core the process may run on (its CPU affinity, which
    a container's cpuset limits)."""

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, str) and value.strip().lower() == "auto":
            return len(os.sched_getaffinity(0))
        return super()._deserialize(value, attr, data, **kwargs)


class _Quantiles(fields.Field):
    """0.99,0.95 (flag, env) or [0.99, 0.95] (TOML): each in (0, 1], as nsqd checks."""

    def _deserialize(self, value, attr, data, **kwargs):
        items = value.split(",") if isinstance(value, str) else value
        try:
            quantiles = tuple(float(v) for v in items if str(v).strip())
        except (TypeError, ValueError):
            raise ValidationError(f"not a list of quantiles: {value!r}") from None
        for q in quantiles:
            if not 0 < q <= 1:
                raise ValidationError(f"quantile {q} is not in (0, 1]")
        return quantiles


class _TlsRequired(fields.Field):
    """nsqd's --tls-required: false/true/tcp-https, or 0/1/2 as nsqd's config file."""

    WORDS = {"false": 0, "0": 0, "tcp-https": 1, "1": 1, "true": 2, "2": 2}

    def _deserialize(self, value, attr, data, **kwargs):
        key = str(value).lower()
        if key not in self.WORDS:
            raise ValidationError(f"not one of false, tcp-https, true (0, 1, 2): {value!r}")
        return self.WORDS[key]


class _LogLevel(fields.Field):
    """nsqd's level names in any case, kept in lower case; Python's warning too."""

    def _deserialize(self, value, attr, data, **kwargs):
        level = str(value).lower()
        if level not in LEVELS:
            raise ValidationError(f"not one of debug, info, warn, error, fatal: {value!r}")
        return level


def _check_tls(opts) -> None:
    if bool(opts.tls_cert) != bool(opts.tls_key):
        raise ValidationError("give both tls_cert and tls_key", "tls_cert")
    if opts.tls_required and not opts.tls_cert:
        raise ValidationError("tls_required needs tls_cert and tls_key", "tls_required")
    if opts.tls_client_auth_policy and not opts.tls_root_ca_file:
        raise ValidationError("a client certificate policy needs tls_root_ca_file: Python's "
                              "ssl verifies every client certificate it asks for",
                              "tls_client_auth_policy")


_positive = validate.Range(min=1)


def _dead_letter_topic(value: str) -> None:
    try:
        name = value.format(topic="t")
    except (KeyError, IndexError, ValueError):
        raise ValidationError(f"only {{topic}} may appear in braces: {value!r}") from None
    if not is_valid_name(name):
        raise ValidationError(f"not a topic name: {value!r}")


class OptionsSchema(Schema):
    tcp_address = fields.String(validate=_address)
    workers = _Workers(validate=validate.Range(min=1, max=256))
    http_address = fields.String(validate=lambda v: v == "" or _address(v))
    lookupd_http_address = fields.String(validate=lambda v: v == "" or _address(v))
    broadcast_address = fields.String(validate=validate.Length(min=1))
    tombstone_lifetime = _Duration(validate=_positive)
    redis_url = fields.String(validate=validate.Regexp(r"^(redis|rediss|unix)://"))
    msg_timeout = _Duration(validate=_positive)
    max_msg_timeout = _Duration(validate=_positive)
    max_msg_size = _Count(validate=_positive)
    max_body_size = _Count(validate=_positive)
    max_rdy_count = _Count(validate=_positive)
    max_req_timeout = _Duration(validate=validate.Range(min=0))
    max_defer_timeout = _Duration(validate=validate.Range(min=0))
    client_timeout = _Duration(validate=validate.Range(min=2))
    max_heartbeat_interval = _Duration(validate=_positive)
    output_buffer_timeout = _Duration(validate=validate.Range(min=0))
    min_output_buffer_timeout = _Duration(validate=validate.Range(min=0))
    max_output_buffer_timeout = _Duration(validate=_positive)
    max_output_buffer_size = _Count(validate=_positive)
    max_deflate_level = _Count(validate=validate.Range(min=1, max=9))
    https_address = fields.String(validate=lambda v: v == "" or _address(v))
    tls_cert = fields.String()
    tls_key = fields.String()
    tls_root_ca_file = fields.String()
    tls_client_auth_policy = fields.String(validate=validate.OneOf(
        ["", "require", "require-verify"]))
    tls_required = _TlsRequired()
    tls_min_version = fields.String(validate=validate.OneOf(
        ["tls1.0", "tls1.1", "tls1.2", "tls1.3"]))
    snappy = fields.Boolean()
    deflate = fields.Boolean()
    auth_http_address = fields.String(validate=lambda v: [
        _address(a.strip()) for a in v.split(",") if a.strip()])
    auth_http_request_method = fields.String(validate=validate.OneOf(["get", "post"]))
    auth_file = fields.String()
    console_address = fields.String(validate=_address)
    console_write = fields.Boolean()
    console_auth_file = fields.String()
    queue_scan_interval = _Duration(validate=_positive)
    queue_scan_limit = _Count(validate=_positive)
    max_attempts = _Count(validate=validate.Range(min=0, max=65535))
    dead_letter_topic = fields.String(validate=_dead_letter_topic)
    commit_lanes = _Count(validate=validate.Range(min=1, max=64))
    redis_timeout = _Duration(validate=_positive)
    wait_replicas = _Count(validate=validate.Range(min=0))
    topic_partitions = _Count(validate=validate.Range(min=1, max=MAX_PARTITIONS))
    retention_time = _Duration(validate=validate.Range(min=0))
    e2e_processing_latency_percentiles = _Quantiles()
    e2e_processing_latency_window_time = _Duration(validate=_positive)
    log_level = _LogLevel()

    @post_load
    def make(self, data, **kwargs):
        opts = Options(**data)
        if opts.msg_timeout > opts.max_msg_timeout:
            raise ValidationError("msg_timeout must not exceed max_msg_timeout", "msg_timeout")
        if opts.max_msg_size > opts.max_body_size:
            raise ValidationError("max_msg_size must not exceed max_body_size", "max_msg_size")
        _check_tls(opts)
        if opts.auth_http_address and opts.auth_file:
            raise ValidationError("give auth_http_address or auth_file, not both",
                                  "auth_file")
        return opts


OPTION_NAMES = [f.name for f in dataclasses.fields(Options)]


def process_options(process: str) -> list:
    """The options `relay PROCESS` uses, as flags; the others are read from the config
    file and the environment alike but do nothing there."""
    return [f.name for f in dataclasses.fields(Options) if process in f.metadata["used_by"]]


def option_help(name: str) -> str:
    return {f.name: f.metadata["help"] for f in dataclasses.fields(Options)}[name]


def option_switch(name: str) -> bool:
    """Whether the flag is a bare switch (--console-write), not --name VALUE."""
    return {f.name: f for f in dataclasses.fields(Options)}[name].metadata.get("switch", False)


def option_flag(name: str) -> str:
    """nsqd's flag name; a few differ from the config name (e2e percentiles)."""
    spec = {f.name: f for f in dataclasses.fields(Options)}[name]
    return spec.metadata.get("flag") or name.replace("_", "-")


def _read_file(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    unknown = sorted(set(data) - set(OPTION_NAMES))
    if unknown:
        raise ConfigError(f"config file {path}: unknown option {unknown[0]}")
    return data


def _read_env(environ) -> dict:
    values = {name: environ[f"RELAY_{name.upper()}"] for name in OPTION_NAMES
              if f"RELAY_{name.upper()}" in environ}
    if "redis_url" not in values and environ.get("REDIS_URL"):
        values["redis_url"] = environ["REDIS_URL"]
    return values


def config_file(given: str | None = None, environ=None) -> str | None:
    """The config file: the one given, else RELAY_CONFIG, else conf/relay.toml if present
    (run from the project folder), else none."""
    environ = os.environ if environ is None else environ
    if given or environ.get("RELAY_CONFIG"):
        return given or environ["RELAY_CONFIG"]
    return DEFAULT_CONFIG if os.path.exists(DEFAULT_CONFIG) else None


def option_source(name: str, config: str | None, environ=None) -> str:
    """Where load_options takes an option from when no flag gives it: its environment
    variable, the config file, or the default."""
    environ = os.environ if environ is None else environ
    if f"RELAY_{name.upper()}" in environ:
        return f"RELAY_{name.upper()}"
    if name == "redis_url" and environ.get("REDIS_URL"):
        return "REDIS_URL"
    if config and name in _read_file(config):
        return config
    return "default"


def load_options(flags: dict | None = None, config: str | None = None,
                 environ=None) -> Options:
    """Options from defaults < config file < environment < flags; ConfigError if bad."""
    environ = os.environ if environ is None else environ
    config = config or environ.get("RELAY_CONFIG")
    merged = {}
    if config:
        merged.update(_read_file(config))
    merged.update(_read_env(environ))
    merged.update({k: v for k, v in (flags or {}).items() if v is not None})
    try:
        return OptionsSchema().load(merged)
    except ValidationError as e:
        name, problems = next(iter(e.normalized_messages().items()))
        text = problems[0] if isinstance(problems, list) else problems
        raise ConfigError(f"invalid {name}: {text}") from None
