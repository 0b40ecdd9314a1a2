"""Launch render ──► bench JobSet: the trainer's JobSet with only its names, restarts and command changed.

Users hold the full RL run's manifests (their launcher's DRY_RUN output) and want the bench to run
on a trainer slice with exactly the trainer's scheduling, containers and flags. So the renderer
copies the trainer JobSet and changes only: the JobSet name (and every reference to it, or the
bench's affinity would wait for the trainer's pods forever), `failurePolicy.maxRestarts`, the
client container's command (the embedded bench driver with the trainer's environment and flags),
a provenance annotation, and, when asked, the slice. `render-diff` proves nothing else moved.
Every knob is validated here, once, into `RenderKnobs`; the result is validated before it is written.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from rl_trainer_bench import code_digest
from rl_trainer_bench.bench import plan, plan_document
from rl_trainer_bench.bench.plan import Plan
from rl_trainer_bench.chips.accelerators import TPU_CHIPS, TpuSlice
from rl_trainer_bench.config.engine_keys import CommandLine
from rl_trainer_bench.config.knobs import DRIVER_KNOBS, refuse_misspelt_knobs
from rl_trainer_bench.config.presets import MODEL_FLAGS
from rl_trainer_bench.config.trainer_env import OFF_THE_STEP, PLUMBING, TRAINER_ENV_VARIABLE
from rl_trainer_bench.engine.factory import BUILT_IN, MAXTEXT
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import check_output_file, read_user_text, write_text_atomically
from rl_trainer_bench.launch import (
    apply_size,
    code_bundle,
    compile_flags,
    results_location,
    validate,
)
from rl_trainer_bench.launch.client_command import (
    ClientCommand,
    merge_flags,
    read_client_command,
    trainer_command_words,
)
from rl_trainer_bench.launch.compile_flags import CompilingContainer
from rl_trainer_bench.launch.dry_run import (
    TPU_RESOURCE,
    asks_for_tpus,
    client_container,
    client_location,
    containers,
    find_trainer,
    is_pathways_container,
    jobset_name,
    jobsets,
    literal_env,
    pod_spec,
    read_documents,
    replicated_jobs,
)
from rl_trainer_bench.launch.knobs import PASS_THROUGH, RENDER_KNOBS, RenderKnobs
from rl_trainer_bench.launch.names import bench_name, rename_text
from rl_trainer_bench.launch.pod_script import AB_ARMS, SCRIPT_NAME, bench_script

ANNOTATION_PREFIX = "rl-trainer-bench/"
CODE_SHA_ANNOTATION = ANNOTATION_PREFIX + "code-sha256"
AB_SCHEDULE_SEED = "AB_SCHEDULE_SEED"  # the same-pod A/B's `--schedule-seed` (`ab/same_pod.py`)
# The sha256 of the resolved plan embedded beside the code (`bench/plan_document.py`).
PLAN_SHA_ANNOTATION = ANNOTATION_PREFIX + "plan-sha256"
TRAINER_ANNOTATION = ANNOTATION_PREFIX + "trainer-jobset"
SLICE_ANNOTATION = ANNOTATION_PREFIX + "slice"
# The LIBTPU_FLAGS words set in the compiling containers (arguments and LIBTPU_INIT_ARGS), so
# render-diff can tell them apart.
LIBTPU_FLAGS_ANNOTATION = ANNOTATION_PREFIX + "libtpu-flags"


# ----------------------------------------------------------------------------------------------
# The transformation
# ----------------------------------------------------------------------------------------------


class SamePodAb(Protocol):
    """A same-pod A/B planned once (`ab/render_command.plan_for_render`), from the pod's
    environment and its resolved plan: what the render prints of it, and the program sets the AOT
    job compiles."""

    @property
    def lines(self) -> Sequence[str]:
        """What the pod's A/B will do: its arms, order, design, memory."""

    @property
    def program_sets(self) -> Sequence[tuple[Sequence[str], Mapping[str, str]]]:
        """(the settings that compile it, its knobs) of each distinct program set of its arms."""


# The same-pod A/B's own planning of a pod's environment and plan
# (`ab/render_command.plan_for_render`), or UserError. The `render` command passes it in; this
# room cannot import the A/B's.
AbPlanner = Callable[[Mapping[str, str], Plan], SamePodAb]


