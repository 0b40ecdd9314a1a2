"""Engine-config diff across flag lists, YAML, trainer argv and the real launch renders."""

from __future__ import annotations

import json
from pathlib import Path

from reference_data import LAUNCH_RENDERS, launch_render

from rl_trainer_bench import cli
from rl_trainer_bench.preflight.config_diff import diff, format_diff, read_side, same_value

REPO = Path(__file__).resolve().parents[2]
RENDERS = LAUNCH_RENDERS
TRAINER_397B = RENDERS / "tunix-mlperf-397b-256-v5p-trainer.stdout.txt"
GSM8K = RENDERS / "tunix-gsm8k-start.yaml"


def needs_renders():
    launch_render(TRAINER_397B.name)
    launch_render(GSM8K.name)


def changes(result):
    return {c.key: c for c in result.changes}


def test_flags_against_argv_lists_added_removed_changed_with_defaults():
    before = read_side("beta=0.04 mesh_fsdp=2 run_name=a")
    after = read_side("--beta 0.04 --mesh_fsdp=4 --optimizer_b1 9e-1")
    assert (before.kind, after.kind) == ("flags", "argv")
    result = diff(before, after)
    found = changes(result)
    assert set(found) == {"run_name", "mesh_fsdp", "optimizer_b1"}
    assert found["run_name"].change == "removed" and not found["run_name"].applied
    assert found["mesh_fsdp"].change == "changed"
    assert (found["mesh_fsdp"].before, found["mesh_fsdp"].after) == ("2", "4")
    assert found["mesh_fsdp"].default == "1" and found["mesh_fsdp"].applied
    assert found["optimizer_b1"].change == "added" and found["optimizer_b1"].default == "0.9"
    assert result.unchanged == 1  # beta, spelled the same in both


def test_numbers_and_booleans_spelled_differently_are_equal(tmp_path):
    assert same_value("1e-6", "1.0e-06") and same_value("True", "true")
    assert not same_value("1e-6", "1e-5") and not same_value("true", "1.0")
    config = tmp_path / "engine.yaml"
    config.write_text("optimizer_learning_rate: 1.0e-6\nretry_when_tokens_dropped: true\nbeta: 0\n")
    side = read_side(str(config))
    assert side.kind == "yaml"
    result = diff(
        side, read_side("optimizer_learning_rate=1e-6 retry_when_tokens_dropped=True beta=0.0")
    )
    assert result.changes == [] and result.unchanged == 3


def test_ignore_drops_noise_keys_by_name_or_pattern():
    before = read_side("--model_dir=/a --checkpoint_root=/x --checkpoint_every=1 --beta=0")
    after = read_side("--model_dir=/b --checkpoint_root=/y --checkpoint_every=2 --beta=0.1")
    result = diff(before, after, ignore=["model_dir", "checkpoint_*"])
    assert [c.key for c in result.changes] == ["beta"]
    assert result.ignored == ["checkpoint_every", "checkpoint_root", "model_dir"]
    assert "3 ignored" in format_diff(result)


def test_real_trainer_launch_against_a_flag_list():
    """The 397B trainer's flags read out of its client command (DRY_RUN noise before `---`)."""
    needs_renders()
    side = read_side(str(TRAINER_397B))
    assert side.kind == "jobset"
    assert side.flags["mesh_fsdp"] == "16" and side.flags["mesh_context"] == "8"
    assert side.flags["optimizer_chain_kwargs"] == "{'max_norm': 0.125}"
    assert side.flags["trainable_parameters_mask"] == "^(?!.*routed_experts/gate/kernel).*"
    result = diff(side, read_side("mesh_fsdp=32 mesh_context=4 mesh_expert=2"))
    found = changes(result)
    assert (found["mesh_fsdp"].before, found["mesh_fsdp"].after) == ("16", "32")
    assert found["lora_rank"].change == "removed" and not found["lora_rank"].applied
    assert "mesh_expert" not in found  # 2 on both sides


def test_two_real_launches_mark_keys_the_engine_does_not_apply(capsys):
    needs_renders()
    code = cli.main(
        ["config-diff", str(GSM8K), str(TRAINER_397B), "--ignore", "model_dir,maxtext_*"]
    )
    assert code == 1  # like diff: something differs
    text = capsys.readouterr().out
    assert "~ mesh_fsdp: 8 -> 16  (default 1)" in text
    assert "~ max_response_length: 128 -> 61440  (default 128)" in text
    assert "~ lora_rank: 16 -> 64  [not applied by the built-in engine]" in text
    assert "maxtext_ckpt_path" not in text.split("ignored")[0]


