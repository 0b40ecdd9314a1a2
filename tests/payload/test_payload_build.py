"""Micro-batch building: determinism, digests, optional arrays, files and the `payload` command."""

import dataclasses
import os

import numpy as np
import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.payload.build import build_micro_batch
from rl_trainer_bench.payload.digests import array_digest, payload_digest
from rl_trainer_bench.payload.npz import load_npz, save_npz
from rl_trainer_bench.payload.routing_profile import load_profile

TINY = preset("cpu-tiny").engine
PROFILE = load_profile(None)


def test_same_seed_and_index_give_byte_identical_arrays_and_digests():
    first = build_micro_batch(TINY, PROFILE, seed=7, index=3)
    second = build_micro_batch(TINY, PROFILE, seed=7, index=3)
    for name, array in first.arrays().items():
        assert array.tobytes() == second.arrays()[name].tobytes(), name
    assert first.digests == second.digests
    assert payload_digest(first) == payload_digest(second)


def test_different_indices_give_different_content():
    pool = [build_micro_batch(TINY, PROFILE, seed=7, index=i) for i in range(3)]
    assert [p.name for p in pool] == ["bench_0", "bench_1", "bench_2"]
    assert len({payload_digest(p) for p in pool}) == 3
    for name in ("input_ids", "segment_ids", "routed_experts"):
        assert len({p.digests[name] for p in pool}) == 3, name


def test_every_array_carries_a_digest_and_the_name_can_be_given():
    payload = build_micro_batch(TINY, PROFILE, seed=0, index=4, name="bench_2_4")
    assert payload.name == "bench_2_4"
    assert set(payload.digests) == set(payload.arrays())
    assert payload.digests["routed_experts"] == array_digest(payload.routed_experts)


def test_digest_moves_when_one_element_changes():
    payload = build_micro_batch(TINY, PROFILE, seed=0, index=0)
    routed = payload.routed_experts.copy()
    before = array_digest(routed)
    routed[1, 5, 1, 0] += 1
    assert array_digest(routed) != before
    ids = payload.input_ids.copy()
    ids[0, 0], ids[0, 1] = ids[0, 1] + 1, ids[0, 0] - 1  # same sum, different content
    assert array_digest(ids) != payload.digests["input_ids"]
    assert array_digest(ids.reshape(-1)) != array_digest(ids)  # shape is part of the content


def test_ref_logps_present_only_when_the_loss_uses_them():
    assert build_micro_batch(TINY, PROFILE, seed=0, index=0).ref_logps is None
    with_kl = dataclasses.replace(TINY, loss=dataclasses.replace(TINY.loss, beta=0.04))
    assert build_micro_batch(with_kl, PROFILE, seed=0, index=0).ref_logps is not None


def test_routed_experts_follow_the_engines_replay_setting_unless_overridden():
    no_replay = dataclasses.replace(TINY, moe=dataclasses.replace(TINY.moe, router_replay=False))
    assert build_micro_batch(TINY, PROFILE, seed=0, index=0).routed_experts is not None
    assert build_micro_batch(no_replay, PROFILE, seed=0, index=0).routed_experts is None
    assert build_micro_batch(TINY, PROFILE, seed=0, index=0, replay=False).routed_experts is None


def test_npz_round_trip_keeps_arrays_name_and_digests(tmp_path):
    payload = build_micro_batch(TINY, PROFILE, seed=0, index=1)
    path = str(tmp_path / "mb.npz")
    save_npz(payload, path)
    loaded = load_npz(path)
    assert loaded.name == payload.name and loaded.digests == payload.digests
    assert os.listdir(tmp_path) == ["mb.npz"]


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    payload = build_micro_batch(TINY, PROFILE, seed=0, index=1)

    def savez_that_fails_midway(file, **arrays):
        file.write(b"PK partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", savez_that_fails_midway)
    with pytest.raises(UserError, match=r"cannot write .*mb\.npz \(No space left on device\)"):
        save_npz(payload, str(tmp_path / "mb.npz"))
    assert os.listdir(tmp_path) == []


def test_tampered_npz_is_refused_naming_the_array(tmp_path):
    payload = build_micro_batch(TINY, PROFILE, seed=0, index=1)
    path = str(tmp_path / "mb.npz")
    save_npz(payload, path)
    with np.load(path) as data:
        contents = {k: data[k] for k in data.files}
    contents["positions"][0, 0] += 1
    np.savez(path, **contents)
    with pytest.raises(UserError, match="positions: content does not match its stored digest"):
        load_npz(path)


def test_payload_command_writes_the_micro_batch_and_prints_calibration(tmp_path, capsys):
    out = tmp_path / "mb.npz"
    assert cli.main(["payload", "--preset", "cpu-tiny", "--seed", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "routing calibration (synthetic profile, rescaled from L=60 E=512 K=10)" in printed
    assert load_npz(str(out)).digests == build_micro_batch(TINY, PROFILE, seed=2, index=0).digests


def test_payload_command_with_a_bad_profile_exits_2_and_writes_nothing(tmp_path, capsys):
    profile = tmp_path / "p.json"
    profile.write_text('{"format": "rl_trainer_bench.routing_profile"')
    out = tmp_path / "mb.npz"
    code = cli.main(["payload", "--routing-profile", str(profile), "--out", str(out)])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("rl-trainer-bench payload: routing profile") and "not JSON" in error
    assert len(error.splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["p.json"]


def test_missing_out_folder_is_refused_before_building(tmp_path, capsys):
    assert cli.main(["payload", "--out", str(tmp_path / "absent" / "mb.npz")]) == 2
    error = capsys.readouterr()
    assert "does not exist; create it first" in error.err and "calibration" not in error.out


def test_orchestrator_flags_shape_the_packing(tmp_path):
    out = tmp_path / "mb.npz"
    argv = [
        "payload",
        "--max-prompt-length",
        "16",
        "--max-response-length",
        "16",
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 0
    segments = load_npz(str(out)).segment_ids.max(axis=1)
    assert segments.max() > 1  # 128-token rows of <=32-token sequences pack several
    assert cli.main(["payload", "--max-prompt-length", "16", "--out", str(out)]) == 2
