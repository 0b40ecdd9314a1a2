"""The engine's initial state compiles off the caller's thread, beside the programs' compile, so
building an engine (the set-up before the compile) does not wait for it."""

import dataclasses
import threading

import jax

from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine import compile_events
from rl_trainer_bench.engine.builtin.jax_engine import JaxEngine
from rl_trainer_bench.engine.config import MeshConfig

# A seed of its own: the initial state's program is compiled afresh, not found in a cache.
CONFIG = dataclasses.replace(PRESETS["cpu-tiny-dense"].engine, mesh=MeshConfig(), seed=4242)


def test_the_initial_state_compiles_on_another_thread():
    threads: list[str] = []

    def listen(event, seconds, **kwargs):
        if event == compile_events.BACKEND_COMPILE and "initial_state" in str(
            kwargs.get("fun_name")
        ):
            threads.append(threading.current_thread().name)

    with compile_events.listening(listen):
        engine = JaxEngine(CONFIG, jax.devices()[:1])
        digest = engine.parameter_digest()  # the first use of the state waits for it
    assert digest
    assert threads == ["engine-initial-state"]
