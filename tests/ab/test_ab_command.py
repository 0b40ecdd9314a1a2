"""`rl-trainer-bench ab` end to end: arms through the driver's Bench, the report, the files, the exit code.

The stand-in engine and pool are the driver's own test doubles (tests/test_driver_loop.py):
they make the run fast and its training exactly checkable; the real cpu-tiny run is the last test.
"""

import json
import threading
import types

import pytest
from stand_in_engine import StandInEngine, TimedEngine, drifting_sleep, stand_in_pool

from rl_trainer_bench import cli
from rl_trainer_bench.ab import command as ab
from rl_trainer_bench.ab import same_process
from rl_trainer_bench.ab.progress import Progress
from rl_trainer_bench.bench import distributed
from rl_trainer_bench.bench.driver import Bench


class Benches:
    """A Bench factory with stand-ins that counts how many Benches (compiles) the A/B made."""

    def __init__(self, make_engine=StandInEngine):
        self.made = []
        self.make_engine = make_engine

    def __call__(self, plan, log):
        config = plan.config
        pool = stand_in_pool(3)
        if config.seed:  # another seed, other micro-batches, as the real pool builder does
            pool.reverse()
        bench = Bench(
            config,
            log,
            engine_config=plan.engine,
            engine_factory=lambda _: self.make_engine(),
            pool=pool,
        )
        self.made.append(config)
        return bench


def run_ab(argv, make_bench=None):
    args = cli.build_parser(["ab"]).parse_args(["ab", *argv])
    return ab.run(args, make_bench=make_bench or Benches())


def test_default_ab_runs_six_blocks_on_one_bench_scored_by_block(tmp_path, capsys):
    """Seed 1 turns the first pair of blocks BAAB ABBA (tests/ab/test_ab_blocks.py): the run
    starts with `on`, and `off`, named first, is still the baseline."""
    out = tmp_path / "out"
    benches = Benches()
    assert run_ab(["--steps", "2", "--schedule-seed", "1", "--out", str(out)], benches) == 0
    assert len(benches.made) == 1
    report = json.loads((out / "ab.json").read_text())
    labels = [a["label"] for a in report["arms"]]
    assert labels[:8] == ["on", "off", "off'", "on'", "off#3", "on#3", "on#4", "off#4"]
    assert len(labels) == 24
    assert [a["stages"] for a in report["arms"][:4]] == [2, 0, 0, 2]  # one per scored step
    assert report["block_orientations"][:2] == ["BAAB", "ABBA"]
    assert report["settings"]["schedule_seed"] == 1
    score = report["score"]
    assert score["design"] == "separate arms in blocks"
    assert score["blocks"][1] == ["off#3", "on#3", "on#4", "off#4"] and len(score["blocks"]) == 6
    assert score["noise_floor_s"] is None and report["settings"]["blocks"] == 6
    (delta,) = score["deltas"]
    assert delta["name"] == "on-off" and len(score["block_differences_s"]["on-off"]) == 6
    assert sum(score["block_differences_s"]["on-off"]) / 6 == pytest.approx(delta["delta_s"])
    printed = capsys.readouterr().out
    assert "blocks BAAB ABBA " in printed and "(drawn from schedule seed 1)" in printed
    assert "run order: on, off, off', on', off#3, on#3, on#4, off#4, " in printed
    assert "(6 blocks, each balanced: a drift linear within a block cancels in it" in printed
    assert "noise: the spread of the 6 blocks' differences, in each delta's interval" in printed
    assert "mean over blocks of each block's difference of arm medians" in printed
    assert (
        "A/B design: 6 blocks, each setting two turns of 2 scored step(s) per block: 24 scored steps"
        " per setting x 2 settings = 48, and 2 warm-up steps (2 per program set x 1, once, up"
        " front); 50 steps in all, by the CPU's default of 6 blocks"
    ) in printed
    assert "A/B resolves: an effect of " in printed and "(ASSUMED: the 2-core" in printed


