"""A stand-in for the exerciser's child process, for the parent's failure paths (a hardware fake).

``python fake_exerciser_child.py MODE`` reads the plan as the real child does and prints the same
line protocol; then, by MODE: ``hang`` finishes each GPU's memory check, begins its compute
check and blocks for ever (a wedged driver call); ``crash`` prints a line that is not the
protocol, begins a check and exits 11 (as a segfault would); ``fatal`` says the driver is unusable.
"""

from __future__ import annotations

import json
import sys
import time


def line(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main() -> int:
    mode = sys.argv[1]
    plan = json.loads(sys.stdin.read())
    gpus = [g["uuid"] for g in plan["gpus"]]
    if mode == "fatal":
        line(event="fatal", detail="CudaError: cuInit failed: CUDA_ERROR_NO_DEVICE (100)")
        return 3
    for uuid in gpus:
        line(event="begin", check="memory", gpu=uuid)
        line(event="result", result={"check": "memory", "gpu": uuid, "status": "done", "bytes": 4096})
    if mode == "crash":
        sys.stdout.write("Segmentation fault in libcuda (not a protocol line)\n")
        line(event="begin", check="compute", gpu=gpus[0])
        sys.stdout.flush()
        print("corrupted state in the driver", file=sys.stderr)
        return 11
    for uuid in gpus:
        line(event="begin", check="compute", gpu=uuid)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
