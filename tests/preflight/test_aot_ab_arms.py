"""`aot --ab-arms`: every program set of a same-pod A/B compiled against one state, and the A/B
refused before launch when one arm's programs do not fit."""

from __future__ import annotations

import json

import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.ab.aot_arms import program_sets

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