class Drawn(Exception):
    """Raised in place of building a Bench: the layout seed has been drawn by then."""


def _refuse_bench(plan, log):
    raise Drawn


def test_each_run_draws_its_own_layout_seed_unless_given_one(tmp_path):
    seeds = []
    for _ in range(3):
        args = cli.build_parser(["ab"]).parse_args(["ab", "--out", str(tmp_path / "out")])
        seeds.append(ab.complete(args).schedule_seed)
        with pytest.raises(Drawn):
            ab.run(args, make_bench=_refuse_bench)
        assert args.schedule_seed is None  # drawn into the run, the flags left as parsed
    assert len(set(seeds)) == 3 and all(0 <= s < 2**32 for s in seeds)
    args = cli.build_parser(["ab"]).parse_args(
        ["ab", "--schedule-seed", "7", "--out", str(tmp_path)]
    )
    assert ab.complete(args).schedule_seed == 7


def test_mirrored_ab_runs_four_arms_on_one_bench_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "out"
    benches = Benches()
    argv = ["--order", "mirrored", "--steps", "3", "--out", str(out)]
    code = run_ab([*argv, "--predict", "on-off=0[-90,90]"], benches)
    assert code == 0
    assert len(benches.made) == 1  # the stage switch shares compiled programs
    report = json.loads((out / "ab.json").read_text())
    assert report["mode"] == "same-process"
    assert [a["label"] for a in report["arms"]] == ["off", "on", "on'", "off'"]
    # Every turn is scored from its first step: the one bench warmed once, up front, 2 steps
    # (a boundary staged as `on` stages, and one plain step)
    assert [len(a["records"]) for a in report["arms"]] == [3, 3, 3, 3]
    assert {r["warmup"] for a in report["arms"] for r in a["records"]} == {False}
    assert [a["stages"] for a in report["arms"]] == [0, 3, 3, 0]  # one per scored step
    assert report["warmup_steps_total"] == 2
    assert {c["status"] for c in report["checks"]} == {"PASS"}
    assert report["verdict"] in ("FASTER", "SLOWER", "NO-EFFECT", "NOISY")
    assert report["score"]["noise_floor_s"] is not None
    assert report["predictions"][0]["text"] == "on-off=0[-90,90]"
    assert report["versions"]["rl_trainer_bench"] and report["machine"]["device_count"] == 8
    assert report["command"]
    assert (out / "ab.txt").read_text().startswith("A/B on cpu-tiny")
    assert sorted(p.name for p in out.glob("arm*.jsonl")) == [
        "arm1-off.jsonl",
        "arm2-on.jsonl",
        "arm3-on.jsonl",
        "arm4-off.jsonl",
    ]
    printed = capsys.readouterr().out
    assert "run order: off, on, on', off' (every setting centred" in printed
    assert "verdict: " in printed and "rule: " in printed
    assert "design: separate arms, run order off, on, on', off'" in printed
    assert "arm off' (4/4): step 3 of 3 (scored)" in printed
    assert "3 scored step(s) per arm, 2 warm-up step(s) in all, up front (bench1 2)" in printed
    pytest.importorskip("matplotlib")
    assert (out / "ab.png").read_bytes()[:4] == b"\x89PNG"


# Each fwd_bwd sleeps 1 ms less than the one before, from 60 ms: with 2 calls per step a step is
# 4 ms shorter than the one before. An arm runs 6 steps; the bounds below take an arm's drift as 7
# steps' (28 ms), as they took 11 at 10 steps an arm: many times the sub-millisecond jitter of
# sleeps on a loaded 2-core host, and each arm's median of 6 steps sets one late sleep aside. The
# run's 52 calls (2 warm-up steps, 4 arms of 6) end at 8 ms, so every sleep keeps its slope; the
# rule under test (a delta's bias from the run order) scales with the drift, not the run's length,
# so 6 steps an arm check it as more would, with less sleeping. Staging does nothing here.
DRIFT_PER_ARM_S = 7 * 2 * 2 * 1e-3


