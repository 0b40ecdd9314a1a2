"""A same-process A/B holds one training state for all its arms and warms each bench once.

Arms that differ in a program get a Bench each, but only the first Bench's engine allocates a
state; every later one trains it (`share_state`). An arm whose programs need another state is
refused before anything compiles, naming its keys and the cross-pod way. Every bench is warmed
once, up front; each later turn scores from its first step, and a compile inside a scored step
still fails the A/B.
"""

import dataclasses
import gc
import json
import math

import jax
import pytest
from stand_in_engine import StandInEngine, stand_in_pool

from rl_trainer_bench import cli
from rl_trainer_bench.ab import command as ab
from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.builtin import programs, sharding
from rl_trainer_bench.engine.builtin.jax_engine import JaxEngine
from rl_trainer_bench.engine.contract import StateMismatch, example_payloads_for
from rl_trainer_bench.engine.factory import BUILT_IN
from rl_trainer_bench.errors import UserError

# Two settings of an engine key that changes the forward-backward program, not the state.
TWO_PROGRAMS = "narrow:ragged_buffer_factor=1.25,wide:ragged_buffer_factor=2"
# No dropless retry: one program fewer to compile per bench, none that the bytes held depend on.
NO_RETRY = ("--knob", "ENGINE_FLAGS=retry_when_tokens_dropped=false")


def run_ab(argv, make_bench):
    args = cli.build_parser(["ab"]).parse_args(["ab", *argv])
    return ab.run(args, make_bench=make_bench)


class KeptBenches:
    """The driver's own Benches, kept after the A/B returns so their device arrays can be read."""

    def __init__(self):
        self.benches = []

    def __call__(self, plan, log):
        self.benches.append(Bench(plan.config, log, engine_config=plan.engine))
        return self.benches[-1]


def state_bytes(engine_config) -> int:
    """The bytes of one training state of `engine_config`, from its abstract shapes alone."""
    mesh = sharding.make_mesh(engine_config.mesh)
    abstract = programs.abstract_state(engine_config, mesh)
    return sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(abstract))


def live_device_bytes() -> int:
    return sum(array.nbytes for array in jax.live_arrays() if not array.is_deleted())


def held_by_ab(arms: str, out) -> tuple[int, dict]:
    """Device bytes the A/B of `arms` (cpu-tiny, 2 turns of 1 step) holds at its end, with its
    benches still alive, over what the process held before it (an earlier test in the process
    may have left arrays alive); its report. The benches are let go before returning."""
    gc.collect()
    before = live_device_bytes()
    kept = KeptBenches()
    argv = ["--arms", arms, "--order", "written", "--steps", "1", "--out", str(out), *NO_RETRY]
    code = run_ab(argv, kept)
    report = json.loads((out / "ab.json").read_text())
    assert code == 0, report["checks"]
    held = live_device_bytes() - before
    kept.benches.clear()
    gc.collect()
    return held, report


@pytest.mark.slow
def test_two_arms_with_their_own_programs_hold_one_arms_bytes(tmp_path):
    """cpu-tiny on 8 host devices. One setting (one bench) holds its state (5.4 MB) and what
    the process keeps beside it; two settings with their own fwd_bwd programs (two benches) hold
    the same within 5%, where a state per bench would add a whole state (+67% here)."""
    one_state = state_bytes(PRESETS["cpu-tiny"].engine_for(BUILT_IN))
    one_arm, _ = held_by_ab("a:ragged_buffer_factor=2,b:ragged_buffer_factor=2", tmp_path / "1")
    two_arms, report = held_by_ab(TWO_PROGRAMS, tmp_path / "2")
    assert len(report["compile_s"]) == 2  # two benches, each its own programs
    assert one_state <= one_arm
    assert abs(two_arms - one_arm) <= 0.05 * one_arm, (two_arms, one_arm, one_state)
    assert report["training_state"].startswith("one training state shared by every arm")


def test_a_sibling_engine_steps_the_state_its_family_holds():
    """The built-in engine's share_state: no state is allocated for the sibling, the sibling's
    update is the family's (the first engine takes it, and its digest), and a config whose
    optimizer moments have another dtype is refused naming the first such leaf. The two
    settings of TWO_PROGRAMS, without the dropless retry: the programs the A/B above compiled."""
    tiny = PRESETS["cpu-tiny"].engine_for(BUILT_IN)
    config = dataclasses.replace(
        tiny, moe=dataclasses.replace(tiny.moe, retry_when_tokens_dropped=False)
    )
    assert config.moe.ragged_buffer_factor == 2.0  # TWO_PROGRAMS' wide arm
    first = JaxEngine(config)
    before = live_device_bytes()
    narrow = dataclasses.replace(
        config, moe=dataclasses.replace(config.moe, ragged_buffer_factor=1.25)
    )
    sibling = first.share_state(narrow)
    assert live_device_bytes() == before
    payload = example_payloads_for(config, 1)[0]
    first.compile(payload)
    sibling.compile(payload)
    first.fwd_bwd(payload)
    first.update()
    with pytest.raises(Exception, match="call take_shared_state"):
        sibling.fwd_bwd(payload)
    sibling.take_shared_state()
    sibling.fwd_bwd(payload)
    assert sibling.update() == 2
    stepped = sibling.parameter_digest()
    first.take_shared_state()
    assert first.train_step == 2 and first.parameter_digest() == stepped
    with pytest.raises(Exception, match="call take_shared_state"):
        sibling.parameter_digest()  # its arrays went to `first`, which may donate them
    bf16 = dataclasses.replace(
        config, optimizer=dataclasses.replace(config.optimizer, mu_dtype="bfloat16")
    )
    with pytest.raises(StateMismatch, match=r"\.mu\[.*is float32, the arm needs bfloat16"):
        first.share_state(bf16)