def render(text: str, source: str, knobs: RenderKnobs, plan_ab: AbPlanner | None = None) -> str:
    """The bench JobSet's YAML for a launch render; validated, or UserError."""
    return render_with_plan(text, source, knobs, plan_ab).yaml


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A render: the bench JobSet's YAML, the plan its pod's driver resolves from the same
    environment, and the libtpu flags of the compiling containers, the trainer's and the bench's."""

    yaml: str
    plan: Plan
    trainer_flags: tuple[CompilingContainer, ...]
    bench_flags: tuple[CompilingContainer, ...]
    ab: SamePodAb | None = None  # the same-pod A/B (AB_ARMS), planned once
    results_source: str = ""  # what chose RESULTS_URI ("": nothing; results stay in the pod)
    # The orchestrator's environment (its container's literal `env`, then its script's).
    orchestrator_env: tuple[tuple[str, str], ...] = ()
    preemption: str = ""  # what a preemption of the client's pod keeps of the results
    # The plan embedded in the pod's code bundle: what `plan BENCH.yaml` prints, the pod checks.
    document: plan_document.PlanDocument | None = None

    @property
    def ab_lines(self) -> tuple[str, ...]:
        """What a same-pod A/B (AB_ARMS) will do; () without one."""
        return () if self.ab is None else tuple(self.ab.lines)

    @functools.cached_property
    def jobset(self) -> dict:
        """The bench JobSet read back from `yaml`, once for all that read it (its name, its size
        once `kubectl apply` stores it, the AOT job's exports): its code's base64 is most of the
        text, which PyYAML's own scanner reads a character at a time, libyaml's many times
        faster. Both read this text, which the renderer wrote, to the same document."""
        return yaml.load(self.yaml, Loader=_OWN_TEXT_LOADER)


# libyaml's parser where PyYAML was built with it (the wheels are), else PyYAML's own.
_OWN_TEXT_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def render_with_plan(
    text: str, source: str, knobs: RenderKnobs, plan_ab: AbPlanner | None = None
) -> Rendered:
    """Render the bench JobSet of a launch render, with its plan and its containers' flags."""
    documents = read_documents(text, source)
    trainer = find_trainer(documents, source, knobs.trainer_jobset)
    _check_trainer(trainer, source)
    launch = read_client_command(command_words(client_container(trainer)))
    bench = copy.deepcopy(trainer)
    new_name = bench_name(trainer, knobs.name)
    rename_references(bench, jobset_name(trainer), new_name)
    spec = bench.setdefault("spec", {})
    spec["failurePolicy"] = {**(spec.get("failurePolicy") or {}), "maxRestarts": knobs.max_restarts}
    if knobs.passed("TRAINER_SLICE") is not None:
        apply_slice(bench, knobs.passed("TRAINER_SLICE"))
    libtpu_words = compile_flags.knob_words(knobs.libtpu_flags)
    compile_flags.apply_everywhere(bench, libtpu_words)
    same_pod_ab = knobs.ab_arms is not None
    container = client_container(bench)
    inherited = literal_env(client_container(trainer)).get(compile_flags.ENV_NAME, "")
    orch_argv = _orchestrator_argv(documents, launch)
    environment = driver_environment(launch, knobs, orch_argv, "", jobset_slice(trainer), inherited)
    environment[TRAINER_ENV_VARIABLE] = " ".join(
        dict.fromkeys([*literal_env(container), *launch.env])
    )
    if same_pod_ab:
        _add_same_pod_ab(environment, knobs)
    results_source, pod_plan = _placed(environment, trainer, launch, knobs, container, new_name)
    # The code embedded is the closure of the engine the pod's plan resolves from these knobs.
    engine = pod_plan.config.engine
    sha = code_digest.code_sha256(engine=engine, same_pod_ab=same_pod_ab)
    environment["BENCH_CODE_SHA256"] = sha
    pod_env = pod_environment(container, environment)
    ab = _same_pod_ab(pod_env, pod_plan, plan_ab)
    resolved = _resolved_plan(pod_plan, pod_env, libtpu_words, knobs.ab_arms, ab)
    resolved_json = resolved.to_json()
    _replace_client_command(
        container, launch, environment, engine, jobset_name(trainer), resolved_json
    )
    metadata = bench.setdefault("metadata", {})
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        **_provenance(sha, resolved_json, jobset_name(trainer), knobs, libtpu_words),
    }
    validate.check(bench, f"bench rendered from {source}")
    names = frozenset(compile_flags.flag_name(word) for word in libtpu_words)
    return Rendered(
        dump_yaml(bench),
        pod_plan,
        tuple(compile_flags.compiling_containers(trainer, launch.env, names)),
        tuple(compile_flags.compiling_containers(bench, environment, names)),
        ab,
        results_source,
        _orchestrator_environment(documents, launch),
        results_location.preemption_line(
            pod_spec(replicated_jobs(bench)[client_location(bench).job_index])
        ),
        resolved,
    )


