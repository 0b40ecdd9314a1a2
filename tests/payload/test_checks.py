"""Well-formedness checks: each rule passes a built micro-batch and fails one broken its way."""

import dataclasses
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.payload.build import build_micro_batch
from rl_trainer_bench.payload.checks import (
    MAX_REPORTS_PER_RULE,
    check_payload,
    loss_positions,
    payload_warnings,
)
from rl_trainer_bench.payload.npz import load_npz, save_npz
from rl_trainer_bench.payload.packing import PackingLayout
from rl_trainer_bench.payload.routing_profile import load_profile

TINY = preset("cpu-tiny").engine
LAYOUT = PackingLayout(4, 128, pad_rows=1, real_fraction=(0.7, 0.9), segments_per_row=(3.0,))


@pytest.fixture
def payload():
    built = build_micro_batch(TINY, load_profile(None), seed=5, index=0, layout=LAYOUT)
    assert check_payload(built, TINY) == []
    # Unfrozen copies, digests dropped: each test breaks one thing, not the digest rule too.
    arrays = {k: v.copy() for k, v in built.arrays().items()}
    return dataclasses.replace(built, **arrays, digests={})


def first_segment(payload, segment=2):
    """Row 0's tokens of `segment` (row 0 always has 3 segments in LAYOUT)."""
    return np.flatnonzero(payload.segment_ids[0] == segment)


def padding_token(payload):
    rows, cols = np.nonzero(payload.segment_ids == 0)
    return int(rows[0]), int(cols[0])


def only_rule(problems, rule):
    assert problems, "the broken micro-batch passed"
    assert all(rule in p for p in problems), problems
    return problems


def test_split_segment_is_named_with_row_and_position(payload):
    last = first_segment(payload)[-1]
    payload.segment_ids[0, last] = 1  # segment 1 resumes after segment 2 began
    problems = check_payload(payload, TINY)
    assert (
        f"row 0 position {last}: segment id 1 where run 3 of the row begins or continues"
        in (problems[0])
    ), problems


def test_position_that_does_not_restart_is_named(payload):
    start = first_segment(payload)[0]
    payload.positions[0, start] = payload.positions[0, start - 1] + 1  # continues the previous
    problems = only_rule(check_payload(payload, TINY), "positions restart")
    assert problems[0] == (
        f"row 0 position {start}: position {start}, expected 0 (offset in its segment) "
        "[positions restart at 0 in each segment]"
    )


def test_mask_on_padding_fails(payload):
    b, t = padding_token(payload)
    payload.completion_mask[b, t] = 1
    only_rule(check_payload(payload, TINY), "completion_mask is 0 on padding")


def test_mask_on_a_segments_last_token_fails(payload):
    payload.completion_mask[0, first_segment(payload)[-1]] = 1
    problems = check_payload(payload, TINY)
    assert any("no next token" in p for p in problems), problems


def test_mask_with_a_hole_fails(payload):
    where = first_segment(payload)
    payload.completion_mask[0, where[-3]] = 0
    only_rule(check_payload(payload, TINY), "completion is one run to the segment's end")


def test_advantage_that_varies_inside_a_sequence_fails(payload):
    payload.advantages[0, first_segment(payload)[-1]] += 0.5
    only_rule(check_payload(payload, TINY), "advantages constant per segment")


def test_non_finite_values_fail_where_the_loss_reads_them_and_warn_where_masked(payload):
    counted, ignored = loss_positions(payload), ~loss_positions(payload)
    b, t = np.argwhere(counted)[3]
    for name, value in (("old_logps", np.nan), ("old_logps", -np.inf), ("advantages", np.inf)):
        broken = dataclasses.replace(payload, **{name: getattr(payload, name).copy()})
        getattr(broken, name)[b, t] = value
        problems = check_payload(broken, TINY)
        assert (
            f"row {b} position {t}: {name} is {value} [{name} finite where the loss reads it]"
            in (problems)
        )
    prompt = ignored & (payload.segment_ids > 0)
    payload.old_logps[prompt] = -np.inf
    assert check_payload(payload, TINY) == []
    warnings = payload_warnings(payload, TINY)
    assert warnings and all("non-finite where masked" in w for w in warnings)


def test_input_id_past_the_vocabulary_fails(payload):
    payload.input_ids[1, 5] = TINY.model.vocab_size
    problems = only_rule(check_payload(payload, TINY), "input ids in [0, ")
    assert problems == [
        f"row 1 position 5: input id {TINY.model.vocab_size} (vocab_size "
        f"{TINY.model.vocab_size}) [input ids in [0, {TINY.model.vocab_size})]"
    ]


def test_expert_id_below_minus_one_fails_on_real_and_padding_tokens(payload):
    payload.routed_experts[0, 4, 0, 0] = -3
    only_rule(check_payload(payload, TINY), "or -1")
    payload.routed_experts[0, 4, 0, 0] = payload.routed_experts[0, 4, 0, 1] ^ 1
    b, t = padding_token(payload)
    payload.routed_experts[b, t, 0, 0] = -3
    only_rule(check_payload(payload, TINY), "routed_experts -1 on padding")


def test_repeated_expert_fails_and_shows_the_layer(payload):
    routed = payload.routed_experts
    routed[0, 2, 1, 1] = routed[0, 2, 1, 0]
    problems = only_rule(check_payload(payload, TINY), "experts distinct per token")
    assert problems[0].startswith("row 0 position 2: a token's experts repeat: layer 1 has")


def test_expert_out_of_range_fails(payload):
    payload.routed_experts[0, 4, 0, 0] = TINY.model.num_experts
    only_rule(check_payload(payload, TINY), "experts in [0, 8) or -1")


