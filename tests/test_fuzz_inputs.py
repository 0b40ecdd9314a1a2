"""Property tests over the entry points: any bytes, any YAML or JSON, any argv words end in exit 0, 1
or 2 with a message, never a traceback, and never leave a half-written output file.

Inputs are drawn three ways per entry point: random bytes, random trees (and valid inputs with
random subtrees replaced), and random words added to the command line. Counts: `fuzz_support`.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from fuzz_support import (
    FUZZ,
    JSON_VALUES,
    assert_no_partial_output,
    mutate,
    run_command,
    write_tally,
)
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.payload.build import build_micro_batch
from rl_trainer_bench.payload.npz import save_npz
from rl_trainer_bench.payload.routing_profile import load_profile

TESTDATA = Path(__file__).parent / "testdata"
FIXTURE = TESTDATA / "launch_dryrun_fixture.yaml"
# What a shell can pass: no NUL, no lone surrogates (argv is bytes, decoded with surrogateescape).
ARGV_TEXT = st.text(st.characters(exclude_characters="\0", exclude_categories=("Cs",)), max_size=12)
WORDS = st.lists(
    st.one_of(
        st.sampled_from(["--json", "--summary-only", "--mesh", "--out", "--layout", "--", "-"]),
        ARGV_TEXT,
    ),
    max_size=3,
)


@pytest.fixture(scope="module", autouse=True)
def _record_counts():
    yield
    write_tally()


@contextlib.contextmanager
def _folder() -> Iterator[Path]:
    """A fresh folder for one example, removed after it (hypothesis runs many per test)."""
    with tempfile.TemporaryDirectory(prefix="rtb-fuzz-") as folder:
        yield Path(folder)


# ---- validate ---------------------------------------------------------------------------------

JOBSETS = [
    yaml.safe_load((TESTDATA / "jobset_unnamed_failure_rules.yaml").read_text()),
    *[
        doc
        for doc in yaml.safe_load_all(FIXTURE.read_text().split("---", 1)[1])
        if isinstance(doc, dict) and doc.get("kind") == "JobSet"
    ],
]


def _validate(folder: Path, contents: list[bytes], words: list[str]) -> None:
    files = []
    for index, data in enumerate(contents):
        path = folder / f"in{index}.yaml"
        path.write_bytes(data)
        files.append(str(path))
    run_command("validate", ["validate", *files, *words])


@FUZZ
@given(st.lists(st.binary(max_size=600), min_size=1, max_size=2), WORDS)
def test_validate_any_bytes(contents, words):
    with _folder() as folder:
        _validate(folder, contents, words)


YAML_SYNTAX = st.text(st.sampled_from("{}[]:&*!-|>?%@`'\" ,\n\tab01."), max_size=200)


@FUZZ
@given(YAML_SYNTAX)
def test_validate_any_yaml_syntax(text):
    with _folder() as folder:
        _validate(folder, [("kind: JobSet\n" + text).encode()], [])


@FUZZ
@given(st.data())
def test_validate_any_tree_and_damaged_jobsets(data):
    base = data.draw(st.sampled_from(JOBSETS))
    tree = mutate(base, data) if data.draw(st.booleans()) else data.draw(JSON_VALUES)
    dump = data.draw(st.sampled_from([yaml.safe_dump, json.dumps]))
    with _folder() as folder:
        _validate(folder, [dump(tree).encode()], [])


# ---- render -----------------------------------------------------------------------------------

LAUNCH_DOCUMENTS = [
    doc for doc in yaml.safe_load_all(FIXTURE.read_text().split("---", 1)[1]) if doc is not None
]


def _render(folder: Path, data: bytes, words: list[str]) -> None:
    source = folder / "dryrun.txt"
    source.write_bytes(data)
    argv = ["render", "--launch-render", str(source), "--output", str(folder / "bench.yaml")]
    code = run_command("render", [*argv, *words])
    assert_no_partial_output(folder, {"dryrun.txt"}, "bench.yaml", code)


@FUZZ
@given(st.binary(max_size=2000), WORDS)
def test_render_any_bytes(data, words):
    with _folder() as folder:
        _render(folder, data, words)


@FUZZ
@given(st.data())
def test_render_damaged_launch_output(data):
    documents = mutate(LAUNCH_DOCUMENTS, data, edits=2)
    text = yaml.safe_dump_all(documents if isinstance(documents, list) else [documents])
    words = data.draw(
        st.lists(
            st.sampled_from(["--steps", "--micro-steps", "--trainer-slice", "--name", "3", "x"]),
            max_size=2,
        )
    )
    with _folder() as folder:
        _render(folder, text.encode(), words)


# ---- hlo-overlap ------------------------------------------------------------------------------

HLO_TEXTS = [p.read_text() for p in sorted(TESTDATA.glob("*.hlo"))]


def _hlo(folder: Path, data: bytes, words: list[str]) -> None:
    path = folder / "module.hlo"
    path.write_bytes(data)
    run_command("hlo-overlap", ["hlo-overlap", str(path), *words])


@FUZZ
@given(st.binary(max_size=2000), WORDS)
def test_hlo_overlap_any_bytes(data, words):
    with _folder() as folder:
        _hlo(folder, data, words)


@FUZZ
@given(st.data())
def test_hlo_overlap_damaged_modules(data):
    text = data.draw(st.sampled_from(HLO_TEXTS))
    for _ in range(data.draw(st.integers(1, 3))):
        start = data.draw(st.integers(0, len(text)))
        length = data.draw(st.integers(0, 80))
        insert = data.draw(
            st.text(alphabet=st.sampled_from('%{}()[],=: \n"/*abfu0123456789<>T-'), max_size=20)
        )
        text = text[:start] + insert + text[start + length :]
    mesh = data.draw(
        st.sampled_from([[], ["--mesh", "fsdp=2,context=2,expert=2"], ["--mesh", "a=3"]])
    )
    with _folder() as folder:
        _hlo(folder, text.encode(), [*mesh, *data.draw(st.sampled_from([[], ["--json"]]))])


# ---- check --payload --------------------------------------------------------------------------

TINY = preset("cpu-tiny").engine
BUILT = build_micro_batch(TINY, load_profile(None), seed=3, index=0)
ARRAYS = hnp.arrays(
    dtype=st.sampled_from([np.int32, np.int16, np.float32, np.int64, np.uint8, np.bool_]),
    shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=5),
)


def _check(folder: Path, data: bytes, words: list[str]) -> None:
    path = folder / "mb.npz"
    path.write_bytes(data)
    argv = ["check", "--preset", "cpu-tiny", "--payload", str(path), "--skip-numerics"]
    run_command("check --payload", [*argv, *words])


@FUZZ
@given(st.binary(max_size=2000), WORDS)
def test_check_payload_any_bytes(data, words):
    with _folder() as folder:
        _check(folder, data, words)


@FUZZ
@given(st.data())
def test_check_payload_damaged_files(data):
    arrays = {**BUILT.arrays()}
    digests = np.array([f"{k}={v}" for k, v in sorted(BUILT.digests.items())])
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from([*arrays, "digests", "name"]))
        action = data.draw(st.sampled_from(["drop", "replace", "edit"]))
        if name == "digests":
            digests = data.draw(
                st.one_of(ARRAYS, st.lists(st.text(max_size=40), max_size=4).map(np.array))
            )
        elif action == "drop":
            arrays.pop(name, None)
        elif action == "replace" or name not in arrays:
            arrays[name] = data.draw(ARRAYS)
        else:
            edited = arrays[name].copy()
            flat = edited.reshape(-1)
            if flat.size:
                value = np.array(data.draw(st.integers(-5, 300))).astype(edited.dtype)
                flat[data.draw(st.integers(0, flat.size - 1))] = value
            arrays[name] = edited
    written = io.BytesIO()
    np.savez(written, **arrays, digests=digests)
    blob = written.getvalue()
    if data.draw(st.integers(0, 4)) == 0:
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    with _folder() as folder:
        _check(folder, blob, [])


def test_an_untouched_payload_passes_the_fuzz_harness():
    with _folder() as folder:
        save_npz(BUILT, str(folder / "good.npz"))
        _check(folder, (folder / "good.npz").read_bytes(), [])


# ---- profile-routing --------------------------------------------------------------------------


def _profile(folder: Path, data: bytes, words: list[str]) -> None:
    (folder / "dump.npy").write_bytes(data)
    argv = ["profile-routing", str(folder / "dump.npy"), "--out", str(folder / "profile.json")]
    code = run_command("profile-routing", [*argv, *words])
    assert_no_partial_output(folder, {"dump.npy"}, "profile.json", code)


@FUZZ
@given(st.binary(max_size=1000), WORDS)
def test_profile_routing_any_bytes(data, words):
    with _folder() as folder:
        _profile(folder, data, words)


# Mostly dumps of the right form ([B, T, L, K] int, ids -1..E) so that some are accepted and the
# profile is built; the rest have any rank, dtype or id.
_ANY_DUMPS = st.tuples(
    hnp.arrays(
        dtype=np.int64,
        shape=hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=6),
        elements=st.integers(-4, 40),
    ),
    st.sampled_from([np.int16, np.int32, np.int64, np.uint8, np.float32, np.bool_]),
).map(lambda pair: pair[0].astype(pair[1]))
_FORMED_DUMPS = hnp.arrays(
    dtype=st.sampled_from([np.int16, np.int32]),
    shape=hnp.array_shapes(min_dims=4, max_dims=4, min_side=1, max_side=5),
    elements=st.integers(-1, 9),
)
DUMPS = st.one_of(_FORMED_DUMPS, _ANY_DUMPS)


@FUZZ
@given(DUMPS, st.data())
def test_profile_routing_any_array(dump, data):
    written = io.BytesIO()
    np.save(written, dump)
    blob = written.getvalue()
    words = data.draw(
        st.lists(
            st.sampled_from(["--layout", "BLTK", "BTLK", "--num-experts", "0", "8", "-1", "99999"]),
            max_size=3,
        )
    )
    with _folder() as folder:
        _profile(folder, blob, words)