def _provenance(
    sha: str, resolved_json: str, trainer: str, knobs: RenderKnobs, libtpu_words: list[str]
) -> dict[str, str]:
    """The bench's annotations: its code's and plan's digests, the trainer it came from, and
    what the render changed in the slice and the libtpu flags (render-diff reads them)."""
    return {
        CODE_SHA_ANNOTATION: sha,
        PLAN_SHA_ANNOTATION: hashlib.sha256(resolved_json.encode()).hexdigest(),
        TRAINER_ANNOTATION: trainer,
        **(
            {SLICE_ANNOTATION: tpu_slice.name}
            if (tpu_slice := knobs.passed("TRAINER_SLICE"))
            else {}
        ),
        **({LIBTPU_FLAGS_ANNOTATION: shlex.join(libtpu_words)} if libtpu_words else {}),
    }


def _resolved_plan(
    pod_plan: Plan,
    pod_env: Mapping[str, str],
    libtpu_words: list[str],
    ab_arms: str | None,
    ab: SamePodAb | None,
) -> plan_document.PlanDocument:
    """The plan embedded beside the pod's code: the lines `plan BENCH.yaml` prints and the pod
    compares its own with, what the pod checks in its image, and what it substitutes."""
    libtpu = shlex.join(libtpu_words)
    ab_lines = () if ab is None else tuple(ab.lines)
    return plan_document.document(
        plan_document.with_lines(
            pod_plan.lines(same_pod_ab=bool(ab_lines)),
            [f"{plan.PLAN_PREFIX} {x}" for x in ab_lines],
        ),
        plan_document.pod_checks(pod_plan.config.engine, pod_plan.config.maxtext_driver, pod_env),
        [
            *pod_plan.substitutions(),
            *(
                [f"libtpu flags set by the bench in every compiling container: {libtpu}"]
                if libtpu
                else []
            ),
            *(f"same-pod A/B (AB_ARMS={ab_arms}): {line}" for line in ab_lines),
        ],
    )


def _add_same_pod_ab(environment: dict[str, str], knobs: RenderKnobs) -> None:
    """AB_ARMS and the A/B's design knobs; the seed of its turns, unless given, drawn from the
    render's own inputs, so the run order the render and `plan` print is the one the pod runs
    (the pod's plan must equal the printed one) and rendering twice gives the same manifest."""
    environment[AB_ARMS] = knobs.ab_arms
    environment.update(knobs.ab_design)
    if AB_SCHEDULE_SEED not in environment:
        inputs = json.dumps(sorted(environment.items())).encode()
        environment[AB_SCHEDULE_SEED] = str(int.from_bytes(hashlib.sha256(inputs).digest()[:4]))


def _orchestrator_environment(
    documents: list[dict], launch: ClientCommand
) -> tuple[tuple[str, str], ...]:
    found = orchestrator_command(documents, launch)
    if found is None:
        return ()
    command, container = found
    return tuple({**literal_env(container), **command.env}.items())


def _placed(
    environment: dict[str, str],
    trainer: Mapping,
    launch: ClientCommand,
    knobs: RenderKnobs,
    container: Mapping,
    bench: str,
) -> tuple[str, Plan]:
    """The results' place (`_place_results`) and the pod's plan (`_pod_plan`), from the launch's
    trainer command read once: its output folder, and the pod's TRAINER_ARGV where no knob
    replaces it."""
    trainer_line = CommandLine(trainer_command_words(launch))
    results_source = _place_results(environment, trainer, trainer_line, bench)
    given = {} if knobs.passed("TRAINER_ARGV") is not None else {"trainer_argv": trainer_line}
    return results_source, _pod_plan(environment, pod_environment(container, environment), given)


