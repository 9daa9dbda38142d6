"""tests/fuzz_attention.py, the random-case tool GPU sessions run, kept working: a few of its cases on the CPU."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

TESTS = pathlib.Path(__file__).resolve().parent


def test_fuzz_tool_runs_and_reports():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, str(TESTS / "fuzz_attention.py"), "--cases", "8", "--platform", "cpu"],
                            capture_output=True, text=True, cwd=tempfile.gettempdir(), env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[-1] == "0 failed" and sum(line.endswith(" ok") for line in lines) == 8
    # Decode cases come every fourth (indices 3 and 7), attention cases the rest.
    assert lines[3].startswith("3 (") and lines[0].startswith("0 q")
