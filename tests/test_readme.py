"""What the README and docs/*.md tell a newcomer to run, run as written (ports moved to
free ones), and what they name, checked against the project."""

import ast
import dataclasses
import glob
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from relay import admin, cli, embedded, options
from tests.helpers.wait import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def doc_paths() -> list:
    """README.md and the reference it links to, docs/*.md, relative to ROOT."""
    docs = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return ["README.md", *(os.path.relpath(path, ROOT) for path in docs)]


def doc_text(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def readme_commands(first: str) -> list:
    """The commands of the indented block that starts with `first`, in README.md or
    docs/*.md (one block in all of them), each with its continuation lines joined."""
    found = [(path, i, lines) for path in doc_paths()
             for lines in [doc_text(path).splitlines()]
             for i, line in enumerate(lines) if line.startswith("    " + first)
             and not (i and lines[i - 1].startswith("    "))]
    assert len(found) == 1, [path for path, _, _ in found]
    [(_, start, lines)] = found
    block = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        block.append(line[4:])
    commands, current = [], ""
    for line in block:
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


@pytest.mark.integration
@pytest.mark.skipif(not (shutil.which("openssl") and shutil.which("curl")),
                    reason="needs openssl and curl")
def test_tls_example(tmp_path, single_redis_url):
    (tmp_path / "conf").mkdir()
    shutil.copy(os.path.join(ROOT, "conf", "auth.example.json"), tmp_path / "conf")
    for command in readme_commands("openssl req"):
        subprocess.run(command, shell=True, cwd=tmp_path, check=True, capture_output=True)
    broker, curl = readme_commands(".venv/bin/relay broker --tls-cert")
    tcp, https = embedded.free_port(), embedded.free_port()
    broker = broker.replace(".venv/bin/relay", f"{sys.executable} -m relay") \
        .replace("0.0.0.0:4152", f"127.0.0.1:{https}")
    proc = subprocess.Popen(f"exec {broker} --tcp-address 127.0.0.1:{tcp} --http-address ''"
                            f" --redis-url {single_redis_url}", shell=True, cwd=tmp_path,
                            stderr=subprocess.PIPE, text=True)
    try:
        embedded.wait_for_port("127.0.0.1", https, proc)
        published = subprocess.run(curl.replace(":4152", f":{https}"), shell=True,
                                   cwd=tmp_path, capture_output=True, text=True)
        assert (published.returncode, published.stdout) == (0, "OK")
        refused = subprocess.run(curl.replace(":4152", f":{https}")
                                 .replace("orders-producer-secret", "billing-secret"),
                                 shell=True, cwd=tmp_path, capture_output=True, text=True)
        assert refused.stdout == '{"message":"UNAUTHORIZED"}'
        no_cert = subprocess.run(curl.replace(":4152", f":{https}")
                                 .replace("--cert conf/client.pem --key conf/client.key", ""),
                                 shell=True, cwd=tmp_path, capture_output=True, text=True)
        assert no_cert.returncode != 0 and no_cert.stdout == ""
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.integration
def test_a_second_stack_on_other_ports(tmp_path):
    import redis as redis_py
    [command] = readme_commands("RELAY_TCP_ADDRESS=")
    tcp, http, console, redis_port = (embedded.free_port() for _ in range(4))
    command = command.replace(":5150", f":{tcp}").replace(":5151", f":{http}") \
        .replace(":5180", f":{console}").replace(":6380", f":{redis_port}") \
        .replace("scripts/up", f"exec {sys.executable} -m relay up")
    shutil.copy(os.path.join(ROOT, "Procfile"), tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    log = open(tmp_path / "up.log", "w")
    proc = subprocess.Popen(command, shell=True, cwd=tmp_path, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for port in (redis_port, tcp, http, console):
            embedded.wait_for_port("127.0.0.1", port, proc, timeout=30)
        published = subprocess.run(["curl", "-s", "-d", "hi",
                                    f"http://127.0.0.1:{http}/pub?topic=second"],
                                   capture_output=True, text=True)
        assert published.stdout == "OK"
        assert redis_py.Redis(port=redis_port).smembers("relay:topics") == {b"second"}
        cores = len(os.sched_getaffinity(0))    # the Procfile's broker: --workers auto
        assert wait_for(lambda: redis_py.Redis(port=redis_port).zcard("relay:brokers") == cores,
                        timeout=30)
        assert os.listdir(tmp_path / "var" / "redis") == [str(redis_port)]
        overview = subprocess.run(["curl", "-s", f"http://127.0.0.1:{console}/"],
                                  capture_output=True, text=True)
        assert '<a href="/topics/second">second</a>' in overview.stdout
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        log.close()


def anchors(path: str) -> set:
    """The anchors GitHub gives the headings of the Markdown file `path` (code blocks left out)."""
    text = re.sub(r"^```.*?^```", "", doc_text(path), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
            for title in re.findall(r"^#+ (.+)$", text, re.M)}


def test_links_lead_to_the_project_own_files_and_sections():
    for doc in doc_paths():
        for target in re.findall(r"\]\(([^)\s]+)\)", doc_text(doc)):
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(ROOT, os.path.dirname(doc), path or
                                                 os.path.basename(doc)))
            assert full.startswith(ROOT + os.sep), (doc, target)   # nothing outside the project
            assert os.path.exists(full), (doc, target)
            if anchor:
                assert anchor in anchors(os.path.relpath(full, ROOT)), (doc, target)


def test_every_doc_is_linked_from_the_readme():
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)[)#]", doc_text("README.md")))
    assert set(doc_paths()[1:]) - linked == set()


def test_the_module_map_names_every_module():
    """Every Python module of relay/ and workers/ has its line in the README's module map
    (a package's __init__.py may go by its folder's)."""
    section = doc_text("README.md").split("\n## Where things live\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([\w/]+(?:\.py|/))`", section))
    modules = {os.path.relpath(path, ROOT) for top in ("relay", "workers")
               for path in glob.glob(os.path.join(ROOT, top, "**", "*.py"), recursive=True)}
    unnamed = {module for module in modules if module not in named
               and not (os.path.basename(module) == "__init__.py"
                        and os.path.dirname(module) + "/" in named)}
    assert unnamed == set()