def _drifting_ab(tmp_path, order):
    out = tmp_path / order
    argv = ["--steps", "6", "--knob", "MICRO_STEPS=2", "--order", order, "--out", str(out)]
    benches = Benches(lambda: TimedEngine(drifting_sleep(0.060, -1e-3)))
    assert run_ab(argv, benches) == 0
    return json.loads((out / "ab.json").read_text())


def test_a_drifting_engine_biases_the_block_order_but_not_the_mirrored_one(tmp_path):
    """Tolerance: the block delta must carry at least half an arm's drift; the mirrored delta at
    most a quarter of it (sleeps on a loaded machine overshoot by a fraction of a millisecond)."""
    block = _drifting_ab(tmp_path, "block")
    mirrored = _drifting_ab(tmp_path, "mirrored")
    assert [a["label"] for a in block["arms"]] == ["off", "on", "off'", "on'"]
    assert [a["label"] for a in mirrored["arms"]] == ["off", "on", "on'", "off'"]
    (block_delta,) = block["score"]["deltas"]
    (mirrored_delta,) = mirrored["score"]["deltas"]
    assert block_delta["delta_s"] < -0.5 * DRIFT_PER_ARM_S
    assert abs(mirrored_delta["delta_s"]) < 0.25 * DRIFT_PER_ARM_S
    for report in (block, mirrored):
        assert report["score"]["drift"]["across_run"] < 0
        assert report["score"]["drift"]["exceeds_min_effect"]
    assert block["score"]["drift"]["bias_s"]["on"] < -0.5 * DRIFT_PER_ARM_S


def test_arm_that_trains_other_data_fails_whatever_the_times(tmp_path):
    benches = Benches()
    code = run_ab(
        ["--arms", "off,reseeded:SEED=7", "--steps", "2", "--out", str(tmp_path)],
        benches,
    )
    assert code == 1
    assert len(benches.made) == 2  # a knob outside the stage switch gets its own bench
    report = json.loads((tmp_path / "ab.json").read_text())
    assert report["verdict"] == "FAIL"
    failed = [c["name"] for c in report["checks"] if c["status"] == "FAIL"]
    assert "same micro-batch digests in the same order" in failed


