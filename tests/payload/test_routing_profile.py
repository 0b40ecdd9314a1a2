"""Routing profiles: validation, fitting to an engine, calibration of built micro-batches, extraction."""

import copy
import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trainer_bench import cli
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.config import MeshConfig, MoeConfig
from rl_trainer_bench.payload import build as payloads
from rl_trainer_bench.payload import calibration, routing
from rl_trainer_bench.payload.errors import ProfileError
from rl_trainer_bench.payload.expert_load import max_load_ratio, predict_overflow
from rl_trainer_bench.payload.packing import PackingLayout
from rl_trainer_bench.payload.routing_dump import profile_from_dump, routed_expert_counts
from rl_trainer_bench.payload.routing_profile import (
    RoutingProfile,
    cap_shares,
    fit_to_model,
    load_profile,
    parse_profile,
    zipf_shares,
)

TINY = preset("cpu-tiny").engine


def zipf_profile(experts: int, top_k: int, exponents) -> RoutingProfile:
    """Zipf-like layers, capped at 1/top_k so every share is feasible."""
    shares = np.stack([zipf_shares(experts, s, i) for i, s in enumerate(exponents)])
    return RoutingProfile(experts, top_k, len(exponents), cap_shares(shares, top_k))


def engine_with(rows, seq_len, experts, top_k, layers, expert_shards=1):
    model = dataclasses.replace(TINY.model, num_experts=experts, top_k=top_k, num_layers=layers)
    return dataclasses.replace(
        TINY,
        model=model,
        micro_batch_rows=rows,
        seq_len=seq_len,
        mesh=MeshConfig(expert=expert_shards),
    )


def document(num_experts=4, top_k=2, loads=((4, 3, 2, 1), (1, 1, 1, 1))):
    return {
        "format": "rl_trainer_bench.routing_profile",
        "version": 1,
        "synthetic": True,
        "num_experts": num_experts,
        "top_k": top_k,
        "num_layers": len(loads),
        "layers": [{"expert_load": list(row)} for row in loads],
    }


def test_shipped_default_is_labelled_synthetic_and_matches_the_production_cell():
    profile = load_profile(None)
    model = preset("qwen3.5-397b-cell").engine.model
    assert profile.synthetic and "SYNTHETIC" in profile.description
    assert (profile.num_experts, profile.top_k, profile.num_layers) == (512, 10, 60)
    assert profile.max_load_ratio.min() > 1.79 and profile.max_load_ratio.max() < 3.21
    assert fit_to_model(profile, model) is profile  # used as written on its own cell


def test_profile_round_trips_through_its_json():
    profile = parse_profile(document())
    again = parse_profile(json.loads(json.dumps(profile.to_json())))
    np.testing.assert_allclose(again.shares, profile.shares, atol=1e-9)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: d["layers"][0]["expert_load"].append(1),
            r"layers\[0\].expert_load has 5 entries but num_experts=4",
        ),
        (
            lambda d: d["layers"][1]["expert_load"].__setitem__(2, -1),
            r"layers\[1\].expert_load\[2\]: -1 is less than the minimum of 0",
        ),
        (lambda d: d.update(num_layers=3), r"layers has 2 entries but num_layers=3"),
        (lambda d: d.update(top_k=5), r"top_k=5 > num_experts=4"),
        (
            lambda d: d["layers"][0].update(expert_load=[9, 1, 0, 0]),
            r"layers\[0\] expert 0 takes 90.00% .* more than 1/top_k = 50.00%",
        ),
        (
            lambda d: d["layers"][0].update(expert_load=[0, 0, 0, 0]),
            r"layers\[0\].expert_load sums to 0",
        ),
        (lambda d: d.update(version=2), r"version: 1 was expected"),
        (lambda d: d.update(experts=4), r"'experts' was unexpected"),
    ],
)
def test_malformed_profile_gets_one_line_naming_the_field(edit, message, tmp_path):
    bad = copy.deepcopy(document())
    edit(bad)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match=message) as caught:
        load_profile(str(path))
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_fitting_maps_layers_by_depth_keeps_the_load_curve_and_caps_at_one_over_k():
    source = zipf_profile(8, 2, (0.2, 0.5, 1.0, 1.5))
    model = dataclasses.replace(TINY.model, num_layers=2, num_experts=8, top_k=2)
    fitted = fit_to_model(source, model)
    np.testing.assert_allclose(fitted.shares, source.shares[[0, 3]])  # depth 0 and depth 1
    assert fitted.fitted_from == "L=4 E=8 K=2"
    wide = fit_to_model(source, dataclasses.replace(model, num_experts=32, num_layers=4))
    for before, after in zip(source.shares, wide.shares, strict=True):
        hottest_quarter = np.sort(before)[::-1][:2].sum()
        assert np.sort(after)[::-1][:8].sum() == pytest.approx(hottest_quarter)
    tight = fit_to_model(source, dataclasses.replace(model, num_layers=4, top_k=4))
    assert tight.shares.max() <= 0.25 + 1e-12
    np.testing.assert_allclose(tight.shares.sum(axis=1), 1.0)


