"""Chip and slice facts: slice parsing drives the renderer's node selectors and the AOT target."""

import pytest

from rl_trainer_bench.chips.accelerators import chip_by_name, chip_for_device_kind, parse_slice


def test_slice_derives_hosts_and_pathways_instance_type():
    tpu_slice = parse_slice("v5p:4x8x8")
    assert tpu_slice.num_chips == 256
    assert tpu_slice.num_hosts == 64
    assert tpu_slice.pathways_instance_type == "tpuv5:4x8x8"
    assert tpu_slice.chip.gke_accelerator == "tpu-v5p-slice"


def test_single_host_slice_has_one_host():
    tpu_slice = parse_slice("v5e:2x2")
    assert (tpu_slice.num_hosts, tpu_slice.chips_per_host) == (1, 4)


@pytest.mark.parametrize(
    "text", ["v9:2x2", "v5p:2x2", "v5e:2x2x2", "tpu7x", "h200:1x1", "v5p:0x2x2"]
)
def test_unknown_or_malformed_slice_is_refused_with_known_forms(text):
    with pytest.raises(ValueError, match=r"known forms are .*tpu7x:4x4x8"):
        parse_slice(text)


def test_device_kind_maps_to_chip_and_unknown_kind_to_none():
    assert chip_for_device_kind("NVIDIA H200").peak_bf16_flops == 605e12
    assert chip_for_device_kind("cpu") is None
    with pytest.raises(ValueError, match="known chips"):
        chip_by_name("a100")


@pytest.mark.parametrize(
    ("text", "chips", "devices"),
    [("tpu7x:4x4x8", 128, 256), ("v5p:4x8x8", 256, 256), ("v6e:2x4", 8, 8), ("v5e:2x2", 4, 4)],
)
def test_slice_counts_jax_devices_per_chip(text, chips, devices):
    # Ironwood shows each chip as two JAX devices (libtpu's 4x4x8 topology lists 256 of them);
    # the other TPU generations one.
    tpu_slice = parse_slice(text)
    assert (tpu_slice.num_chips, tpu_slice.num_devices) == (chips, devices)


def test_per_device_share_of_a_two_device_chip():
    tpu7x = chip_by_name("tpu7x")
    assert tpu7x.per_device(tpu7x.memory_bytes) == 96 * 1024**3
    assert chip_by_name("v5p").per_device(459e12) == 459e12


def test_a_chips_device_memory_is_what_its_runtime_grants_where_measured():
    """A v5e runtime grants a program 16,909,336,064 B of the chip's 16 GiB (bytes_limit, measured
    on a chip): the fit of a v5e slice compiled from a CPU host is judged against that. A chip
    not measured keeps its nameplate share."""
    v5e, v6e, tpu7x = chip_by_name("v5e"), chip_by_name("v6e"), chip_by_name("tpu7x")
    assert v5e.device_memory_bytes == 16_909_336_064
    assert "bytes_limit, measured" in v5e.device_memory_source
    assert v6e.device_memory_bytes == 32 * 1024**3
    assert tpu7x.device_memory_bytes == 96 * 1024**3
    assert tpu7x.device_memory_source == "tpu7x table, 2 device(s) per chip"
