"""A same-pod A/B's AOT job, rendered from the tpu7x 397B launch: how often the render plans the
A/B's arms, what one planning costs, and the commands the job's pod plans from what it wrote.

Usage: PYTHONPATH=TREE python benchmarks/aot/aot_job_ab_plan.py [--ab-arms ARMS] [--repeats N]

TREE is the checkout whose package is measured (`.`, or an older commit's `git archive`: the
script uses only what both have). The launch is `tests/launch/render_helpers.
tpu7x_trainer_launch` (the reference v5p 397B launcher's DRY_RUN as the public tpu7x recipe's
trainer), read from ../shared/reference. `render --aot-job --ab-arms` runs in this process with
every planning of the arms (`ab/plan.plan_arms`, as `ab/same_pod.py` calls it) counted and timed;
the job's commands are what its pod's own planner (`preflight/aot_job_pod.planned_compiles`) makes
of the job's exported environment: the lines its PLAN_ONLY=1 run prints after naming the image's
MaxText and libtpu, which this host's interpreters do not both have.

Remakes BENCHMARKS.md's aot suite; benchmarks/reports/aot-job_cpu_2026-12-05.md.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "launch")]

from render_helpers import tpu7x_trainer_launch  # noqa: E402 (after the path set-up above)

from rl_trainer_bench import cli  # noqa: E402
from rl_trainer_bench.ab import same_pod  # noqa: E402
from rl_trainer_bench.launch.apply_size import stored_annotation_bytes  # noqa: E402
from rl_trainer_bench.launch.client_command import read_client_command  # noqa: E402
from rl_trainer_bench.launch.dry_run import literal_env  # noqa: E402
from rl_trainer_bench.preflight.aot_job_pod import planned_compiles  # noqa: E402

ARMS = "full:maxtext.remat_policy=full,minimal:maxtext.remat_policy=minimal"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ab-arms", default=ARMS, help=f"the A/B's AB_ARMS (default {ARMS})")
    parser.add_argument("--repeats", type=int, default=5, help="timed plannings of the A/B")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aot-job-ab-plan-") as folder:
        measure(Path(folder), args)


def measure(folder: Path, args: argparse.Namespace) -> None:
    launch = folder / "tpu7x-launch.txt"
    launch.write_text(tpu7x_trainer_launch())
    plan_arms, seconds = same_pod.plan_arms, []

    def timed(*args, **kwargs):
        start = time.perf_counter()
        planned = plan_arms(*args, **kwargs)
        seconds.append(time.perf_counter() - start)
        return planned

    same_pod.plan_arms = timed
    aot = folder / "aot.yaml"
    render = ["render", f"--launch-render={launch}", f"--output={folder / 'bench.yaml'}"]
    for _ in range(args.repeats):
        start = time.perf_counter()
        code = cli.main([*render, f"--aot-job={aot}", f"--ab-arms={args.ab_arms}"])
        wall = time.perf_counter() - start
        print(f"render exit {code} in {wall:.2f} s; A/B plannings so far: {len(seconds)}")
    print(
        f"A/B plannings: {len(seconds)} in {args.repeats} renders with AOT_JOB; one planning:"
        f" median {statistics.median(seconds) * 1e3:.0f} ms"
        f" (min {min(seconds) * 1e3:.0f}, max {max(seconds) * 1e3:.0f})"
    )
    job = yaml.safe_load(aot.read_text())
    pod = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {**literal_env(container), **read_client_command(container["command"][2]).env}
    for name in sorted(name for name in env if name.startswith("AOT_")):  # the job's A/B table
        print(f"{name}: {env[name]}")
    compiles, needs_maxtext = planned_compiles(env, Path(env["RESULTS_DIR"]))
    print(f"the job's commands ({len(compiles)}; MaxText's programs: {needs_maxtext}):")
    for item in compiles:
        print(f"  run {item.run}: {item.command} ({len(item.describe())} characters)")
    print(f"aot.yaml: {stored_annotation_bytes(job):,} bytes of annotations in kubectl apply")


if __name__ == "__main__":
    main()
