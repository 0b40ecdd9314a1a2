"""The resolved plan as a document: printed before launch, embedded in the render, checked in the pod.

What a team reads before it spends a slice (the render's summary, `plan BENCH.yaml`) must be true
of the pod, not of the host that rendered it. So the renderer resolves the pod's plan once, from
the environment the pod will get, and embeds it in the pod's code bundle (`PLAN_FILE`), with what
only the trainer's image can answer (its MaxText, Tunix, pathwaysutils) listed as checks the pod
makes. `plan BENCH.yaml` prints that document. The pod's first act is to resolve its plan again,
with the same code, from its own environment, and compare it line by line with the document (an
edited manifest, or a value the pod sees that the render did not, shows here); then it makes the
checks against its image. Either disagreement refuses the run in one line, before the runtime
starts; otherwise the plan it executes, with each check's finding, goes into its results
(`EXECUTED_FILE`) and its log. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from rl_trainer_bench.bench import maxtext_check
from rl_trainer_bench.bench.runtime import uses_pathways
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.factory import MAXTEXT
from rl_trainer_bench.engine.maxtext import tunix_grpo
from rl_trainer_bench.errors import ConfigError

PLAN_FILE = "resolved-plan.json"  # in the pod's code folder, beside the package
# Where the pod's script unpacks the embedded code (and the plan beside it).
CODE_DIR_VARIABLE = "BENCH_CODE_DIR"
EXECUTED_FILE = "plan.json"  # in RESULTS_DIR: the plan the pod executed
FORMAT = "rl-trainer-bench/resolved-plan/v1"
EXECUTED_FORMAT = "rl-trainer-bench/executed-plan/v1"
CHECKED_IN_POD = "checked in the pod"
# Set by `plan BENCH.yaml`, which runs the pod's code on another host: compare the plan with the
# document, but do not check this host as if it were the trainer's image.
OFF_POD_VARIABLE = "BENCH_PLAN_OFF_POD"

MAXTEXT_CHECK = "maxtext"
TUNIX_CHECK = "tunix"
PATHWAYS_CHECK = "pathwaysutils"


@dataclasses.dataclass(frozen=True)
class PodCheck:
    """Something only the trainer's image can answer, and what the plan expects of it."""

    name: str
    expect: str
    finding: str = ""  # what the pod found (empty until checked)

    def describe(self) -> str:
        found = f": {self.finding}" if self.finding else f" (expected: {self.expect})"
        return f"{CHECKED_IN_POD}: {self.name}{found}"


