"""`aot --ab-arms`: every program set of a same-pod A/B compiled against one state, and the A/B
refused before launch when one arm's programs do not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.ab.aot_arms import program_sets
from rl_trainer_bench.preflight.aot.ab_check import AbCheck, ArmCheck
from rl_trainer_bench.preflight.aot.compile import ProgramMemory
from rl_trainer_bench.preflight.aot.report import AotReport

FIXTURE = Path(__file__).resolve().parents[1] / "testdata" / "launch_dryrun_fixture.yaml"

FLAGS = "retry_when_tokens_dropped=false"  # one program fewer to compile: the suite stays shorter


def test_arms_compile_one_program_set_per_distinct_compiled_knobs():
    sets = program_sets(
        "a:ragged_buffer_factor=2,b:ragged_buffer_factor=2,WORKER=fused,off,on", FLAGS
    )
    assert sets == [
        # WORKER changes no compiled program: a and b share one set
        (("a", "b"), {"ENGINE_FLAGS": f"{FLAGS} ragged_buffer_factor=2"}),
        # the staged micro-batch is counted beside the programs, so on is a set of its own
        (("off",), {"ENGINE_FLAGS": FLAGS, "STAGE_BEFORE_UPDATE": "off"}),
        (("on",), {"ENGINE_FLAGS": FLAGS, "STAGE_BEFORE_UPDATE": "on"}),
    ]


def test_settings_that_write_one_program_two_ways_share_its_set():
    # off writes STAGE_BEFORE_UPDATE=off, after leaves it at its default (off); keys in another
    # order, or one overridden by a later word, are the same keys
    assert program_sets("off,on,after", "") == [
        (("off", "after"), {"STAGE_BEFORE_UPDATE": "off"}),
        (("on",), {"STAGE_BEFORE_UPDATE": "on"}),
    ]
    arms = "a:ENGINE_FLAGS=ragged_buffer_factor=2 beta=0.04,b:ragged_buffer_factor=2,c:beta=0.1"
    sets = program_sets(arms, "beta=0.04")
    assert [settings for settings, _ in sets] == [("a", "b"), ("c",)]


def test_an_arm_the_engine_config_refuses_is_refused_before_any_compile(capsys):
    code = cli.main(
        [
            "aot",
            "--engine-flags",
            FLAGS,
            "--ab-arms",
            "small:ragged_buffer_factor=2,odd:max_prompt_length=500000,max_response_length=500000",
        ]
    )
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 2
    assert line.startswith("rl-trainer-bench aot: --ab-arms: arm(s) odd: engine config")


@pytest.mark.slow
def test_the_ab_is_refused_when_one_arms_programs_do_not_fit(tmp_path, capsys):
    """cpu-tiny's devices share the host's memory; an arm of 2^20-token micro-batches needs tens
    of GiB of temporaries per device, the other a few MiB: the A/B's peak is the big arm's (one
    state, never two), it does not fit, and the A/B is refused with exit code 1."""
    output = tmp_path / "aot.json"
    arms = "small:max_prompt_length=64,max_response_length=64"
    arms += ",big:max_prompt_length=524288,max_response_length=524288"
    code = cli.main(["aot", "--engine-flags", FLAGS, "--ab-arms", arms, "--output", str(output)])
    out = capsys.readouterr().out
    assert code == 1
    report = json.loads(output.read_text())
    small, big = report["program_sets"]
    assert small["settings"] == ["small"] and small["report"]["margin_met"] is True
    assert big["settings"] == ["big"] and big["report"]["fits"] is False
    assert report["refused_settings"] == ["big"] and report["margin_met"] is False
    assert report["peak_bytes"] == big["report"]["peak_bytes"] > small["report"]["peak_bytes"]
    # one state: each set's state is the same, counted once beside its own programs
    assert small["report"]["state_bytes"] == big["report"]["state_bytes"]
    assert out.splitlines()[-1].startswith("A/B: REFUSED before launch: arm(s) big DOES NOT FIT")


def _ab_report(arms: str, temps_gib: dict[str, float]) -> dict:
    """`aot --ab-arms`'s JSON for a v5p device (95 GiB) and one program per set whose temporaries
    are `temps_gib[setting]`, beside a 20 GiB state: the figures the renderer reads."""
    gib = 1024**3
    checks = []
    for setting, temp in temps_gib.items():
        report = AotReport(
            preset="qwen3-30b-a3b-cell",
            target="v5p:2x2x2",
            device_kind="TPU v5",
            devices=8,
            mesh={"fsdp": 8},
            memory_bytes=95 * gib,
            memory_source="v5p table",
            stage_before_update=False,
            state={"params": 20 * gib},
            programs=[ProgramMemory("fwd_bwd", temp=round(temp * gib), beside=20 * gib)],
            layers=2,
            compiled_layers=(2,),
            compile_seconds=1.0,
            unapplied_keys=[],
        )
        checks.append(ArmCheck((setting,), {"ENGINE_FLAGS": f"x={setting}"}, report))
    return AbCheck(arms, tuple(checks)).to_json()


ARMS = "base:ragged_buffer_factor=1.25,wide:ragged_buffer_factor=2"


def test_the_render_prints_the_ab_peak_from_aots_report_and_refuses_one_it_refuses(
    tmp_path, capsys
):
    report, bench = tmp_path / "aot.json", tmp_path / "bench.yaml"
    render = ["render", f"--launch-render={FIXTURE}", f"--output={bench}", f"--ab-arms={ARMS}"]
    report.write_text(json.dumps(_ab_report(ARMS, {"base": 60.0, "wide": 70.0})))
    assert cli.main([*render, f"--ab-aot-report={report}"]) == 0
    summary = capsys.readouterr().err.splitlines()
    # the wide arm's peak, 70 + 20 GiB: one state beside the largest arm's program
    assert (
        f"render: A/B device memory: peak 90.00 GiB per device against 95.00 GiB per v5p device,"
        f" from aot --ab-arms in {report}: qwen3-30b-a3b-cell on v5p:2x2x2, arm(s) wide, with the"
        " margin free: one state for every arm"
    ) in " ".join(summary)
    bench.unlink()
    report.write_text(json.dumps(_ab_report(ARMS, {"base": 60.0, "wide": 80.0})))  # 100 GiB
    assert cli.main([*render, f"--ab-aot-report={report}"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "aot refused this A/B before launch: arm(s) wide do not fit" in line
    assert not bench.exists()
    report.write_text(json.dumps(_ab_report("off,on", {"off": 1.0, "on": 1.0})))
    assert cli.main([*render, f"--ab-aot-report={report}"]) == 2
    assert "compiled for arms 'off,on', not AB_ARMS" in capsys.readouterr().err