def test_routed_padding_fails(payload):
    b, t = padding_token(payload)
    payload.routed_experts[b, t, 0, 0] = 3
    only_rule(check_payload(payload, TINY), "routed_experts -1 on padding")


def test_wrong_dtype_and_shape_are_named_by_array(payload):
    broken = dataclasses.replace(payload, positions=payload.positions.astype(np.int64))
    assert check_payload(broken, TINY) == [
        "positions: dtype int64, the contract says int32 [dtypes]"
    ]
    broken = dataclasses.replace(payload, routed_experts=payload.routed_experts[:, :, :1])
    assert check_payload(broken, TINY) == [
        "routed_experts: shape (4, 128, 1, 2), expected (4, 128, 2, 2) [shapes]"
    ]


def test_ref_logps_must_match_the_losss_beta(payload):
    extra = dataclasses.replace(payload, ref_logps=payload.old_logps.copy())
    assert check_payload(extra, TINY) == [
        "ref_logps: present but loss.beta=0; the engine takes ref_logps exactly when beta > 0 "
        "[optional arrays]"
    ]


def test_stale_digest_fails(payload):
    built = build_micro_batch(TINY, load_profile(None), seed=5, index=0, layout=LAYOUT)
    input_ids = built.input_ids.copy()
    input_ids[0, 0] += 1
    stale = dataclasses.replace(built, input_ids=input_ids)
    only_rule(check_payload(stale, TINY), "[digests]")


def test_many_broken_positions_are_counted_not_listed(payload):
    counted = loss_positions(payload)
    payload.old_logps[counted] = np.inf
    problems = check_payload(payload, TINY)
    assert len(problems) == MAX_REPORTS_PER_RULE + 1
    assert problems[-1] == (
        f"... and {int(counted.sum()) - 5} more positions breaking "
        "[old_logps finite where the loss reads it]"
    )


def test_check_command_fails_a_broken_file_and_passes_a_good_one(payload, tmp_path, capsys):
    path = str(tmp_path / "mb.npz")
    save_npz(payload, path)
    assert cli.main(["check", "--payload", path, "--skip-numerics"]) == 0
    assert "well-formedness ok" in capsys.readouterr().out
    payload.positions[0, 1] = 7
    save_npz(payload, path)
    assert cli.main(["check", "--payload", path, "--skip-numerics"]) == 1
    out = capsys.readouterr().out
    assert "row 0 position 1: position 7, expected 1" in out and "FAILED (1 problems)" in out


def _built():
    return build_micro_batch(TINY, load_profile(None), seed=5, index=0, layout=LAYOUT)


def _flip_last_byte_of(path, member):
    """Flip the last data byte of one archive member (inside its array data, past the header)."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    data = bytearray(Path(path).read_bytes())
    start = info.header_offset
    name_length, extra_length = struct.unpack("<HH", data[start + 26 : start + 30])
    end = start + 30 + name_length + extra_length + info.compress_size
    data[end - 1] ^= 0x01
    Path(path).write_bytes(bytes(data))


def test_one_altered_byte_of_a_saved_payload_fails_the_check(tmp_path, capsys):
    path = str(tmp_path / "mb.npz")
    save_npz(_built(), path)
    _flip_last_byte_of(path, "old_logps.npy")
    assert cli.main(["check", "--payload", path, "--skip-numerics"]) == 2
    assert "mb.npz" in capsys.readouterr().err


def test_arrays_changed_after_their_digests_were_written_fail_the_check(tmp_path, capsys):
    built = _built()
    path = str(tmp_path / "mb.npz")
    input_ids = built.input_ids.copy()
    input_ids[0, 0] ^= 1
    save_npz(dataclasses.replace(built, input_ids=input_ids), path)  # the old digests, kept
    assert cli.main(["check", "--payload", path, "--skip-numerics"]) == 1
    out = capsys.readouterr().out
    assert "input_ids: content does not match its stored digest" in out and "FAILED (1 " in out
    with pytest.raises(UserError, match="input_ids: content does not match"):
        load_npz(path)


def _save_raw(path, **arrays):
    with open(path, "wb") as out:
        np.savez(out, **arrays)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncated", "not a readable .npz"),
        ("empty", "not a readable .npz"),
        ("npy", "a single .npy array"),
        ("no_mask", "no array completion_mask"),
        ("digests_not_pairs", "malformed digests"),
        ("digests_numbers", "malformed digests"),
        ("digests_unknown_array", "malformed digests"),
    ],
)
def test_damaged_payload_files_are_one_line_errors(tmp_path, capsys, damage, message):
    built = _built()
    path = str(tmp_path / "mb.npz")
    save_npz(built, path)
    arrays = built.arrays()
    good_digests = [f"{k}={v}" for k, v in sorted(built.digests.items())]
    if damage == "truncated":
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        Path(path).write_bytes(b"")
    elif damage == "npy":
        with open(path, "wb") as out:
            np.save(out, built.input_ids)
    elif damage == "no_mask":
        del arrays["completion_mask"]
        _save_raw(path, **arrays, digests=np.array(good_digests))
    elif damage == "digests_not_pairs":
        _save_raw(path, **arrays, digests=np.array(["input_ids"]))
    elif damage == "digests_numbers":
        _save_raw(path, **arrays, digests=np.arange(3))
    else:
        _save_raw(path, **arrays, digests=np.array([*good_digests, "labels=00ff"]))
    assert cli.main(["check", "--payload", path, "--skip-numerics"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
