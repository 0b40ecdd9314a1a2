"""An A/B arm with extra device work: its own bench over the same state, its size stated before
the A/B runs, and refused where the engine would not run it."""

import pytest

from rl_trainer_bench.ab import command as ab
from rl_trainer_bench.ab.plan import plan_arms
from rl_trainer_bench.ab.same_process import extra_work_lines
from rl_trainer_bench.cli import build_parser
from rl_trainer_bench.errors import ConfigError


def _planned(tmp_path, *argv):
    args = build_parser(["ab"]).parse_args(["ab", *argv])
    return plan_arms(args, ab.complete(args), tmp_path, on_this_host=False)


def test_the_extra_work_arm_gets_its_own_bench_and_its_size_is_stated(tmp_path):
    plan = _planned(tmp_path, "--preset", "tpu-v5e-1", "--arms", "off,more:extra_device_work=1e12")
    assert len(plan.bench_plans) == 2  # another fwd_bwd: compiled apart, over one state
    (line,) = extra_work_lines(plan)
    assert line.startswith("bench") and "(arms more): extra_device_work=1e+12: 7 matmul(s)" in line
    # 7 x 2 x 4096**3 = 9.62e11 FLOPs a call, 4 calls a step, at v5e's 197 TFLOP/s: 19.5 ms
    assert "9.62e+11 FLOPs per call, 3.85e+12 per step (4 calls)" in line
    assert "ESTIMATE 19.5 ms per step at v5e's peak" in line


def test_no_line_without_extra_work(tmp_path):
    assert extra_work_lines(_planned(tmp_path, "--preset", "cpu-tiny")) == []


def test_an_arm_of_another_engine_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="arm more: extra_device_work=1e\\+09 adds matmuls"):
        _planned(
            tmp_path,
            "--preset",
            "cpu-tiny-dense",
            "--arms",
            "off,more:extra_device_work=1e9,ENGINE=maxtext",
        )