@dataclasses.dataclass(frozen=True)
class PlanDocument:
    """The plan's lines as printed, and the checks the pod makes against its image."""

    lines: tuple[str, ...]
    checks: tuple[PodCheck, ...] = ()
    # What the pod times in place of the trainer's program, one line each (`config-diff` lists them).
    substitutions: tuple[str, ...] = ()

    def printed(self, prefix: str) -> list[str]:
        """The lines, then one line per check (before the plan's last, `ok`, line)."""
        *body, last = self.lines
        return [*body, *(f"{prefix} {check.describe()}" for check in self.checks), last]

    def to_json(self) -> str:
        content = {
            "format": FORMAT,
            "lines": list(self.lines),
            "checks": [dataclasses.asdict(check) for check in self.checks],
            "substitutions": list(self.substitutions),
        }
        return json.dumps(content, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str) -> PlanDocument:
        """The document in `text`; ConfigError naming `source` when it is not one."""
        try:
            content = json.loads(text)
            if content.get("format") != FORMAT:
                raise ValueError(f"format {content.get('format')!r}, not {FORMAT!r}")
            return cls(
                tuple(str(line) for line in content["lines"]),
                tuple(PodCheck(**check) for check in content["checks"]),
                tuple(str(line) for line in content["substitutions"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ConfigError(
                f"{source}: not a resolved plan ({error}): render the JobSet again"
            ) from None


def pod_checks(engine: str, maxtext_driver: str, env: Mapping[str, str]) -> tuple[PodCheck, ...]:
    """What the pod must find in its image for the plan to hold."""
    checks = []
    if engine == MAXTEXT:
        checks.append(
            PodCheck(
                MAXTEXT_CHECK,
                "maxtext importable; its version, and its own validation of the config built"
                " from the trainer's keys",
            )
        )
        if maxtext_driver != tunix_grpo.MAXTEXT:
            checks.append(
                PodCheck(
                    TUNIX_CHECK,
                    "Tunix's TrainerWorker and GRPO loss importable (the loss line); without them"
                    " the pod refuses to start: MAXTEXT_DRIVER=maxtext times MaxText's own loss"
                    " instead",
                )
            )
    if uses_pathways(env):
        checks.append(PodCheck(PATHWAYS_CHECK, "pathwaysutils importable (the runtime line)"))
    return tuple(checks)


def document(
    lines: Sequence[str], checks: Sequence[PodCheck], substitutions: Sequence[str]
) -> PlanDocument:
    return PlanDocument(tuple(lines), tuple(checks), tuple(substitutions))


def with_lines(plan_lines: Sequence[str], more: Sequence[str]) -> list[str]:
    """The plan's lines with `more` (a same-pod A/B's) before its last, `ok`, line."""
    *body, last = plan_lines
    return [*body, *more, last]


def embedded(code_dir: str | None) -> PlanDocument | None:
    """The document the renderer put beside the pod's code, or None (a run that was not rendered)."""
    if not code_dir:
        return None
    path = Path(code_dir) / PLAN_FILE
    if not path.is_file():
        return None
    return PlanDocument.from_json(path.read_text(encoding="utf-8"), str(path))


def refuse_disagreement(planned: PlanDocument, lines: Sequence[str]) -> None:
    """ConfigError naming the first line where the pod's plan differs from the printed one."""
    if tuple(lines) == planned.lines:
        return
    pairs = zip(planned.lines, lines, strict=False)
    index = next(
        (i for i, (printed, pods) in enumerate(pairs) if printed != pods),
        min(len(planned.lines), len(lines)),
    )
    printed = planned.lines[index] if index < len(planned.lines) else "(no line)"
    pods = lines[index] if index < len(lines) else "(no line)"
    raise ConfigError(
        f"the pod's plan differs from the rendered plan at line {index + 1}: rendered {printed!r},"
        f" the pod's {pods!r} (the manifest was edited, or the pod's environment differs from"
        " the render's): render the JobSet again"
    )


def check_image(
    checks: Sequence[PodCheck], engine_config: EngineConfig, platform: str
) -> list[PodCheck]:
    """Each check made against this process's image; ConfigError at the first contradiction."""
    done = []
    for check in checks:
        if check.name == MAXTEXT_CHECK:
            finding = _maxtext(engine_config, platform)
        elif check.name == TUNIX_CHECK:
            finding = _tunix()
        elif check.name == PATHWAYS_CHECK:
            finding = _pathwaysutils()
        else:
            raise ConfigError(
                f"the rendered plan asks for a check this code does not know ({check.name}):"
                " render the JobSet again"
            )
        done.append(dataclasses.replace(check, finding=finding))
    return done


def _maxtext(engine_config: EngineConfig, platform: str) -> str:
    builder = maxtext_check.installed_builder()
    if builder is None:
        raise ConfigError(
            "the plan times MaxText's engine with the trainer's keys, but this image has no"
            " importable maxtext: run the trainer's image, or set ENGINE=builtin to time the"
            " built-in engine (another program)"
        )
    return maxtext_check.check_apart(engine_config, platform)  # ConfigError when refused


def _tunix() -> str:
    absent = tunix_grpo.tunix_absent()
    if absent is not None:
        raise ConfigError(
            f"the plan times Tunix's GRPO loss, but in this image {absent}: run the"
            " trainer's image, or set MAXTEXT_DRIVER=maxtext to time MaxText's own loss"
            " (another loss than the trainer's)"
        )
    spec = importlib.util.find_spec(tunix_grpo.TUNIX)
    where = next(iter(spec.submodule_search_locations)) if spec else "?"
    return f"Tunix's TrainerWorker and GRPO loss found at {where}"


def _pathwaysutils() -> str:
    spec = importlib.util.find_spec("pathwaysutils")
    if spec is None:
        raise ConfigError(
            "JAX_PLATFORMS asks for Pathways (proxy), but this image has no pathwaysutils: run"
            " the trainer's image"
        )
    return f"pathwaysutils found at {spec.origin}"


def executed(
    rendered: PlanDocument,
    lines: Sequence[str],
    engine_config: EngineConfig,
    config: BenchConfig,
    env: Mapping[str, str],
) -> PlanDocument:
    """The rendered plan as this pod executes it: its own plan (`lines`, resolved as the renderer
    resolved it) must be the printed one, and the image must pass each check (ConfigError
    otherwise). `plan BENCH.yaml` runs this on another host (OFF_POD_VARIABLE): it compares the
    lines there and leaves the checks to the pod."""
    refuse_disagreement(rendered, lines)
    if env.get(OFF_POD_VARIABLE):
        return rendered
    platform = "tpu" if config.trainer_slice is not None else "cpu"
    return dataclasses.replace(
        rendered, checks=tuple(check_image(rendered.checks, engine_config, platform))
    )


def executed_json(lines: Sequence[str]) -> str:
    """The plan a pod executed, as it printed it, for its results folder."""
    return json.dumps({"format": EXECUTED_FORMAT, "lines": list(lines)}, indent=1) + "\n"
