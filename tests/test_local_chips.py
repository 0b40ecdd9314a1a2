"""A host's TPU chips from its PCI bus (local_chips.py), and the preset `run` and `ab` time when
none is named: the chip's own on a host with one TPU chip, the CPU's elsewhere; never the render
host's chips for a pod."""

from __future__ import annotations

import pytest

from rl_trainer_bench import cli, local_chips
from rl_trainer_bench.ab import command as ab
from rl_trainer_bench.bench import entry
from rl_trainer_bench.config.presets import default_preset
from rl_trainer_bench.local_chips import LocalTpu, local_tpu, usable_tpu


def _pci(root, *devices):
    """A PCI device tree: one folder per (vendor, device) pair, as /sys/bus/pci/devices has."""
    for index, (vendor, device) in enumerate(devices):
        folder = root / f"0000:00:{index:02x}.0"
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "device").write_text(device + "\n")
    return root


GOOGLE, V5E, V6E = "0x1ae0", "0x0063", "0x006f"
INTEL_BRIDGE = ("0x8086", "0x1237")


def test_one_v5e_chip_among_other_devices(tmp_path):
    root = _pci(tmp_path, INTEL_BRIDGE, (GOOGLE, V5E), (GOOGLE, "0x0001"))  # a Google NIC too
    assert local_tpu(root) == LocalTpu("v5e", 1)
    assert local_tpu(root).describe() == "1 TPU v5e chip on this host"


def test_a_host_without_tpu_chips_or_without_a_pci_tree_has_none(tmp_path):
    assert local_tpu(_pci(tmp_path / "pci", INTEL_BRIDGE)) is None
    assert local_tpu(tmp_path / "absent") is None


def test_an_unreadable_or_binary_device_file_is_not_a_chip(tmp_path):
    root = _pci(tmp_path, (GOOGLE, V5E), (GOOGLE, V5E))
    (root / "0000:00:00.0" / "vendor").write_bytes(b"\xff\xfe\x00binary")
    (root / "0000:00:01.0" / "device").unlink()
    assert local_tpu(root) is None


def test_four_v6e_chips(tmp_path):
    root = _pci(tmp_path, *[(GOOGLE, V6E)] * 4)
    assert local_tpu(root) == LocalTpu("v6e", 4)
    assert local_tpu(root).describe() == "4 TPU v6e chips on this host"


def test_jax_platforms_that_leave_tpus_out_hide_the_chips(tmp_path):
    root = _pci(tmp_path, (GOOGLE, V5E))
    assert usable_tpu({}, root) == LocalTpu("v5e", 1)
    assert usable_tpu({"JAX_PLATFORMS": "tpu,cpu"}, root) == LocalTpu("v5e", 1)
    assert usable_tpu({"JAX_PLATFORMS": "cpu"}, root) is None


@pytest.mark.parametrize(
    ("tpu", "name", "why"),
    [
        (LocalTpu("v5e", 1), "tpu-v5e-1", "default: 1 TPU v5e chip on this host"),
        (None, "cpu-tiny", "default"),
        (LocalTpu("v5e", 4), "cpu-tiny", "default: 4 TPU v5e chips on this host, and no preset"),
        (LocalTpu("v6e", 1), "tpu-v6e-1", "default: 1 TPU v6e chip on this host"),
        (LocalTpu("v5p", 1), "cpu-tiny", "default: 1 TPU v5p chip on this host, and no preset"),
    ],
)
def test_the_default_preset_is_the_one_chips_own(tpu, name, why):
    preset, source = default_preset(tpu)
    assert preset.name == name and source.startswith(why)


@pytest.fixture
def one_v5e_host(tmp_path, monkeypatch):
    """This host as one with a v5e chip and JAX_PLATFORMS unset (the test session sets cpu)."""
    monkeypatch.setattr(local_chips, "PCI_DEVICES", _pci(tmp_path / "pci", (GOOGLE, V5E)))
    monkeypatch.delenv("JAX_PLATFORMS")


def test_run_on_a_chip_host_plans_the_chips_preset(one_v5e_host, capsys):
    assert cli.main(["run", "--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "plan: preset: tpu-v5e-1 (chosen by default: 1 TPU v5e chip on this host)" in lines
    assert "plan: runtime: single process" in lines


def test_ab_on_a_chip_host_times_the_chips_preset_as_an_accelerator(one_v5e_host):
    args = cli.build_parser(["ab"]).parse_args(["ab"])
    run = ab.complete(args)
    assert args.preset is None  # the flags stay as parsed
    # the accelerator's design: 1-step turns, stopped when settled, min effect 0.5%
    assert (run.steps, run.min_effect, run.looks is not None) == (1, 0.5, True)


def test_a_named_preset_and_a_pod_never_take_the_hosts_chips(one_v5e_host, capsys):
    assert cli.main(["run", "--plan", "--preset", "cpu-tiny"]) == 0
    assert "plan: preset: cpu-tiny (chosen by PRESET)" in capsys.readouterr().out.splitlines()
    # the pod's driver (bench_driver.py) plans for the pod's host, which the render host is not
    assert entry.main([], {"PLAN_ONLY": "1"}) == 0
    assert "plan: preset: cpu-tiny (chosen by default)" in capsys.readouterr().out.splitlines()