def test_an_arm_needing_another_state_is_refused_with_its_key_before_any_compile(tmp_path, capsys):
    out = tmp_path / "out"
    arms = "plain:mu_dtype=float32,half:mu_dtype=bfloat16"
    code = cli.main(["ab", "--arms", arms, "--steps", "1", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "arm half (mu_dtype=bfloat16) needs another training state than arm plain" in err
    assert "is float32, the arm needs bfloat16" in err and "ab --from-logs" in err
    assert not out.exists()  # refused before any file (and before any compile)


def test_an_arm_of_another_engine_is_refused_before_any_engine_is_built(tmp_path):
    built = []
    arms = "builtin:ENGINE=builtin,maxtext:ENGINE=maxtext"
    with pytest.raises(UserError, match=r"arm maxtext \(ENGINE=maxtext\) needs another training"):
        run_ab(["--arms", arms, "--out", str(tmp_path)], lambda *a: built.append(a))
    assert built == []


class StandInBenches:
    """Stand-in Benches; the first engine is built, the others are its share_state siblings."""

    def __init__(self, make_engine=StandInEngine):
        self.engines = []
        self.make_engine = make_engine

    def __call__(self, plan, log):
        def engine(_):
            self.engines.append(self.make_engine())
            return self.engines[-1]

        return Bench(
            plan.config,
            log,
            engine_config=plan.engine,
            engine_factory=engine,
            pool=stand_in_pool(3),
        )


def test_every_bench_warms_up_once_and_each_turn_scores_from_its_first_step(tmp_path):
    """Two benches, 8 turns of 2 steps: 2 warm-up steps per bench, once, before the first turn
    (one boundary stages as the `on` arms do); every turn's steps are scored, and the family's
    update count is warm-ups plus scored steps."""
    made = StandInBenches()
    arms = "off,on,wide:ragged_buffer_factor=2"
    argv = ["--arms", arms, "--order", "mirrored", "--steps", "2", "--warmup-steps", "2"]
    assert run_ab([*argv, "--out", str(tmp_path)], made) == 0
    report = json.loads((tmp_path / "ab.json").read_text())
    assert report["warmup_steps_total"] == 4
    arms_run = report["arms"]
    assert [len(a["records"]) for a in arms_run] == [2] * 6
    assert {r["warmup"] for a in arms_run for r in a["records"]} == {False}
    (first,) = made.engines  # the second bench's engine is the first's sibling
    family = first._family
    assert family[-1].train_step == 4 + 6 * 2
    assert {c["status"] for c in report["checks"]} == {"PASS"}


class CompilingEngine(StandInEngine):
    """A stand-in whose `at`-th fwd_bwd (from 0) compiles a fresh JAX program, as a program
    recompiled for an unforeseen input would."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at
        self.fwd_bwds = [0]  # shared by the family: the count of the A/B's fwd_bwd calls

    def fwd_bwd(self, batch):
        if self.fwd_bwds[0] == self.at:
            jax.jit(lambda x: x * 3 + 1)(jax.numpy.ones(7)).block_until_ready()
        self.fwd_bwds[0] += 1
        super().fwd_bwd(batch)


def test_a_compile_in_a_later_turns_first_scored_step_fails_the_ab(tmp_path):
    """Warm-up 2 steps of 1 micro-batch (calls 0-1), turn off (calls 2-3), then turn on's first
    step compiles (call 4): no warm-up hides it, the exact check and the verdict FAIL."""
    made = StandInBenches(lambda: CompilingEngine(at=4))
    argv = ["--order", "mirrored", "--steps", "2", "--warmup-steps", "2", "--knob", "MICRO_STEPS=1"]
    assert run_ab([*argv, "--out", str(tmp_path)], made) == 1
    report = json.loads((tmp_path / "ab.json").read_text())
    assert report["verdict"] == "FAIL"
    check = next(c for c in report["checks"] if c["name"] == "no recompiles in scored steps")
    assert check["status"] == "FAIL" and check["detail"].startswith(
        "on compiled during scored steps at step(s) [0]"
    )
