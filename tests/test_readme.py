"""What the README tells a newcomer to run, run as written (ports moved to free ones)."""

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from relay import embedded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_commands(first: str) -> list:
    """The commands of the README's indented block that starts with `first`, each with
    its continuation lines joined."""
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    " + first))
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


def test_a_second_stack_on_other_ports(tmp_path):
    import redis as redis_py
    [command] = readme_commands("RELAY_TCP_ADDRESS=")
    tcp, http, redis_port = (embedded.free_port() for _ in range(3))
    command = command.replace(":5150", f":{tcp}").replace(":5151", f":{http}") \
        .replace(":6380", f":{redis_port}") \
        .replace("scripts/up", f"exec {sys.executable} -m relay up")
    shutil.copy(os.path.join(ROOT, "Procfile"), tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    log = open(tmp_path / "up.log", "w")
    proc = subprocess.Popen(command, shell=True, cwd=tmp_path, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for port in (redis_port, tcp, http):
            embedded.wait_for_port("127.0.0.1", port, proc, timeout=30)
        published = subprocess.run(["curl", "-s", "-d", "hi",
                                    f"http://127.0.0.1:{http}/pub?topic=second"],
                                   capture_output=True, text=True)
        assert published.stdout == "OK"
        assert redis_py.Redis(port=redis_port).smembers("relay:topics") == {b"second"}
        assert os.listdir(tmp_path / "var" / "redis") == [str(redis_port)]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        log.close()


def test_links_lead_to_the_project_own_files_and_sections():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert "../" not in text  # nothing outside the project
    anchors = {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
               for title in re.findall(r"^#+ (.+)$", text, re.M)}
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        path, _, anchor = target.partition("#")
        if path:
            full = os.path.normpath(os.path.join(ROOT, path))
            assert full.startswith(ROOT + os.sep) and os.path.exists(full), target
        else:
            assert anchor in anchors, target