def test_bad_arm_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "never"
    assert cli.main(["ab", "--arms", "off,fast", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown arm 'fast'" in err[0]
    assert not out.exists()


def test_bad_knob_value_is_refused_before_any_output(tmp_path, capsys):
    out = tmp_path / "never"
    assert cli.main(["ab", "--arms", "off,x:STAGE_ISSUE=sideways", "--out", str(out)]) == 2
    assert "STAGE_ISSUE='sideways'" in capsys.readouterr().err
    assert not out.exists()


def test_prediction_about_a_missing_setting_is_refused_before_any_output(tmp_path):
    out = tmp_path / "never"
    assert cli.main(["ab", "--predict", "after-off=-5[-6,-4]", "--out", str(out)]) == 2
    assert not out.exists()


def _driver_log(path, stage, seed="0", warmup="1"):
    """One pod's log: a Bench run alone, its lines as the driver prints them."""
    from rl_trainer_bench.bench.plan import resolve
    from rl_trainer_bench.config.knobs import BenchConfig

    config = BenchConfig.from_env(
        {"STEPS": "4", "STAGE_BEFORE_UPDATE": stage, "SEED": seed, "WARMUP_STEPS": warmup}
    )
    lines = []
    bench = Benches()(resolve(config), lines.append)
    bench.setup()
    bench.run(steps=config.steps, stage=config.stage, warmup_steps=config.warmup_steps)
    bench.close()
    path.write_text("\n".join(["pod start", *lines, "pod end"]) + "\n")


def test_from_logs_scores_two_pods_cross_pod(tmp_path, capsys):
    _driver_log(tmp_path / "off.log", "off")
    _driver_log(tmp_path / "on.log", "on")
    out = tmp_path / "report"
    code = run_ab(
        [
            "--from-logs",
            str(tmp_path / "off.log"),
            str(tmp_path / "on.log"),
            "--out",
            str(out),
            "--predict",
            "on-off=0[-90,90]",
        ]
    )
    assert code == 0
    report = json.loads((out / "ab.json").read_text())
    assert report["mode"] == "cross-pod"
    assert report["score"]["noise_floor_s"] is None and report["score"]["cross_pod"] is True
    assert [a["label"] for a in report["arms"]] == ["off", "on"]
    assert [len(a["records"]) for a in report["arms"]] == [5, 5]
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["same number of updates"] == "SKIP"
    assert statuses["same micro-batch digests in the same order"] == "PASS"
    assert statuses["one stage per boundary in staged arms"] == "PASS"
    assert "cross-pod" in capsys.readouterr().out


def test_a_one_step_turn_of_the_staged_setting_times_its_stage(tmp_path):
    """At one scored step per turn (an accelerator's default) no boundary lies between two steps
    of a turn: the staged arm's one step must stage all the same, and the check says so."""
    out = tmp_path / "out"
    assert run_ab(["--steps", "1", "--schedule-seed", "1", "--out", str(out)]) == 0
    report = json.loads((out / "ab.json").read_text())
    assert len(report["arms"]) == 24  # six blocks of four turns, ABBA or BAAB
    for arm in report["arms"]:
        staged = arm["label"].startswith("on")
        (step,) = arm["records"]
        assert arm["stages"] == (1 if staged else 0)
        assert (step["staged"] is not None) == staged
        assert (step["stage_s"] > 0) == staged
    check = {c["name"]: c for c in report["checks"]}["one stage per boundary in staged arms"]
    assert check["status"] == "PASS" and "on: 1" in check["detail"]


def test_from_logs_of_pods_that_trained_other_data_fails(tmp_path):
    _driver_log(tmp_path / "a.log", "off")
    _driver_log(tmp_path / "b.log", "off", seed="3")
    assert (
        run_ab(
            [
                "--from-logs",
                str(tmp_path / "a.log"),
                str(tmp_path / "b.log"),
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 1
    )


def test_from_logs_of_pods_that_warmed_up_differently_fails_naming_the_warm_up(tmp_path):
    """Pods of two engines warm up as each needs unless told: the same data, the same scored
    steps, but the step numbers, which pick the micro-batches, are shifted."""
    _driver_log(tmp_path / "one.log", "off")
    _driver_log(tmp_path / "two.log", "off", warmup="2")
    out = tmp_path / "r"
    assert (
        run_ab(
            ["--from-logs", str(tmp_path / "one.log"), str(tmp_path / "two.log"), "--out", str(out)]
        )
        == 1
    )
    checks = {c["name"]: c for c in json.loads((out / "ab.json").read_text())["checks"]}
    for name in ("same micro-batch digests in the same order", "same loss denominators per step"):
        assert checks[name]["status"] == "FAIL"
        assert checks[name]["detail"].startswith("one warmed up 1 step(s), two 2: ")


def test_from_logs_without_ruler_lines_is_refused(tmp_path):
    (tmp_path / "a.log").write_text("nothing here\n")
    (tmp_path / "b.log").write_text("nor here\n")
    with pytest.raises(ab.UserError, match="no \\[TrainerBench\\] step lines"):
        run_ab(
            [
                "--from-logs",
                str(tmp_path / "a.log"),
                str(tmp_path / "b.log"),
                "--out",
                str(tmp_path / "r"),
            ]
        )


@pytest.mark.slow
def test_cpu_tiny_ab_with_the_real_engine(tmp_path):
    pytest.importorskip(
        "rl_trainer_bench.engine.builtin.jax_engine", reason="the JAX engine is not built"
    )
    pytest.importorskip("rl_trainer_bench.payload.build", reason="the payload builder is not built")
    out = tmp_path / "out"
    # No dropless retry: its program is compiled up front and run by no step here (a third of
    # the compile); the engine tests cover it.
    no_retry = ["--knob", "ENGINE_FLAGS=retry_when_tokens_dropped=false"]
    code = cli.main(["ab", "--steps", "1", "--blocks", "3", "--out", str(out), *no_retry])
    report = json.loads((out / "ab.json").read_text())
    assert code == 0, report["checks"]
    assert {c["status"] for c in report["checks"]} == {"PASS"}
    assert report["machine"]["device_count"] == 8
    assert len(report["compile_s"]) == 1


def test_arms_warm_up_as_long_as_the_slowest_engine_among_them_needs(tmp_path):
    from rl_trainer_bench.ab.plan import plan_arms

    arms = "builtin:ENGINE=builtin,maxtext:ENGINE=maxtext"
    args = cli.build_parser(["ab"]).parse_args(["ab", "--arms", arms, "--out", str(tmp_path)])
    plan = plan_arms(args, ab.complete(args), tmp_path)
    assert plan.warmup_steps == 2 and args.warmup_steps is None  # the plan's; args untouched
    assert [c.warmup_steps for c in plan.bench_configs.values()] == [2, 2]
    given = cli.build_parser(["ab"]).parse_args(["ab", "--arms", arms, "--warmup-steps", "1"])
    assert plan_arms(given, ab.complete(given), tmp_path).warmup_steps == 1
    plain = cli.build_parser(["ab"]).parse_args(["ab", "--out", str(tmp_path)])
    assert plan_arms(plain, ab.complete(plain), tmp_path).warmup_steps == 1


def test_the_runtime_starts_beside_the_designs_lines(tmp_path, monkeypatch):
    """Opening a TPU chip takes 8-9 s (benchmarks/reports/chip-round-2_tpu-v5e_2026-12-06.md): the
    A/B starts JAX's runtime on a thread of its own before it works out and prints its design, so
    the two overlap. Here the design's line waits for the runtime's start to begin, which a start
    made after it would never do."""
    starting = threading.Event()
    say = Progress.say

    def say_once_starting(self, line):
        if line.startswith("A/B design"):
            assert starting.wait(timeout=30), "the runtime had not started by the design's line"
        say(self, line)

    start = distributed.start_for_preset

    def start_and_mark(host_devices):
        starting.set()
        return start(host_devices)

    monkeypatch.setattr(Progress, "say", say_once_starting)
    monkeypatch.setattr(distributed, "start_for_preset", start_and_mark)
    assert run_ab(["--steps", "1", "--blocks", "3", "--out", str(tmp_path / "out")]) == 0


@pytest.mark.parametrize(
    ("env", "beside"),
    [
        ({}, True),
        ({"JAX_PLATFORMS": "proxy,cpu", "JAX_BACKEND_TARGET": "grpc://proxy:29000"}, False),
        ({"JAX_COORDINATOR_ADDRESS": "host:1234", "JAX_NUM_PROCESSES": "2"}, False),
        ({"TPU_WORKER_HOSTNAMES": "a,b"}, False),
    ],
    ids=["one process", "pathways", "jax.distributed", "tpu pod"],
)
def test_only_one_local_process_starts_its_runtime_on_a_thread(monkeypatch, env, beside):
    """Pathways and several processes start on the calling thread, as before: their libraries'
    start is not known to be safe off the main thread."""
    for name in ("JAX_PLATFORMS", "JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    threads = []

    def start_and_note(host_devices):
        threads.append(threading.current_thread() is threading.main_thread())
        return "runtime: noted"

    monkeypatch.setattr(distributed, "start_for_preset", start_and_note)
    plan = types.SimpleNamespace(preset=types.SimpleNamespace(host_devices=0))
    runtime = same_process._runtime_beside(plan)
    assert (runtime is not None) == beside
    if runtime is not None:
        assert runtime.result() == "runtime: noted" and threads == [False]