def _place_results(
    environment: dict[str, str], trainer: Mapping, trainer_line: CommandLine, bench: str
) -> str:
    """Set RESULTS_URI under the trainer's durable output folder unless a knob set it; what chose
    it, for the summary ("" when nothing did: the results stay on the pod's disk). UserError for
    a knob's local path that no durable volume of the client container holds."""
    where = client_location(trainer)
    job = replicated_jobs(trainer)[where.job_index]
    container, volumes = containers(job)[where.container_index], pod_spec(job).get("volumes") or []
    if "RESULTS_URI" in environment:
        results_location.check_durable(environment["RESULTS_URI"], container, volumes)
        return "the RESULTS_URI knob"
    found = results_location.trainer_output(trainer_line, container, volumes)
    if found is None:
        return ""
    location, source = found
    environment["RESULTS_URI"] = results_location.results_uri(location, bench)
    return source


def trainer_output(trainer: Mapping, launch: ClientCommand) -> tuple[str, str] | None:
    """(location, what named it) of the trainer's durable output folder, or None."""
    where = client_location(trainer)
    job = replicated_jobs(trainer)[where.job_index]
    return results_location.trainer_output(
        CommandLine(trainer_command_words(launch)),
        containers(job)[where.container_index],
        pod_spec(job).get("volumes") or [],
    )


def _same_pod_ab(
    pod_env: Mapping[str, str], pod_plan: Plan, plan_ab: AbPlanner | None
) -> SamePodAb | None:
    """The same-pod A/B planned from the pod's environment, once, when AB_ARMS asks for one."""
    if AB_ARMS not in pod_env:
        return None
    if plan_ab is None:
        raise RuntimeError("AB_ARMS given but no same-pod A/B planner: pass plan_ab to render")
    try:
        return plan_ab(pod_env, pod_plan)
    except UserError as error:
        raise UserError(f"the bench pod's A/B would refuse its knobs: {error}") from None


def _replace_client_command(
    container: dict,
    launch: ClientCommand,
    environment: Mapping[str, str],
    engine: str,
    trainer: str,
    resolved_plan: str,
) -> None:
    """The client runs the embedded bench driver under the launcher's PID-1 wrapper; the resolved
    plan rides in the code bundle."""
    container.pop("args", None)
    container["command"] = [
        "bash",
        "-c",
        bench_script(
            interpreter=launch.program[0],
            environment=environment,
            has_driver_script=(code_digest.default_root() / code_digest.DRIVER_SCRIPT).is_file(),
            trainer_jobset=trainer,
        ),
        SCRIPT_NAME,
        *code_bundle.bundle_parts(
            engine=engine, same_pod_ab=AB_ARMS in environment, resolved_plan=resolved_plan
        ),
    ]


def pod_environment(container: Mapping, exported: Mapping[str, str]) -> dict[str, str]:
    """What the driver's process sees in the pod: the container's literal `env` values (a value
    from the downward API is known only there), then what the client script exports."""
    return {**literal_env(container), **exported}


def _pod_plan(
    environment: Mapping[str, str], pod_env: Mapping[str, str], given: Mapping[str, Any]
) -> Plan:
    """The pod driver's own validation of the environment it will get; UserError if it refuses.
    `given`: knobs the render has read already (the trainer's command), taken as read.

    A trainer command that names no model would leave the pod timing the default toy preset at
    the trainer's mesh and lengths, so the render asks for PRESET then.
    """
    try:
        config = plan.environment_config(environment, **given)
        if config.preset_source == "default":
            raise UserError(
                f"the trainer's flags name no model (--{', --'.join(MODEL_FLAGS)}): set PRESET"
                " through DRIVER_ENV (e.g. DRIVER_ENV=PRESET=qwen3.5-397b-cell) to choose what"
                " the pod times"
            )
        return plan.resolve(config, env=pod_env, rendering=True)
    except UserError as error:
        raise UserError(f"the bench pod would refuse its knobs: {error}") from None


def command_words(container: Mapping) -> list[str]:
    return [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]


