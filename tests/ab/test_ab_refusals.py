"""`rl-trainer-bench ab` refuses what it cannot run before any arm runs, without touching earlier
results, and an interrupted run ends in one line with the arms that finished written down."""

from __future__ import annotations

import json

import pytest
from stand_in_engine import StandInEngine, stand_in_pool
from test_ab_command import Benches, run_ab

from rl_trainer_bench import cli
from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.errors import ConfigError

EARLIER = {"ab.json": '{"verdict": "FASTER"}\n', "ab.log": "an earlier run\n"}


def earlier_report(folder):
    folder.mkdir()
    for name, text in EARLIER.items():
        (folder / name).write_text(text)
    return folder


def assert_untouched(folder):
    assert sorted(p.name for p in folder.iterdir()) == sorted(EARLIER)
    assert {name: (folder / name).read_text() for name in EARLIER} == EARLIER


class EnginesWithoutStaging(Benches):
    """Benches whose engines cannot stage; keeps the engines to show none was compiled."""

    def __init__(self):
        super().__init__()
        self.engines = []

    def __call__(self, plan, log):
        engine = StandInEngine(staging=False)
        self.engines.append(engine)
        self.made.append(plan.config)
        return Bench(plan.config, log, engine_factory=lambda _: engine, pool=stand_in_pool(3))


def test_fused_worker_arms_staging_before_update_are_refused_before_any_bench(tmp_path):
    benches = Benches()
    with pytest.raises(ConfigError, match="WORKER=fused"):
        run_ab(["--knob", "WORKER=fused", "--out", str(tmp_path / "out")], benches)
    assert benches.made == []
    assert not (tmp_path / "out").exists()


def test_fused_worker_refusal_is_one_line_and_keeps_earlier_results(tmp_path, capsys):
    out = earlier_report(tmp_path / "out")
    assert cli.main(["ab", "--knob", "WORKER=fused", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "STAGE_BEFORE_UPDATE=on" in err
    assert_untouched(out)


def test_engine_that_cannot_stage_is_refused_before_any_compile_or_file(tmp_path):
    out = earlier_report(tmp_path / "out")
    benches = EnginesWithoutStaging()
    with pytest.raises(ConfigError, match="lacks prepare_fwd_bwd_input"):
        run_ab(["--arms", "on,off", "--steps", "2", "--out", str(out)], benches)
    assert len(benches.engines) == 1
    assert ("compile",) not in benches.engines[0].calls
    assert_untouched(out)


@pytest.mark.parametrize("case", ["file", "under_file"])
def test_out_that_cannot_hold_the_report_is_refused_with_one_line(tmp_path, capsys, case):
    blocker = tmp_path / "blocker"
    blocker.write_text("keep me\n")
    out = blocker if case == "file" else blocker / "report"
    assert cli.main(["ab", "--steps", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"rl-trainer-bench ab: --out={out}: ")
    assert blocker.read_text() == "keep me\n"


class InterruptedEngine(StandInEngine):
    """Ctrl-C arrives during the update of the `at`-th step this engine runs (compile excluded)."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def update(self):
        if self.train_step + 1 == self.at:
            raise KeyboardInterrupt
        return super().update()


def test_ctrl_c_writes_the_finished_arms_marked_incomplete_and_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    # the warm-up makes updates 1-2, then seed 0 runs off first: arm off makes updates 3-4; the
    # 5th is arm on's first step
    engine = InterruptedEngine(at=5)

    def make_bench(plan, log):
        return Bench(plan.config, log, engine_factory=lambda _: engine, pool=stand_in_pool(3))

    try:
        code = run_ab(["--steps", "2", "--schedule-seed", "0", "--out", str(out)], make_bench)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped the ab command")
    assert code == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "interrupted in arm on (2/24); 1 of 24 arms finished" in err
    report = json.loads((out / "ab.json").read_text())
    assert report["incomplete"] is True and report["verdict"] is None
    assert report["interrupted"] == "in arm on (2/24)"
    assert [a["label"] for a in report["arms"]] == ["off"]
    assert len(report["arms"][0]["records"]) == 2
    assert "score" not in report and "checks" not in report
    assert not (out / "ab.txt").exists()
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temporary left
