"""scripts/setup installs only when pyproject.toml or the extras asked for change (run on
a copy of the project whose .venv/bin/python records what pip is asked)."""

import os
import shutil
import stat
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UPGRADE_PIP = "-m pip install --quiet --upgrade pip"


def test_setup_installs_only_what_changed(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(os.path.join(ROOT, "scripts", "setup"), tmp_path / "scripts")
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "$*" >> "$(dirname "$0")/../../pip.log"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)

    def setup(*extras) -> list:
        """What pip was asked by `scripts/setup EXTRAS`."""
        log = tmp_path / "pip.log"
        log.unlink(missing_ok=True)
        subprocess.run([str(tmp_path / "scripts" / "setup"), *extras], check=True)
        return log.read_text().splitlines() if log.exists() else []

    assert setup() == [UPGRADE_PIP, "-m pip install --quiet -e ."]
    assert setup() == []                                  # scripts/up, again
    assert setup("test,spark") == [UPGRADE_PIP, "-m pip install --quiet -e .[spark,test]"]
    assert setup("spark,test") == []                      # scripts/test, again
    assert setup() == []                                  # the test extras are in
    assert setup("test") == []
    with open(tmp_path / "pyproject.toml", "a") as f:
        f.write("\n# changed\n")
    assert setup() == [UPGRADE_PIP, "-m pip install --quiet -e ."]
    assert setup("test,spark") == [UPGRADE_PIP, "-m pip install --quiet -e .[spark,test]"]
