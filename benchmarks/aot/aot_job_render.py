"""The AOT job of the tpu7x 397B launch: render it, validate it, its size, its plan-only run.

Usage: PYTHONPATH=. python benchmarks/aot/aot_job_render.py [--ab-arms ARMS] [--python PYTHON ...]

The launch is the reference v5p 397B launcher's DRY_RUN rewritten as the public tpu7x recipe's
trainer (`tests/launch/render_helpers.tpu7x_trainer_launch`: tpu7x:4x4x8, mesh 32 x 4 x 2, the
recipe's MaxText keys), read from ../shared/reference/launch-renders. For each --python, the job's
client command runs as its pod's shell runs it, with PLAN_ONLY=1 and `python` being that
interpreter: what it names is that interpreter's MaxText and libtpu, as the pod names the image's.

Remakes BENCHMARKS.md's aot suite; benchmarks/reports/aot-job_cpu_2026-12-05.md.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "launch")]

from render_helpers import tpu7x_trainer_launch  # noqa: E402 (after the path set-up above)

from rl_trainer_bench.launch.apply_size import stored_annotation_bytes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ab-arms", help="render the A/B's AB_ARMS too")
    parser.add_argument("--python", action="append", default=[], help="interpreters to plan with")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aot-job-render-") as folder:
        measure(Path(folder), args)


def measure(folder: Path, args: argparse.Namespace) -> None:
    launch = folder / "tpu7x-launch.txt"
    launch.write_text(tpu7x_trainer_launch())
    aot = folder / "aot.yaml"
    command = [sys.executable, "-m", "rl_trainer_bench.cli", "render", f"--launch-render={launch}"]
    command += [f"--output={folder / 'bench.yaml'}", f"--aot-job={aot}"]
    command += [f"--ab-arms={args.ab_arms}"] if args.ab_arms else []
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    print(f"render exit {done.returncode} in {seconds:.2f} s wall")
    print("\n".join(line for line in done.stderr.splitlines() if "aot job" in line.lower()))
    if done.returncode:
        print(done.stderr)
        return
    validate = [sys.executable, "-m", "rl_trainer_bench.cli", "validate", str(aot)]
    print(subprocess.run(validate, capture_output=True, text=True, check=False).stdout.strip())
    job = yaml.safe_load(aot.read_text())
    stored = stored_annotation_bytes(job)
    print(
        f"aot.yaml: {aot.stat().st_size:,} bytes; {stored:,} bytes of annotations in kubectl apply"
    )
    pod = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    print(f"code parts: {len(container['command']) - 4}")
    for index, python in enumerate(args.python):
        bin_dir = folder / f"bin{index}"
        bin_dir.mkdir()
        (bin_dir / "python").write_text(f'#!/bin/bash\nexec {python} "$@"\n')
        (bin_dir / "python").chmod(0o755)
        environment = {
            **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "PLAN_ONLY": "1",
            "TMPDIR": str(folder),  # the script's unpacked code goes with the folder
        }
        start = time.perf_counter()
        run = subprocess.run(
            container["command"], env=environment, capture_output=True, text=True, check=False
        )
        print(f"\n$ PLAN_ONLY=1 <the job's command> with python = {python}")
        print(f"exit {run.returncode} in {time.perf_counter() - start:.1f} s wall")
        print(run.stdout.strip())
        print(run.stderr.strip())


if __name__ == "__main__":
    main()
