"""The device bytes a same-process A/B holds, sampled while it runs: one state, or one per bench.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/ab_one_state.py LABEL ab ARGS...

runs `rl-trainer-bench ab ARGS...` in this process while a thread sums `jax.live_arrays()` (the
bytes of every live array, whatever its devices) every 0.2 s, then prints one JSON line: the label,
the peak and the bytes held at the last sample before the A/B returned, the report's warm-up steps
in all, its bench count, its exact checks and its verdict. The A/B's own code is not touched, so
the same script measures any checkout (PYTHONPATH) of the package. On a CPU host the "devices"
are host memory, and the figure is the arrays' bytes, not the process's RSS. The sampler starts
JAX before the A/B does, so the preset's host devices are given in XLA_FLAGS (8 for cpu-tiny).
On an accelerator whose allocator keeps statistics (a GPU), the line also gives the first
device's `memory_stats()` at the end: `bytes_in_use` and `peak_bytes_in_use`, which count the
programs' temporaries as well as the live arrays.

Run one A/B whose two settings are one bench (the same knobs) for one arm's bytes, then the same
A/B with two settings of different programs: with one state their peaks agree; with a state per
bench the second holds a whole state more.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import jax

from rl_trainer_bench import cli

SAMPLE_S = 0.2


class LiveBytes:
    """The largest and the latest sum of live arrays' bytes, sampled on a thread."""

    def __init__(self) -> None:
        self.peak = 0
        self.last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> LiveBytes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            total = 0
            for array in jax.live_arrays():
                try:  # an array donated between the listing and this read is gone: skip it
                    total += 0 if array.is_deleted() else array.nbytes
                except RuntimeError:
                    continue
            self.last = total
            self.peak = max(self.peak, total)


def main(argv: list[str]) -> int:
    label, command = argv[0], argv[1:]
    out = Path(command[command.index("--out") + 1])
    started = time.time()
    with LiveBytes() as live:
        code = cli.main(command)
    report = json.loads((out / "ab.json").read_text())
    allocator = jax.local_devices()[0].memory_stats() or {}
    print(
        json.dumps(
            {
                "label": label,
                "exit": code,
                "peak_live_bytes": live.peak,
                "last_live_bytes": live.last,
                "device_bytes_in_use": allocator.get("bytes_in_use"),
                "device_peak_bytes_in_use": allocator.get("peak_bytes_in_use"),
                "warmup_steps_total": report.get("warmup_steps_total"),
                "benches": len(report.get("compile_s", {})),  # an interrupted A/B has none
                "checks": {c["name"]: c["status"] for c in report.get("checks", [])},
                "verdict": report.get("verdict"),
                "wall_s": round(time.time() - started, 1),
            }
        )
    )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