# -- what the README names exists: options, defaults, error codes, files --------------

def readme_text() -> str:
    """README.md and docs/*.md, one after the other."""
    return "\n\n".join(doc_text(path) for path in doc_paths())


def script_options() -> dict:
    """--flag -> default of every argparse option of scripts/*.py, read from the source."""
    found = {}
    for name in sorted(os.listdir(os.path.join(ROOT, "scripts"))):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(ROOT, "scripts", name)) as f:
            tree = ast.parse(f.read())
        for call in ast.walk(tree):
            if (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument"
                    and call.args and isinstance(call.args[0], ast.Constant)
                    and str(call.args[0].value).startswith("--")):
                default = [k.value for k in call.keywords if k.arg == "default"]
                try:
                    value = ast.literal_eval(default[0]) if default else None
                except ValueError:
                    value = ast.unparse(default[0])  # computed
                found.update({flag.value: value for flag in call.args  # aliases too
                              if isinstance(flag, ast.Constant)})
    return found


def click_options() -> dict:
    """--flag -> click parameter of `relay` and `relay-admin` and their commands."""
    found = {"--help": None}
    for group in (cli.main, admin.main):
        for command in (group, *group.commands.values()):
            for param in command.params:
                for flag in (*param.opts, *param.secondary_opts):
                    if flag.startswith("--"):
                        found.setdefault(flag, param)
    return found


RELAY_OPTIONS = {"--" + options.option_flag(f.name): f
                 for f in dataclasses.fields(options.Options)}
# Flags of other tools in the README's commands.
EXTERNAL = {"--cacert": "curl", "--cert": "curl", "--key": "curl", "--data-binary": "curl",
            "--master": "spark-submit"}


def test_every_option_the_readme_names_exists():
    known = {*RELAY_OPTIONS, *click_options(), *script_options(), *EXTERNAL}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", readme_text()))
    assert named - known == set()


def default_matches(flag: str, text: str) -> bool:
    """The README's default `text` of `flag` is the option's default."""
    if flag in RELAY_OPTIONS:
        spec = RELAY_OPTIONS[flag]
        default = spec.default
        if spec.metadata.get("kind") == options.DURATION:
            return options.parse_duration(text) == default
    elif flag in script_options():
        default = script_options()[flag]
    else:
        return False
    if isinstance(default, bool):
        return {"on": True, "off": False}[text] == default
    if isinstance(default, (int, float)):
        return float(text.replace(",", "")) == default
    return (text if text != "none" else "") == default