def driver_environment(
    launch: ClientCommand,
    knobs: RenderKnobs,
    orch_argv: list[str] | None,
    sha: str,
    trainer_slice: TpuSlice | None = None,
    container_libtpu: str = "",
) -> dict[str, str]:
    """What the driver's process sees: the trainer's environment, DRIVER_ENV, then the bench knobs.

    The pass-through knobs are written by their rows' formatters, from the knob's value, else the
    trainer's (its command, its orchestrator's, its slice): TRAINER_SLICE tells the pod the slice
    it is rendered for, so its plan checks the mesh against that slice wherever the plan runs.
    LIBTPU_FLAGS is merged into the script's LIBTPU_INIT_ARGS, or else into `container_libtpu`
    (the client container's `env` value), which the export replaces: its flags are kept.
    """
    environment = {"BENCH_CODE_SHA256": sha, **launch.env}
    if knobs.libtpu_flags or "LIBTPU_INIT_ARGS" in environment:
        environment["LIBTPU_INIT_ARGS"] = merge_flags(
            environment.get("LIBTPU_INIT_ARGS", container_libtpu),
            knobs.libtpu_flags,
            "LIBTPU_FLAGS",
        )
    environment.update(knobs.driver_env)
    trainers = {
        "TRAINER_ARGV": tuple(trainer_command_words(launch)),
        "ORCH_ARGV": None if orch_argv is None else tuple(orch_argv),
        "TRAINER_SLICE": trainer_slice,
    }
    for name in PASS_THROUGH:
        value = knobs.passed(name)
        if value is None:
            value = trainers.get(name)
        if value is not None:
            environment[name] = DRIVER_KNOBS[name].format(value)
    return environment


def _orchestrator_argv(documents: list[dict], launch: ClientCommand) -> list[str] | None:
    """The orchestrator's flags, when its JobSet (named in the trainer's --discovery_addrs) is present."""
    found = orchestrator_command(documents, launch)
    return None if found is None else found[0].argv


def orchestrator_command(
    documents: list[dict], launch: ClientCommand
) -> tuple[ClientCommand, dict] | None:
    """The orchestrator's command and client container, when its JobSet (named in the trainer's
    --discovery_addrs) is present and runs a python program."""
    hosts = {
        address.split(":")[0]
        for word in launch.argv
        if word.startswith("--discovery_addrs=")
        for address in word.split("=", 1)[1].split(",")
    }
    for jobset in jobsets(documents):
        if jobset_name(jobset) in hosts:
            try:
                container = client_container(jobset)
                return read_client_command(command_words(container)), container
            except UserError:
                return None
    return None


def rename_references(jobset: dict, old: str, new: str) -> None:
    """Point every reference to JobSet `old` at `new`: metadata, selectors, env values, labels."""

    def visit(node: object) -> object:
        if isinstance(node, dict):
            return {key: visit(value) for key, value in node.items()}
        if isinstance(node, list):
            return [visit(value) for value in node]
        return rename_text(node, old, new) if isinstance(node, str) else node

    renamed = visit(jobset)
    jobset.clear()
    jobset.update(renamed)


def jobset_slice(jobset: Mapping) -> TpuSlice | None:
    """The TPU slice a JobSet's TPU workers are scheduled on (their node selectors), or None."""
    for job in replicated_jobs(jobset):
        selector = pod_spec(job).get("nodeSelector") or {}
        accelerator = selector.get(validate.ACCELERATOR_SELECTOR)
        chip = next((c for c in TPU_CHIPS if c.gke_accelerator == accelerator), None)
        topology = selector.get(validate.TOPOLOGY_SELECTOR)
        if asks_for_tpus(job) and chip is not None and isinstance(topology, str):
            return TpuSlice(chip, topology)
    return None


def apply_slice(jobset: dict, tpu_slice: TpuSlice) -> None:
    """Move every slice fact together: node selectors, hosts, chips per host, Pathways instance type."""
    for job in replicated_jobs(jobset):
        selector = pod_spec(job).get("nodeSelector")
        if isinstance(selector, dict) and validate.ACCELERATOR_SELECTOR in selector:
            selector[validate.ACCELERATOR_SELECTOR] = tpu_slice.chip.gke_accelerator
            selector[validate.TOPOLOGY_SELECTOR] = tpu_slice.topology
        if asks_for_tpus(job):
            job_spec = job["template"]["spec"]
            job_spec["completions"] = tpu_slice.num_hosts
            job_spec["parallelism"] = tpu_slice.num_hosts
        for container in containers(job):
            resources = container.get("resources") or {}
            for kind in ("limits", "requests"):
                if TPU_RESOURCE in (resources.get(kind) or {}):
                    resources[kind][TPU_RESOURCE] = str(tpu_slice.chips_per_host)
            if is_pathways_container(container) and container.get("args"):
                container["args"] = [
                    f"{validate.INSTANCE_TYPE_FLAG}{tpu_slice.pathways_instance_type}"
                    if str(arg).startswith(validate.INSTANCE_TYPE_FLAG)
                    else arg
                    for arg in container["args"]
                ]


