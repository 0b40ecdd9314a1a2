"""The TPU chips a process can open, from its host's PCI bus and device nodes (local_chips.py),
and the preset `run` and `ab` time when none is named: the chip's own where the process can open
one TPU chip, the CPU's elsewhere; never the render host's chips for a pod."""

from __future__ import annotations

import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.ab import command as ab
from rl_trainer_bench.bench import entry
from rl_trainer_bench.chips import local_chips
from rl_trainer_bench.chips.local_chips import LocalTpu, local_tpu, usable_tpu
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.config.presets import default_preset

GOOGLE, V4, V5E, V6E = "0x1ae0", "0x005e", "0x0063", "0x006f"
INTEL_BRIDGE = ("0x8086", "0x1237")


def _pci(root, *devices, groups=None):
    """A PCI device tree as /sys/bus/pci/devices has it: one folder per (vendor, device) pair,
    each with its `iommu_group` link to the group's folder where `groups` gives one."""
    for index, (vendor, device) in enumerate(devices):
        folder = root / f"0000:00:{index + 4:02x}.0"
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "device").write_text(device + "\n")
        if groups is not None:
            (folder / "iommu_group").symlink_to(f"../../../kernel/iommu_groups/{groups[index]}")
    return root


def _dev(root, *names):
    """A /dev folder holding the device nodes `names` (empty files: only their presence counts)."""
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root


def _lent_one_of_four(tmp_path):
    """One v5e chip of a 4-chip VM as its container sees it (tpu-v5e-facts.md): the VM's four
    functions on the PCI bus, iommu groups 0-3, and only group 3's VFIO node."""
    pci = _pci(tmp_path / "pci", *[(GOOGLE, V5E)] * 4, groups=[0, 1, 2, 3])
    return pci, _dev(tmp_path / "dev", "vfio/vfio", "vfio/3")


def test_the_lent_layout_is_one_v5e_chip_with_the_vms_four_named(tmp_path):
    pci, dev = _lent_one_of_four(tmp_path)
    assert local_tpu(pci, dev) == LocalTpu("v5e", 1, 4)
    assert local_tpu(pci, dev).describe() == (
        "1 TPU v5e chip on this host that this process can open, of 4 on its PCI bus"
    )
    preset, why = default_preset(usable_tpu({}, pci, dev))
    assert preset.name == "tpu-v5e-1" and why.startswith("default: 1 TPU v5e chip on this host")


def test_the_whole_four_chip_vm_is_four_chips_and_no_one_chip_preset(tmp_path):
    pci = _pci(tmp_path / "pci", *[(GOOGLE, V5E)] * 4, groups=[0, 1, 2, 3])
    dev = _dev(tmp_path / "dev", "vfio/vfio", "vfio/0", "vfio/1", "vfio/2", "vfio/3")
    assert local_tpu(pci, dev) == LocalTpu("v5e", 4, 4)
    preset, why = default_preset(local_tpu(pci, dev))
    assert preset.name == "cpu-tiny"
    assert why == (
        "default: 4 TPU v5e chips on this host, and no preset for them: the host's CPU; give"
        " PRESET (--preset) and a mesh for the chips"
    )


def test_chips_without_a_device_node_here_are_not_this_processs(tmp_path):
    pci = _pci(tmp_path / "pci", *[(GOOGLE, V5E)] * 4, groups=[0, 1, 2, 3])
    assert local_tpu(pci, _dev(tmp_path / "dev", "vfio/vfio", "vfio/7")) is None
    assert local_tpu(pci, tmp_path / "no-dev") is None
    # functions without an iommu group cannot be handed out through VFIO
    assert (
        local_tpu(_pci(tmp_path / "bare", (GOOGLE, V5E)), _dev(tmp_path / "d2", "vfio/0")) is None
    )


def test_accel_nodes_count_the_chips_that_are_not_behind_vfio(tmp_path):
    pci = _pci(tmp_path / "pci", *[(GOOGLE, V4)] * 4)
    assert local_tpu(pci, _dev(tmp_path / "one", "accel2", "accel_log")) == LocalTpu("v4", 1, 4)
    every = _dev(tmp_path / "all", "accel0", "accel1", "accel2", "accel3", "accel_log")
    assert local_tpu(pci, every) == LocalTpu("v4", 4, 4)
    # never more chips than the bus has: nodes past them are another device's
    assert local_tpu(_pci(tmp_path / "one-chip", (GOOGLE, V4)), every) == LocalTpu("v4", 1, 1)


