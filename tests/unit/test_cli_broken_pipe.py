"""A reader that leaves early (`gpuweave ... | head`) ends the command quietly, no traceback."""

from __future__ import annotations

import subprocess
import sys


def test_output_into_a_closed_pipe_ends_without_a_traceback() -> None:
    command = [sys.executable, "-m", "gpuweave", "inspect", "--simulate", "p5.48xlarge"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.read(1)  # the command has started writing
    process.stdout.close()  # then the reader goes away, as `head -1` does
    stderr = process.stderr.read().decode()
    process.stderr.close()
    returncode = process.wait(timeout=60)
    assert "Traceback" not in stderr, stderr
    assert returncode in (0, 141)