@settings(max_examples=25, deadline=None)
@given(
    experts=st.sampled_from([4, 8, 16, 64, 128]),
    top_k=st.integers(1, 8),
    exponents=st.lists(st.floats(0.0, 1.5), min_size=1, max_size=3),
    rows=st.integers(1, 4),
    seq_len=st.sampled_from([64, 300, 2048]),
    seed=st.integers(0, 1000),
)
def test_built_routing_matches_the_profile_within_tolerance(
    experts, top_k, exponents, rows, seq_len, seed
):
    top_k = min(top_k, experts)
    profile = zipf_profile(experts, top_k, exponents)
    engine = engine_with(rows, seq_len, experts, top_k, len(exponents))
    built = payloads.build_calibrated(engine, profile, seed=seed, index=0)
    report = built.calibration
    assert report.missed_layers == []
    # The report's achieved loads are the array's, counted independently.
    counts = routed_expert_counts(built.payload.routed_experts, experts)
    np.testing.assert_allclose(
        report.achieved_max_load, max_load_ratio(counts / counts.sum(1, keepdims=True))
    )


def test_a_production_sized_sample_hits_the_target_closely():
    engine = engine_with(4, 16_384, 512, 10, 3, expert_shards=2)
    profile = fit_to_model(load_profile(None), engine.model)
    report = payloads.build_calibrated(engine, profile, seed=0, index=0).calibration
    np.testing.assert_allclose(report.achieved_max_load, report.target_max_load, rtol=0.08)
    np.testing.assert_allclose(report.achieved_shard_load, report.target_shard_load, rtol=0.02)
    assert "P(overflow)" in report.format() and report.format().count("\n") == 1 + 3


def test_calibration_that_misses_is_refused(monkeypatch):
    engine = engine_with(2, 512, 8, 2, 2)
    profile = zipf_profile(8, 2, (1.2, 1.2))
    uniform = np.full((2, 8), 1 / 8)
    real_tables = routing.expert_set_tables
    monkeypatch.setattr(
        routing, "expert_set_tables", lambda shares, k, rng: real_tables(uniform, k, rng)
    )
    with pytest.raises(
        calibration.CalibrationError,
        match=r"worst: layer \d max-load ratio 1\.\d+ vs target \d\.\d+",
    ):
        payloads.build_calibrated(engine, profile, seed=0, index=0)


def test_predicted_overflow_follows_the_buffer_factor():
    shares = zipf_shares(64, 0.5, 0)[None]  # hottest expert: 4.4x the mean
    loose = predict_overflow(shares, tokens=4096, real_fraction=1.0, top_k=4, factor=8.0)
    tight = predict_overflow(shares, tokens=4096, real_fraction=1.0, top_k=4, factor=1.0)
    dropless = predict_overflow(shares, tokens=4096, real_fraction=1.0, top_k=4, factor=-1)
    assert loose.overflow_probability[0] < 1e-6 and loose.drop_fraction[0] < 1e-6
    assert tight.overflow_probability[0] > 0.999 and tight.drop_fraction[0] > 0.05
    assert dropless.capacity == 4096 and dropless.drop_fraction[0] == 0