def test_one_v5e_chip_among_other_devices(tmp_path):
    pci = _pci(tmp_path / "pci", INTEL_BRIDGE, (GOOGLE, V5E), (GOOGLE, "0x0001"), groups=[5, 6, 7])
    dev = _dev(tmp_path / "dev", "vfio/5", "vfio/6", "vfio/7")  # a Google NIC too
    assert local_tpu(pci, dev) == LocalTpu("v5e", 1, 1)
    assert local_tpu(pci, dev).describe() == "1 TPU v5e chip on this host"


def test_a_host_without_tpu_chips_or_without_a_pci_tree_has_none(tmp_path):
    dev = _dev(tmp_path / "dev", "vfio/0")
    assert local_tpu(_pci(tmp_path / "pci", INTEL_BRIDGE, groups=[0]), dev) is None
    assert local_tpu(tmp_path / "absent", dev) is None


def test_an_unreadable_or_binary_device_file_is_not_a_chip(tmp_path):
    root = _pci(tmp_path / "pci", (GOOGLE, V5E), (GOOGLE, V5E), groups=[0, 1])
    (root / "0000:00:04.0" / "vendor").write_bytes(b"\xff\xfe\x00binary")
    (root / "0000:00:05.0" / "device").unlink()
    assert local_tpu(root, _dev(tmp_path / "dev", "vfio/0", "vfio/1")) is None


def test_four_v6e_chips(tmp_path):
    pci = _pci(tmp_path / "pci", *[(GOOGLE, V6E)] * 4, groups=[0, 1, 2, 3])
    dev = _dev(tmp_path / "dev", "vfio/0", "vfio/1", "vfio/2", "vfio/3")
    assert local_tpu(pci, dev) == LocalTpu("v6e", 4, 4)
    assert local_tpu(pci, dev).describe() == "4 TPU v6e chips on this host"


def test_jax_platforms_that_leave_tpus_out_hide_the_chips(tmp_path):
    pci, dev = _lent_one_of_four(tmp_path)
    assert usable_tpu({}, pci, dev) == LocalTpu("v5e", 1, 4)
    assert usable_tpu({"JAX_PLATFORMS": "tpu,cpu"}, pci, dev) == LocalTpu("v5e", 1, 4)
    assert usable_tpu({"JAX_PLATFORMS": "cpu"}, pci, dev) is None


@pytest.mark.parametrize(
    ("tpu", "name", "why"),
    [
        (LocalTpu("v5e", 1, 1), "tpu-v5e-1", "default: 1 TPU v5e chip on this host"),
        (None, "cpu-tiny", "default"),
        (LocalTpu("v5e", 4, 4), "cpu-tiny", "default: 4 TPU v5e chips on this host, and no preset"),
        (
            LocalTpu("v6e", 1, 8),
            "tpu-v6e-1",
            "default: 1 TPU v6e chip on this host that this process can open, of 8",
        ),
        (LocalTpu("v5p", 1, 1), "cpu-tiny", "default: 1 TPU v5p chip on this host, and no preset"),
    ],
)
def test_the_default_preset_is_the_one_chips_own(tpu, name, why):
    preset, source = default_preset(tpu)
    assert preset.name == name and source.startswith(why)


@pytest.fixture
def one_v5e_host(tmp_path, monkeypatch):
    """This host as one chip of a 4-chip v5e VM given to a container, JAX_PLATFORMS unset (the test session
    sets cpu)."""
    pci, dev = _lent_one_of_four(tmp_path)
    monkeypatch.setattr(local_chips, "PCI_DEVICES", pci)
    monkeypatch.setattr(local_chips, "DEVICE_NODES", dev)
    monkeypatch.delenv("JAX_PLATFORMS")


def test_run_on_a_chip_host_plans_the_chips_preset(one_v5e_host, capsys):
    assert cli.main(["run", "--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        "plan: preset: tpu-v5e-1 (chosen by default: 1 TPU v5e chip on this host that this process"
        " can open, of 4 on its PCI bus)"
    ) in lines
    assert "plan: runtime: single process" in lines


def test_run_says_which_preset_it_times_and_why_before_jax_starts(
    one_v5e_host, monkeypatch, tmp_path
):
    """The line `run` prints first, then the runtime starts (not here: there is no chip)."""
    from rl_trainer_bench.bench import driver

    said = []

    def no_chip_here(config, env, log, companions, engine):
        said.append("runtime started")
        return 0

    monkeypatch.setattr(driver, "run_planned", no_chip_here)
    config = BenchConfig.from_env({"RESULTS_DIR": str(tmp_path)}, tpu=usable_tpu({}))
    assert entry.run_bench(config, {}, said.append) == 0
    assert said == [
        "preset: tpu-v5e-1 (chosen by default: 1 TPU v5e chip on this host that this process"
        " can open, of 4 on its PCI bus)",
        "runtime started",
    ]


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
