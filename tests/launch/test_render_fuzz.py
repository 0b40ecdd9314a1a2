"""Fuzz: any input text or knob value gives a valid bench or one clear error, never a traceback."""

from fuzz_support import FUZZ
from hypothesis import given
from hypothesis import strategies as st
from render_helpers import FIXTURE, load_manifest

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render
from rl_trainer_bench.launch.validate import jobset_problems

FIXTURE_TEXT = FIXTURE.read_text()
_TEXT = st.text(st.characters(exclude_characters="\0", exclude_categories=("Cs",)), max_size=40)
_KNOB_VALUES = st.fixed_dictionaries(
    {},
    optional={
        "steps": st.one_of(_TEXT, st.integers(-2, 50).map(str)),
        "micro_steps": st.integers(-2, 50).map(str),
        "max_restarts": st.integers(-2, 50).map(str),
        "profile_steps": st.sampled_from(["1", "2-4", "1,3", "x", "1-"]),
        "trainer_slice": st.sampled_from(
            ["v5p:2x2x2", "tpu7x:4x4x8", "v5e:2x4", "v9:1x1", "v5p:3"]
        ),
        "bench_name": st.from_regex(r"[a-z][a-z0-9-]{0,30}", fullmatch=True),
        "engine_flags": _TEXT,
        "driver_env": _TEXT,
        "libtpu_flags": _TEXT,
        "trainer_argv": _TEXT,
    },
)


def _render_or_error(text: str, knobs: dict) -> None:
    try:
        rendered = render(text, "fuzz.yaml", RenderKnobs.from_strings(knobs))
    except UserError as error:
        assert str(error) and "\n" not in str(error)
        return
    assert jobset_problems(load_manifest(rendered)) == []


@FUZZ
@given(_KNOB_VALUES)
def test_any_knob_values_give_a_valid_bench_or_one_clear_error(knobs):
    _render_or_error(FIXTURE_TEXT, knobs)


@FUZZ
@given(st.integers(0, len(FIXTURE_TEXT)), st.integers(0, 200), _TEXT)
def test_damaged_input_gives_a_valid_bench_or_one_clear_error(start, length, insert):
    _render_or_error(FIXTURE_TEXT[:start] + insert + FIXTURE_TEXT[start + length :], {})
