"""Render knobs: one table of names, validated once into `RenderKnobs`.

`render_bench.sh` reads each knob from its environment variable, `render_bench.py` and
`rl-trainer-bench render` from the flag spelled in lower case with dashes; both go through
`RenderKnobs.from_strings`, so a value means the same thing whichever way it arrives, and a bad
one is refused before any input is read. The knobs the renderer passes through to the pod are the
rows of the driver's own table that say so (`rl_trainer_bench.config.knobs.KNOBS`, surface
`render`): their flags, help, parser, typed value, the text the pod gets (the row's formatter) and
the names DRIVER_ENV may not set all come from those rows, so whatever the renderer accepts, the
pod's driver accepts with the same meaning, and a knob the renderer passes through is one row.
This module imports no YAML, schema or JAX, so building the command line stays cheap.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from rl_trainer_bench.config import values
from rl_trainer_bench.config.knobs import DRIVER_KNOBS, RENDER, knobs_of, refuse_misspelt_knobs
from rl_trainer_bench.config.trainer_env import TRAINER_ENV_VARIABLE
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.pod_script import AB_ARMS, CODE_DIR_VARIABLE

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The same-pod A/B's design knobs: exported to its pod as they are named (`ab/same_pod.py`).
AB_DESIGN_KNOBS = (
    "AB_BUDGET",
    "AB_STEP_TIME",
    "AB_STEP_NOISE",
    "AB_AOT_REPORT",
    "AB_SCHEDULE_SEED",
    "AB_STOP",
    "AB_EXPECT_EFFECT",
)
# The driver's knobs the renderer passes through to the pod, as their rows say.
PASS_THROUGH = knobs_of(RENDER)


@dataclasses.dataclass(frozen=True)
class RenderKnob:
    """One render knob: `render_bench.sh` reads ENV, `render_bench.py` and `render` take --flag."""

    env: str
    help: str = ""  # empty for a pass-through knob: the driver's row says it

    @property
    def flag(self) -> str:
        return "--" + self.env.lower().replace("_", "-")

    @property
    def dest(self) -> str:
        return self.env.lower()

    @property
    def description(self) -> str:
        if self.help:
            return self.help
        knob = DRIVER_KNOBS[self.env]
        return f"passed to the pod's driver: {knob.help}{knob.default_note(RENDER)}"


RENDER_KNOBS: tuple[RenderKnob, ...] = (
    RenderKnob(
        "LAUNCH_RENDER", "the launcher's DRY_RUN output (a file, or - for stdin; default -)"
    ),
    RenderKnob(
        "TRAINER_JOBSET", "the trainer JobSet's name, when the input holds several candidates"
    ),
    # Not NAME: a generic variable that shells and CI often set already.
    RenderKnob(
        "BENCH_NAME",
        "the bench JobSet's name (default: the trainer's + '-bench', shortened to fit)",
    ),
    RenderKnob(
        "LIBTPU_FLAGS",
        "--flag=value words for every container that compiles, set in every place each reads"
        " them: the client's LIBTPU_INIT_ARGS, the Pathways proxy's and workers' arguments, and"
        " the LIBTPU_INIT_ARGS in any of their env (given ones win); a value that starts with"
        " '--' may follow the flag as its own word",
    ),
    *(RenderKnob(name) for name in PASS_THROUGH),
    RenderKnob("MAX_RESTARTS", "the bench JobSet's failurePolicy.maxRestarts (default 0)"),
    RenderKnob(
        "AB_ARMS",
        "a same-pod A/B: the arms the pod runs in one process, as `ab --arms` (e.g."
        " off,on or 'base:ragged_buffer_factor=1.25,wide:ragged_buffer_factor=2'); default:"
        " the pod runs the bench once",
    ),
    RenderKnob(
        "AB_BUDGET",
        "what the same-pod A/B may spend, as `ab --budget`: scored steps per setting (e.g. 12) or"
        " pod minutes (e.g. 45min); default: 8 scored steps per setting on an accelerator",
    ),
    RenderKnob(
        "AB_SCHEDULE_SEED",
        "the seed of the same-pod A/B's turns, as `ab --schedule-seed`; default: drawn from the"
        " render's own inputs, so the run order the render and `plan` print is the pod's, and"
        " rendering again gives the same manifest (set another seed for another order)",
    ),
    RenderKnob(
        "AB_STOP",
        "whether the same-pod A/B stops at the first look whose verdict is settled (settled, the"
        " default on a slice) or runs its whole budget (budget), as `ab --stop`",
    ),
    RenderKnob(
        "AB_EXPECT_EFFECT",
        "effects, percent of the step (e.g. 7.2 or 1,7.2), at which the render and `plan` forecast"
        " the same-pod A/B's expected steps and pod time, as `ab --expect-effect` (default: the"
        " min effect)",
    ),
    RenderKnob(
        "AB_STEP_TIME",
        "the step time the A/B's pod time is reckoned from, as `ab --step-time`: seconds, a prior"
        " run's pod log or results.jsonl, or aot's JSON report (read here; the pod gets the figure)",
    ),
    RenderKnob(
        "AB_STEP_NOISE",
        "the step noise the A/B's smallest resolvable effect is reckoned at, as `ab --step-noise`:"
        " a percent, or a prior run's pod log or results.jsonl (default: AB_STEP_TIME's prior run,"
        " else assumed and said so)",
    ),
    RenderKnob(
        "AB_AOT_REPORT",
        "`aot --ab-arms AB_ARMS --output FILE`'s report: the A/B's device peak for `plan` and the"
        " summary, and the A/B refused here when that report refuses it (read here)",
    ),
    RenderKnob("DRIVER_ENV", "K=V shell words passed to the driver's environment, literally"),
    RenderKnob("OUTPUT", "where to write the bench JobSet (default: stdout)"),
    RenderKnob(
        "AOT_JOB",
        "also write here a JobSet that runs `aot` and `hlo-overlap` for the trainer's slice in the"
        " trainer's image on a CPU node, with the bench's knobs (default: none)",
    ),
    RenderKnob(
        "AOT_NODE_SELECTOR",
        "node labels of the CPU node pool the AOT job runs on, key=value shell words (default:"
        " node.kubernetes.io/instance-type=n2-standard-16)",
    ),
)
# Variables the renderer itself sets; DRIVER_ENV may not set them behind a knob's back.
_RESERVED_ENV = frozenset(
    {
        "BENCH_CODE_SHA256",
        "PYTHONPATH",
        CODE_DIR_VARIABLE,
        "LIBTPU_INIT_ARGS",
        TRAINER_ENV_VARIABLE,
        AB_ARMS,
        *AB_DESIGN_KNOBS,
        *PASS_THROUGH,
    }
)


@dataclasses.dataclass(frozen=True)
class RenderKnobs:
    """Validated render knobs; `None` means 'keep the trainer's' or 'let the driver default'."""

    launch_render: str = "-"
    trainer_jobset: str | None = None
    name: str | None = None
    libtpu_flags: str = ""
    # (driver knob, its value as the driver's row parses it) of each pass-through knob given, in
    # the table's order: `passed` reads one, `driver_environment` writes them for the pod.
    pass_through: tuple[tuple[str, Any], ...] = ()
    max_restarts: int = 0
    ab_arms: str | None = None  # the arms of a same-pod A/B (`ab --arms`); None: one bench run
    ab_design: tuple[tuple[str, str], ...] = ()  # (AB_BUDGET ..., text) given for its design
    driver_env: tuple[tuple[str, str], ...] = ()
    output: str | None = None
    aot_job: str | None = None  # where to write the AOT JobSet; None: not rendered
    aot_node_selector: tuple[tuple[str, str], ...] = ()  # (): the AOT job's default pool

    def passed(self, knob: str) -> Any:
        """Pass-through knob `knob`'s value; None when not given ('keep the trainer's', or
        'let the driver default')."""
        return dict(self.pass_through).get(knob)

    @classmethod
    def from_strings(cls, strings: Mapping[str, str | None]) -> RenderKnobs:
        """Knobs from their string forms (flags or environment), keyed by lower-case knob name."""
        unknown = sorted(set(strings) - {knob.dest for knob in RENDER_KNOBS})
        if unknown:
            raise UserError(f"unknown knob {unknown[0]}: known knobs are {_knob_list()}")
        given = {key: value for key, value in strings.items() if value not in (None, "")}
        for knob in RENDER_KNOBS:  # the pod's script and environment cannot carry a NUL byte
            values.shell_writable(knob.env, given.get(knob.dest, ""))
        return cls(
            launch_render=given.get("launch_render", "-"),
            trainer_jobset=given.get("trainer_jobset"),
            name=given.get("bench_name"),
            libtpu_flags=given.get("libtpu_flags", ""),
            pass_through=tuple(
                (name, DRIVER_KNOBS[name].read({name: given[name.lower()]}))
                for name in PASS_THROUGH
                if name.lower() in given
            ),
            max_restarts=values.whole_number("MAX_RESTARTS", given.get("max_restarts", "0"), 0),
            ab_arms=given.get("ab_arms"),
            ab_design=_ab_design(given),
            driver_env=_driver_env(given.get("driver_env", "")),
            output=given.get("output"),
            aot_job=given.get("aot_job"),
            aot_node_selector=_node_selector(given.get("aot_node_selector", "")),
        )


