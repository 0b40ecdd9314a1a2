"""check-engine's share_state check on MaxText's adapter (over the stand-in): a second engine
over the state and the first engine stepping in turn hold one state's bytes, and an engine that
gave its state away but keeps the arrays is a FAIL naming take_shared_state."""

from __future__ import annotations

import dataclasses

import pytest
from maxtext_stand_in import STAND_IN_API, StandInMaxTextEngine

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.contract import example_payloads_for
from rl_trainer_bench.engine.returns import check_engine
from rl_trainer_bench.engine.sharing_check import check_sharing, live_bytes

# The Qwen3.5 cell on 8 host devices (2x2x2) with a smaller vocabulary, as the adapter's tests.
CONFIG = dataclasses.replace(
    PRESETS["cpu-tiny-qwen3.5"].engine,
    model=dataclasses.replace(PRESETS["cpu-tiny-qwen3.5"].engine.model, vocab_size=128),
)


class KeepingMaxTextEngine(StandInMaxTextEngine):
    """The adapter with its release removed: an engine that gave its state away keeps it."""

    load_api = staticmethod(
        lambda: dataclasses.replace(STAND_IN_API, release_state=lambda engine: None)
    )


def checked(engine_type):
    """check-engine's order: the engine built (its state's bytes counted), the contract's
    checks, then the share_state check."""
    before = live_bytes()
    engine = engine_type(CONFIG)
    state_bytes = live_bytes() - before
    payloads = example_payloads_for(CONFIG, 2, prefix="check")
    assert check_engine(engine, payloads) == []
    return check_sharing(engine, CONFIG, payloads, state_bytes), state_bytes


def test_maxtexts_adapter_holds_one_state_whichever_engine_stepped():
    sharing, state_bytes = checked(StandInMaxTextEngine)
    assert sharing.failures == []
    # the stand-in's weights and Adam's two moments: 3 x float32 (embed and head 128 x 64, the
    # 4 layers' gates 64 x 8 and experts 8 x 64 x 64), replicated (one copy per array, whatever
    # its devices), and Adam's step count
    assert state_bytes == 3 * 4 * (2 * 128 * 64 + 4 * 64 * 8 + 4 * 8 * 64 * 64) + 4
    assert "stepped, then the first again" in sharing.measured


def test_an_engine_that_keeps_the_state_it_gave_away_fails_naming_take_shared_state():
    sharing, state_bytes = checked(KeepingMaxTextEngine)
    assert len(sharing.failures) == 2
    assert sharing.failures[0].startswith(
        "take_shared_state: after the second engine's step the live arrays hold"
    )
    assert (
        "the first engine, which gave the state away, still holds arrays of it"
        in (sharing.failures[0])
    )
    assert f"of the state's {state_bytes:,})" in sharing.failures[0]
    assert "the second engine, which gave the state away" in sharing.failures[1]


@pytest.mark.parametrize("method", ["share_state", "take_shared_state"])
def test_an_engine_without_both_methods_is_said_so(method):
    class Plain:
        def share_state(self, config):
            raise AssertionError("not called")

        def take_shared_state(self):
            raise AssertionError("not called")

    setattr(Plain, method, None)
    sharing = check_sharing(Plain(), CONFIG, [], 0)
    if method == "share_state":
        assert sharing.failures == [] and sharing.measured.startswith("no share_state")
    else:
        assert sharing.failures == [
            "share_state without take_shared_state: the contract needs both"
        ]