class _Dumper(yaml.SafeDumper):
    """Block style, keys in the trainer's order, scripts as literal blocks, no anchors."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_yaml(document: Mapping) -> str:
    return yaml.dump(
        document, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=10_000
    )


# ----------------------------------------------------------------------------------------------
def engine_requirement(engine: str) -> str:
    """What the pod needs to time `engine`: the bench ships its own code, not another engine's."""
    if engine == MAXTEXT:
        return (
            f"render: the pod times ENGINE={engine}; the trainer's image must have maxtext and a"
            " Tunix with tunix.experimental (the bench's code bundle carries the adapter, not them)"
        )
    module = engine.partition(":")[0]
    return (
        f"render: the pod times ENGINE={engine}; the trainer's image must have {module} and every"
        " package it imports (the bench's code bundle carries only rl_trainer_bench)"
    )


# Command line
# ----------------------------------------------------------------------------------------------


# The AOT JobSet of the same launch and knobs (`launch/aot_job.py`, which builds on this module):
# (its YAML, its summary lines). The `render` command passes it in with AOT_JOB.
AotJobRenderer = Callable[[str, str, RenderKnobs, Rendered], tuple[str, list[str]]]


def run(
    args, plan_ab: AbPlanner | None = None, render_aot_job: AotJobRenderer | None = None
) -> int:
    """The `render` command; `plan_ab` plans a same-pod A/B (AB_ARMS), once, `render_aot_job`
    renders the AOT job (AOT_JOB) from the render, that plan included."""
    # render_bench.sh passes on only the knobs it knows; a misspelt one would vanish silently.
    refuse_misspelt_knobs(os.environ, "the environment", [knob.env for knob in RENDER_KNOBS])
    knobs = RenderKnobs.from_strings({knob.dest: getattr(args, knob.dest) for knob in RENDER_KNOBS})
    _check_outputs(knobs)
    source, text = _read_input(knobs.launch_render)
    result = render_with_plan(text, source, knobs, plan_ab)
    rendered, pod_plan = result.yaml, result.plan
    aot_job = _aot_job(text, source, knobs, result, render_aot_job)  # before anything is written
    if knobs.output is None:
        sys.stdout.write(rendered)
    else:
        _write(knobs.output, "OUTPUT", rendered)
    if aot_job is not None:
        _write(knobs.aot_job, "AOT_JOB", aot_job[0])
    name = result.jobset["metadata"]["name"]
    target = knobs.output or "stdout"
    print(f"render: JobSet {name} from {source} -> {target}", file=sys.stderr)
    print(f"render: the pod times {pod_plan.cell()}", file=sys.stderr)
    print(f"render: runtime: {pod_plan.runtime_line()}", file=sys.stderr)
    for line in [*libtpu_lines(result), *result.ab_lines]:
        print(f"render: {line}", file=sys.stderr)
    for fate in pod_plan.fates_of(dict(result.orchestrator_env)):
        if fate.fate not in (PLUMBING, OFF_THE_STEP):
            print(f"render: orchestrator variable: {fate.describe()}", file=sys.stderr)
    chosen = f" (RESULTS_URI from {result.results_source})" if result.results_source else ""
    print(f"render: results: {pod_plan.results_line()}{chosen}", file=sys.stderr)
    if pod_plan.config.results_uri:
        print(f"render: results: {result.preemption}", file=sys.stderr)
    print(f"render: moe: {pod_plan.replay}", file=sys.stderr)
    print(f"render: device memory: {pod_plan.device_memory()}", file=sys.stderr)
    for difference in pod_plan.differences:
        print(f"render: preset differs from the trainer: {difference.describe()}", file=sys.stderr)
    for name, text in pod_plan.engine_facts:
        print(f"render: {name}: {text}", file=sys.stderr)
    print(f"render: trainer MaxText keys: {pod_plan.trainer_keys_summary()}", file=sys.stderr)
    for key in pod_plan.trainer_keys:
        print(f"render: trainer key {key.describe()}", file=sys.stderr)
    for name, text in pod_plan.accounting_rows():
        print(f"render: {name}: {text}", file=sys.stderr)
    for check in result.document.checks if result.document else ():
        print(f"render: {check.describe()}", file=sys.stderr)
    if pod_plan.config.engine != BUILT_IN:
        print(engine_requirement(pod_plan.config.engine), file=sys.stderr)
    stored = apply_size.stored_annotation_bytes(result.jobset)
    print(
        f"render: manifest: {stored:,} bytes of annotations once `kubectl apply` stores it (the"
        f" API server's limit: {apply_size.ANNOTATIONS_LIMIT:,})",
        file=sys.stderr,
    )
    if aot_job is not None:
        print(f"render: AOT JobSet -> {knobs.aot_job}", file=sys.stderr)
        for line in aot_job[1]:
            print(f"render: {line}", file=sys.stderr)
    return 0