def _ab_design(given: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The A/B design knobs given; they size a same-pod A/B, so one without AB_ARMS is refused."""
    design = tuple((name, given[name.lower()]) for name in AB_DESIGN_KNOBS if name.lower() in given)
    if design and "ab_arms" not in given:
        raise UserError(f"{design[0][0]} sizes a same-pod A/B: set AB_ARMS too, or drop it")
    return design


def _knob_list() -> str:
    return ", ".join(knob.env for knob in RENDER_KNOBS)


def _pairs(text: str, knob: str, key_pattern: re.Pattern, key_kind: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for word in values.shell_words(knob, text):
        key, equals, value = word.partition("=")
        if not equals or not key_pattern.match(key):
            raise UserError(f"{knob}: {word!r} is not {key_kind}=VALUE; write each entry as K=V")
        pairs.pop(key, None)  # the last occurrence wins and takes the last place
        pairs[key] = value
    return pairs


# A node label: an optional DNS-subdomain prefix and '/', then a name of up to 63 characters; its
# value up to 63 characters of the same kind, or empty (Kubernetes' label syntax).
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def _node_selector(text: str) -> tuple[tuple[str, str], ...]:
    pairs = _pairs(text, "AOT_NODE_SELECTOR", _LABEL_KEY, "a node label key")
    for key, value in pairs.items():
        if len(key.rpartition("/")[0]) > 253 or not _LABEL_VALUE.match(value):
            raise UserError(
                f"AOT_NODE_SELECTOR: {key}={value!r} is not a node label (a value is at most 63"
                " letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
            )
    return tuple(pairs.items())


def _driver_env(text: str) -> tuple[tuple[str, str], ...]:
    pairs = _pairs(text, "DRIVER_ENV", _ENV_NAME, "an environment variable NAME")
    refuse_misspelt_knobs(pairs, "DRIVER_ENV")
    for key in pairs:
        if key in _RESERVED_ENV:
            raise UserError(
                f"DRIVER_ENV sets {key}, which the renderer sets itself; use its own knob "
                f"({_reserved_hint(key)})"
            )
    return tuple(pairs.items())


def _reserved_hint(key: str) -> str:
    knob = {"LIBTPU_INIT_ARGS": "LIBTPU_FLAGS"}.get(key, key)
    if any(k.env == knob for k in RENDER_KNOBS):
        return knob
    return "it is fixed by the renderer"


def add_arguments(parser) -> None:
    for knob in RENDER_KNOBS:
        aliases = ["--name"] if knob.env == "BENCH_NAME" else []
        parser.add_argument(
            knob.flag, *aliases, dest=knob.dest, metavar=knob.env, help=knob.description
        )