def test_every_default_the_readme_gives_is_the_option_default():
    text = " ".join(readme_text().split())
    [row] = [line for line in readme_text().splitlines() if line.startswith("| options |")]
    claims = re.findall(r"`(--[a-z0-9-]+) ([^`]+)`", row)
    claims += re.findall(r"`(--[a-z0-9-]+)`(?: \([^)]*\)| seconds| times|, e\.g\. `[^`]*`)?"
                         r",? \(?(?:default:?|defaults to) `?([^`,;)\s]+)", text)
    assert len(claims) >= 15
    assert [(flag, value) for flag, value in claims if not default_matches(flag, value)] == []


def source_text(*patterns) -> str:
    return "\n".join(open(path).read() for pattern in patterns
                     for path in sorted(glob.glob(os.path.join(ROOT, pattern))))


def http_codes() -> set:
    """The error codes relay's HTTP servers can answer: the upper-case literals of
    relay/http and of the publish and order keys' checks (dedup.py, ordering.py),
    MISSING_ARG_<NAME> for each
    argument they require, and the codec's MPUB errors without their E_ (nsqd.py
    answers e.code[2:])."""
    http = source_text("relay/broker/http/*.py", "relay/store/dedup.py",    # publish keys
                       "relay/store/ordering.py")                          # order keys
    codec = source_text("relay/codec.py")
    assert "e.code[2:]" in http and 'f"MISSING_ARG_{name.upper()}"' in http
    return ({*re.findall(r'"([A-Z][A-Z_]+)\b', http)}
            | {"MISSING_ARG_" + name.upper() for name in re.findall(r'required\("(\w+)"\)', http)}
            | {code[2:] for code in re.findall(r'"(E_[A-Z_]+)', codec)})


def protocol_codes() -> str:
    """The TCP protocol's sources, with f"E_{command}_FAILED" written out for each command
    that v2.py names in a str literal (FIN, REQ, TOUCH, PUB, MPUB, DPUB pass theirs)."""
    protocol = source_text("relay/broker/protocol/*.py", "relay/codec.py", "relay/broker/auth.py",
                           "relay/broker/broker.py")
    assert 'f"E_{command}_FAILED"' in protocol
    commands = re.findall(r'b"([A-Z]+)": self\.', protocol)
    return protocol + " ".join(f"E_{c}_FAILED" for c in commands if f'"{c}"' in protocol)


SPARK_NAMES = {"JAVA_HOME", "JAVA_GATEWAY_EXITED"}   # Java's variable, PySpark's error


def test_every_error_code_the_readme_names_is_emitted():
    text = " ".join(readme_text().split())
    protocol = protocol_codes()
    after_status = [code for run in re.findall(r"\b[45]\d\d ((?:`[^`]+`(?:, )?)+)", text)
                    for code in re.findall(r'`(?:\{"message":")?([A-Z][A-Z_]+)', run)]
    named = set(re.findall(r"`(?:\{\"message\":\")?([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)", text))
    env = {c for c in named if c.startswith("RELAY_") or c == "REDIS_URL"}
    in_protocol = {c for c in named - env if re.search(rf"\b{c}\b", protocol)}
    assert len(after_status) >= 20
    assert set(after_status) - http_codes() == set()
    assert named - env - in_protocol - http_codes() - SPARK_NAMES == set()
    variables = {f"RELAY_{n.upper()}" for n in options.OPTION_NAMES} | {
        "RELAY_CONFIG", "RELAY_<NAME>", "REDIS_URL", "RELAY_REQUIRE_SPARK",
        *re.findall(r'"(RELAY_TEST_\w+)"', source_text("tests/conftest.py"))}
    assert env - variables == set()


def openssl_outputs() -> set:
    """The files the README's openssl commands write."""
    return {word for command in readme_commands("openssl req")
            for flag, word in zip(command.split(), command.split()[1:])
            if flag in ("-out", "-keyout")}


def test_every_file_the_readme_names_exists():
    tops = "|".join(["relay", "tests", "scripts", "conf", "workers", "docs", r"\.venv"])
    named = {path.rstrip(".") for path in re.findall(
        rf"(?<![\w./:-])((?:{tops})/[\w./*<>-]*|Procfile|pyproject\.toml|[A-Z]+\.md)",
        readme_text())}
    missing = []
    for path in sorted(named):
        if "*" in path or "<" in path:
            continue    # a pattern, not a file
        if path.startswith(".venv/"):
            full = os.path.join(sys.prefix, path[len(".venv/"):])
        else:
            full = os.path.join(ROOT, path)
        if not os.path.exists(full) and path not in openssl_outputs():
            missing.append(path)
    assert len(named) >= 30
    assert missing == []