def _aot_job(
    text: str,
    source: str,
    knobs: RenderKnobs,
    result: Rendered,
    render_aot_job: AotJobRenderer | None,
) -> tuple[str, list[str]] | None:
    """The AOT job's YAML and summary lines when AOT_JOB asks for it."""
    if knobs.aot_job is None:
        return None
    if render_aot_job is None:
        raise RuntimeError("AOT_JOB given but no AOT job renderer: pass render_aot_job")
    return render_aot_job(text, source, knobs, result)


def _check_trainer(trainer: Mapping, source: str) -> None:
    """The trainer is a well-formed JobSet of one slice. The bench times one trainer slice, and a
    trainer across several runs its program over all of them: cutting it to one would change its
    mesh without a word, so it is refused."""
    validate.check_schema(trainer, f"trainer in {source}")
    slices, each = validate.worker_slices(trainer)
    if slices > 1:
        raise UserError(
            f"trainer {jobset_name(trainer)} in {source} spans {slices} TPU slices ({each}); the"
            " bench times one trainer slice: render the DRY_RUN of a one-slice launch of the"
            " trainer (--instance_count=1, its worker job's replicas 1)"
        )


def _check_outputs(knobs: RenderKnobs) -> None:
    """The files the render writes, checked before any work; two knobs never name one file, and
    no output replaces the launcher's output it reads (its only copy, perhaps)."""
    written = {"OUTPUT": knobs.output, "AOT_JOB": knobs.aot_job}
    for knob, path in written.items():
        if path is None:
            continue
        check_output_file(path, knob)
        if knobs.launch_render != "-" and _same_file(path, knobs.launch_render):
            raise UserError(
                f"{knob}={path} is the LAUNCH_RENDER file the render reads: name another file"
            )
    both = knobs.output is not None and knobs.aot_job is not None
    if both and _same_file(knobs.aot_job, knobs.output):
        raise UserError(f"AOT_JOB={knobs.aot_job} is OUTPUT's file too: name another file")


def _same_file(first: str, second: str) -> bool:
    return Path(first).resolve() == Path(second).resolve()


def _write(path: str, knob: str, text: str) -> None:
    try:
        write_text_atomically(Path(path), text)
    except OSError as error:
        raise UserError(
            f"{knob}={path}: cannot write ({error.strerror}); pick a writable path"
        ) from None


def libtpu_lines(result: Rendered) -> list[str]:
    """Each compiling container's libtpu flags in the bench and where it reads them, a warning for
    each flag a trainer's container is given several values, and a warning when the trainer's
    containers disagree (the bench keeps them as the trainer has them)."""
    lines = [f"libtpu flags: {item.describe()}" for item in result.bench_flags]
    lines += compile_flags.conflict_warnings(list(result.trainer_flags), list(result.bench_flags))
    split = compile_flags.disagreements(list(result.trainer_flags))
    if split:
        lines.append(
            "WARNING: the trainer's compiling containers disagree on libtpu flags ("
            + "; ".join(split)
            + "): under Pathways the proxy compiles and the workers run the programs, and the"
            " public recipes pass them their flags as arguments, so a flag the client alone has"
            " may never reach the compiler; the bench keeps each container's flags as the"
            " trainer has them (LIBTPU_FLAGS sets a flag on all of them)"
        )
    return lines


def _read_input(path: str) -> tuple[str, str]:
    if path != "-":
        return path, read_user_text(path, "LAUNCH_RENDER")
    try:
        return "stdin", sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(
            f"LAUNCH_RENDER=-: byte {error.start} of stdin is not UTF-8; pass the launcher's "
            "DRY_RUN output (YAML text)"
        ) from None