def test_rendered_bench_jobset_reads_trainer_argv_and_engine_flags(tmp_path):
    """A bench JobSet carries the trainer's flags in TRAINER_ARGV and the knobs in ENGINE_FLAGS."""
    needs_renders()
    from rl_trainer_bench.launch.knobs import RenderKnobs
    from rl_trainer_bench.launch.render import render

    knobs = RenderKnobs.from_strings({"engine_flags": "beta=0.04"})
    bench = tmp_path / "bench.yaml"
    bench.write_text(render(TRAINER_397B.read_text(), str(TRAINER_397B), knobs))
    result = diff(read_side(str(TRAINER_397B)), read_side(str(bench)))
    assert [(c.key, c.change, c.after) for c in result.changes] == [("beta", "added", "0.04")]


def test_cli_json_and_no_difference_exit_code(capsys):
    # A one-word argv starting with -- needs argparse's `--` separator; quoted multi-word ones don't.
    assert cli.main(["config-diff", "--json", "beta=0", "--", "--beta=0.0"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["changes"] == [] and document["unchanged"] == 1


def test_bad_input_is_one_line_and_exit_2(capsys):
    assert cli.main(["config-diff", "beta=0", "not-a-flag"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "'not-a-flag' is not key=value" in error


def test_a_missing_file_is_named_as_a_file_not_read_as_flags(capsys, tmp_path):
    missing = tmp_path / "trainer.yaml"
    assert cli.main(["config-diff", str(missing), "beta=0"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.endswith("cannot read it (No such file or directory); pass an existing file")
    assert str(missing) in error and "ENGINE_FLAGS" not in error


def test_trainer_maxtext_keys_are_diffed_with_their_fate():
    before = read_side(
        "MAXTEXT_EXTRA_FLAGS='ragged_buffer_factor=2.0 megablox=true' --mesh_fsdp=32"
    )
    after = read_side(
        "MAXTEXT_EXTRA_FLAGS='ragged_buffer_factor=2.75 mu_dtype=bfloat16' --mesh_fsdp=32"
    )
    result = diff(before, after)
    found = changes(result)
    assert set(found) == {"maxtext:megablox", "maxtext:mu_dtype", "maxtext:ragged_buffer_factor"}
    assert found["maxtext:megablox"].change == "removed" and not found["maxtext:megablox"].applied
    assert found["maxtext:ragged_buffer_factor"].applied
    assert format_diff(result).splitlines()[2:5] == [
        "- maxtext:megablox: true  [trainer MaxText key: no equivalent]",
        "+ maxtext:mu_dtype: bfloat16  [trainer MaxText key: applied (mu_dtype=bfloat16)]",
        "~ maxtext:ragged_buffer_factor: 2.0 -> 2.75"
        "  [trainer MaxText key: applied with another meaning (ragged_buffer_factor=2.75;"
        " built-in engine: ceil(factor x tokens x top_k / experts) slots per expert per group of"
        " tokens; MaxText: one buffer of factor x a device's tokens x top_k rows per"
        " expert-parallel shard, shared by its experts)]",
    ]


def test_a_rendered_bench_keeps_the_trainers_maxtext_keys(tmp_path):
    import sys

    sys.path.insert(0, str(REPO / "tests" / "launch"))
    from render_helpers import tpu7x_trainer_launch

    from rl_trainer_bench.launch.knobs import RenderKnobs
    from rl_trainer_bench.launch.render import render

    launch = tmp_path / "launch.txt"
    launch.write_text(tpu7x_trainer_launch())
    bench = tmp_path / "bench.yaml"
    bench.write_text(render(launch.read_text(), "launch", RenderKnobs()))
    trainer_side, bench_side = read_side(str(launch)), read_side(str(bench))
    assert trainer_side.flags["maxtext:num_moe_token_chunks"] == "4"
    assert bench_side.fates["maxtext:mu_dtype"] == "applied (mu_dtype=bfloat16)"
    assert not [c.key for c in diff(trainer_side, bench_side).changes if "maxtext:" in c.key]
