"""extra_device_work: the FLOPs it states are the FLOPs XLA compiles in, and the loss, gradient and
update it leaves exactly as they were (the built-in engine on one CPU device, a dense model)."""

import dataclasses

import pytest
from config_payloads import config_payload
from one_update import assert_same_update, one_update

from rl_trainer_bench import cli
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.extra_work import matmuls

DENSE = dataclasses.replace(
    PRESETS["cpu-tiny-dense"].engine, mesh=MeshConfig(), micro_batch_rows=2, seq_len=64
)
WORK = 1e8  # 3 matmuls of 256 x 256: 3 x 2 x 256**3 = 100,663,296 FLOPs
WITH_WORK = dataclasses.replace(DENSE, extra_device_work=WORK)


@pytest.fixture(scope="module")
def updates():
    """(plain, with work): each config's engine compiled once, one update each; both tests read
    them, the FLOPs from the fwd_bwd program each update ran."""
    return tuple(
        one_update(config, config_payload(config), config_payload(config, seed=1))
        for config in (DENSE, WITH_WORK)
    )


def test_the_sizing_is_the_written_chain():
    assert matmuls(WORK) == (256, 3)
    assert matmuls(1e12) == (4096, 7)  # the chip's 1%: 7 x 2 x 4096**3 = 9.62e11 per call
    assert matmuls(0) == (0, 0)


def test_the_program_has_the_stated_flops_more(updates):
    plain, extra = updates
    added = extra.fwd_bwd_flops - plain.fwd_bwd_flops
    chain = 100_663_296  # 3 x 2 x 256**3
    # beside the chain, the matrix's elementwise build and the final sum: a few per element
    assert chain <= added <= chain + 16 * 256**2, added


def test_the_loss_gradient_and_update_are_unchanged(updates):
    plain, extra = updates
    assert_same_update(extra, plain)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("extra_device_work=1e9", "extra_device_work=1e+09 adds matmuls to the built-in engine's"),
        ("extra_host_bytes=1000000", "extra_host_bytes=1000000 adds filler bytes to the built-in"),
    ],
)
def test_another_engine_is_refused_in_one_line(flag, message, monkeypatch, capsys):
    """Both keys are the built-in engine's own additions (extra_host_bytes too: its filler)."""
    monkeypatch.setenv("ENGINE_FLAGS", flag)
    code = cli.main(["run", "--plan", "--preset", "cpu-tiny-dense", "--engine", "maxtext"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert message in err
