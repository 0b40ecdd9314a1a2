"""The device bytes a same-process A/B holds, sampled while it runs: one state, or one per bench.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/ab/ab_one_state.py LABEL ab ARGS...

runs `rl-trainer-bench ab ARGS...` in this process while a thread sums `jax.live_arrays()` (the
bytes of every live array, whatever its devices) every 0.2 s, then prints one JSON line: the label,
the peak, the bytes held at rest once the A/B returned (its benches, and so their engines, kept
alive: the A/B is given a bench factory that keeps them), the report's warm-up steps in all, its
bench count, its exact checks and its verdict. The A/B's own code is not touched, so the same
script measures any checkout (PYTHONPATH) of the package. On a CPU host the "devices" are host
memory, and the figure is the arrays' bytes, not the process's RSS. The sampler starts JAX before
the A/B does, so the preset's host devices are given in XLA_FLAGS (8 for cpu-tiny).

The bytes at rest are counted after the run, not sampled during it: a sample taken inside a step
also counts the step's gradient sum (a parameter-sized tree), whichever engines hold the state.

On an accelerator whose allocator keeps statistics (a GPU), the line also gives the first
device's `memory_stats()` at the end: `bytes_in_use` and `peak_bytes_in_use`, which count the
programs' temporaries as well as the live arrays.

Run one A/B whose two settings are one bench (the same knobs) for one arm's bytes, then the same
A/B with two settings of different programs: with one state their bytes agree; with a state per
bench the second holds a whole state more.

Remakes BENCHMARKS.md's ab suite (one training state's bytes);
benchmarks/reports/ab-one-state_cpu_2026-12-04.md.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import jax

from rl_trainer_bench import cli
from rl_trainer_bench.ab import command as ab
from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.engine.sharing_check import live_bytes as rest_bytes

SAMPLE_S = 0.2


class KeptBenches:
    """The A/B's bench factory, keeping every Bench it makes (and its engine) after the A/B."""

    def __init__(self) -> None:
        self.benches: list[Bench] = []

    def __call__(self, config: object, log: object) -> Bench:
        self.benches.append(Bench(config, log))
        return self.benches[-1]


class LiveBytes:
    """The largest sum of live arrays' bytes, sampled on a thread."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> LiveBytes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample_once()  # what the block left, however short it ran

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample_once()

    def _sample_once(self) -> None:
        total = 0
        for array in jax.live_arrays():
            try:  # an array donated between the listing and this read is gone: skip it
                total += 0 if array.is_deleted() else array.nbytes
            except RuntimeError:
                continue
        self.peak = max(self.peak, total)


def main(argv: list[str]) -> int:
    label, command = argv[0], argv[1:]
    out = Path(command[command.index("--out") + 1])
    started = time.time()
    kept = KeptBenches()
    with LiveBytes() as live:
        code = ab.run(cli.build_parser(command[:1]).parse_args(command), make_bench=kept)
    rest = rest_bytes()
    report = json.loads((out / "ab.json").read_text())
    allocator = jax.local_devices()[0].memory_stats() or {}
    print(
        json.dumps(
            {
                "label": label,
                "exit": code,
                "peak_live_bytes": live.peak,
                "rest_live_bytes": rest,
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