@pytest.mark.parametrize("layout", ["BTLK", "BLTK"])
def test_profile_extracted_from_a_dump_reproduces_its_loads_and_padding(layout, tmp_path):
    engine = engine_with(4, 512, 16, 4, 3)
    source = zipf_profile(16, 4, (0.8, 0.8, 0.8))
    layout_in = PackingLayout(4, 512, pad_rows=1, real_fraction=(0.5, 0.9))
    routed = payloads.build_micro_batch(
        engine, source, seed=0, index=0, layout=layout_in
    ).routed_experts
    dump = routed if layout == "BTLK" else np.ascontiguousarray(routed.transpose(0, 2, 1, 3))
    counts = routed_expert_counts(routed, 16)
    profile = profile_from_dump(dump, layout=layout, num_experts=16)
    np.testing.assert_allclose(profile.shares, counts / counts.sum(1, keepdims=True))
    assert profile.layout.pad_rows == 1 and not profile.synthetic
    assert 0.5 <= profile.layout.real_fraction[0] <= profile.layout.real_fraction[-1] <= 0.9


def test_profile_routing_command_writes_a_loadable_profile(tmp_path, capsys):
    routed = payloads.build_micro_batch(TINY, load_profile(None), seed=0, index=0).routed_experts
    np.save(tmp_path / "dump.npy", routed)
    out = tmp_path / "profile.json"
    assert (
        cli.main(
            ["profile-routing", str(tmp_path / "dump.npy"), "--num-experts", "8", "--out", str(out)]
        )
        == 0
    )
    profile = load_profile(str(out))
    assert (profile.num_experts, profile.top_k, profile.num_layers) == (8, 2, 2)
    assert "dump.npy" in profile.description
    assert cli.main(["profile-routing", str(tmp_path / "dump.npy"), "--num-experts", "4"]) == 2
    assert "the dump routes to expert 7; pass a count above 7" in capsys.readouterr().err


def _tiny_dump():
    return payloads.build_micro_batch(TINY, load_profile(None), seed=0, index=0).routed_experts


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: np.where(d == 3, -3, d).astype(d.dtype), "expert id -3 in the dump"),
        (lambda d: d[:0], "an axis is empty"),
        (lambda d: d[:, :, :, :0], "an axis is empty"),
        (lambda d: np.where(d == 3, 40000, d.astype(np.int32)), "expert id 40000"),
        (lambda d: d.astype(np.float32), "expected integer expert ids"),
        (lambda d: d[0], "expected 4 axes"),
    ],
)
def test_hostile_routing_dumps_are_one_line_errors(tmp_path, capsys, make, message):
    path = tmp_path / "dump.npy"
    np.save(path, make(_tiny_dump()))
    assert cli.main(["profile-routing", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_profile_naming_a_key_twice_is_refused(tmp_path):
    text = json.dumps(document(), indent=1)
    path = tmp_path / "twice.json"
    path.write_text(text.replace('"top_k": 2,', '"top_k": 2,\n "top_k": 1,', 1))
    with pytest.raises(ProfileError, match=r"twice.json: the key 'top_k' appears twice") as caught:
        load_profile(str(path))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("top_k", [2, 3, 4, 10])
@pytest.mark.parametrize("layout", ["BTLK", "BLTK"])
def test_a_token_routed_twice_to_one_expert_is_refused_naming_it(top_k, layout, tmp_path, capsys):
    """Row 1, token 5, layer 2 repeats expert 11 in its first and last slots; only a check that
    orders each token's slots sees a repeat that is not in neighbouring slots."""
    rng = np.random.default_rng(0)
    routed = np.argsort(rng.random((3, 8, 4, 16)), axis=-1)[..., :top_k].astype(np.int16)
    routed[1, 5, 2, :] = [11, *range(top_k - 2), 11] if top_k > 2 else [11, 11]
    routed[1, 6, 1, 0] = routed[1, 6, 1, -1]  # a later token repeats too: the first is named
    dump = routed if layout == "BTLK" else np.ascontiguousarray(routed.transpose(0, 2, 1, 3))
    np.save(tmp_path / "dump.npy", dump)
    out = tmp_path / "profile.json"
    argv = ["profile-routing", str(tmp_path / "dump.npy"), "--layout", layout, "--out", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "row 1, token 5, layer 2 routes to expert 11 twice" in err and err.count("\n") == 1
    assert not out.exists()
    routed[1, 5, 2, -1] = 15 if top_k > 2 else 12  # none of the token's other experts
    routed[1, 6, 1, 0] = -1  # an empty slot repeated is no repeat
    routed[1, 6, 1, 1:] = -1
    np.save(tmp_path / "dump.npy", routed if layout == "BTLK" else routed.transpose(0, 2, 1, 3))
    assert cli.main(argv) == 0


@pytest.mark.parametrize("kind", ["npz", "empty", "truncated", "text"])
def test_unreadable_routing_dumps_are_one_line_errors(tmp_path, capsys, kind):
    path = tmp_path / "dump.npy"
    if kind == "npz":
        with open(path, "wb") as out:
            np.savez(out, routed=_tiny_dump())
    elif kind == "truncated":
        np.save(path, _tiny_dump())
        path.write_bytes(path.read_bytes()[:200])
    else:
        path.write_bytes(b"" if kind == "empty" else b"routed experts, layer 0: 1 2 3\n")
    assert cli.main(["profile-routing", str(path), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "routing dump" in err and err.count("\n") == 1
    assert not (tmp_path / "p.json").exists()


def test_the_397b_cells_profile_is_fitted_to_the_published_zero_replays_and_says_so():
    """The measured run: 0 replays at factor 2.75 with 2 token chunks; the preset is that run's,
    and the profile's skew was chosen so that it forecasts no replay there (built-in buffer)."""
    from rl_trainer_bench.payload.replay_forecast import predicted_replay

    cell = preset("qwen3.5-397b-cell")
    profile = load_profile(None, cell.routing_profile)
    assert profile.synthetic and profile.description.startswith("FITTED to the measured run")
    assert profile.chosen_to_match.startswith(
        "the measured run's 0 replays at ragged_buffer_factor=2.75"
    )
    assert (cell.engine.moe.ragged_buffer_factor, cell.engine.moe.token_chunks) == (2.75, 2)
    measured = predicted_replay(profile, cell.engine)
    assert (measured.capacity, measured.tokens_per_group) == (
        440,
        8192,
    )  # ceil(2.75 x 8192 x 10 / 512)
    assert measured.probability < 0.001
    # the hottest expert as the published facts bound it: under 2.75x at every depth, with room
    # for the sampling spread of an 8,192-token group
    assert profile.max_load_ratio.min() > 1.4 and profile.max_load_ratio.max() < 2.2
    # the same routing at the former preset's single 1.25 buffer overflows every micro-batch
    former = dataclasses.replace(cell.engine, moe=MoeConfig(ragged_buffer_factor=1.25))
    assert predicted_replay(profile, former).probability > 0.999
    never = dataclasses.replace(cell.engine, moe=MoeConfig(retry_when_tokens_dropped=False))
    assert predicted_replay(profile, never) is None


def test_what_a_profile_was_chosen_to_match_survives_its_json_and_cannot_be_empty():
    shipped = load_profile(None, preset("qwen3.5-397b-cell").routing_profile)
    document = shipped.to_json()
    assert parse_profile(document).chosen_to_match == shipped.chosen_to_match != ""
    assert "chosen_to_match" not in load_profile(None).to_json()  # default.json matches nothing
    with pytest.raises(ProfileError, match="chosen_to_match"):
        parse_profile({**document, "chosen_to_match": ""})
