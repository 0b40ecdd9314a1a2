"""Launch render ──► AOT JobSet: `aot` and `hlo-overlap` for the trainer's slice, in its own image.

The trainer's exact MaxText and libtpu are in the trainer's image; the host that renders may have
another MaxText (maxtext 0.2.5 refuses five of the 397B recipe's keys, its Gated DeltaNet
kernel's among them, and compiles a `fwd_bwd` with 110 GiB of temporaries without them) or none.
So the renderer can also render, from the same DRY_RUN and knobs as the bench, one JobSet that
compiles the trainer's programs where its code is: the trainer's client image, environment,
imagePullSecrets and service account, the knobs the bench pod gets (the trainer's argv and
MaxText keys, ENGINE_FLAGS, LIBTPU_INIT_ARGS, the A/B's program sets, as `aot --ab-arms` compiles
them), on a CPU node (AOT_NODE_SELECTOR) with JAX_PLATFORMS=cpu and no TPU requested: `aot`
compiles the slice's topology from a CPU host. Its pod runs `preflight/aot_job_pod.py` from code
embedded as the bench pod's is (`code_bundle`), and copies its reports under the trainer's output
folder.

A JobSet of one replicated job rather than a bare Job: it is checked by the same schema, list keys
and name budgets as the bench (`validate.check`, `rl-trainer-bench validate`), and the trainer's
cluster runs the JobSet controller already.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping

from rl_trainer_bench import code_digest
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch import apply_size, code_bundle, results_location, validate
from rl_trainer_bench.launch.client_command import ClientCommand, read_client_command
from rl_trainer_bench.launch.dry_run import (
    TPU_RESOURCE,
    client_container,
    client_location,
    find_trainer,
    jobset_name,
    pod_spec,
    read_documents,
    replicated_jobs,
)
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.names import bench_name
from rl_trainer_bench.launch.pod_script import (
    AB_ARMS,
    CODE_DIR_VARIABLE,
    SCRIPT_NAME,
    bench_script,
)
from rl_trainer_bench.launch.render import (
    CODE_SHA_ANNOTATION,
    SLICE_ANNOTATION,
    TRAINER_ANNOTATION,
    Rendered,
    SamePodAb,
    command_words,
    dump_yaml,
    pod_environment,
    trainer_output,
)

ENTRY_MODULE = "rl_trainer_bench.preflight.aot_job_pod"
AB_VARIABLE = "AOT_AB"  # the same-pod A/B the pod compiles (`aot_job_pod.AB_VARIABLE`)
JOB_SUFFIX = "-aot"
REPLICATED_JOB = "aot"
CONTAINER = "aot"
JOB_ANNOTATION = "rl-trainer-bench/job"  # JOB_KIND: `plan` runs this pod's plan, not a bench's
JOB_KIND = "aot"
RESULTS_DIR = "aot_results"
# The node pool the job asks for when AOT_NODE_SELECTOR is not given: a general-purpose GKE
# machine with 16 vCPUs (libtpu's code generation keeps every core busy) and 64 GB, room for the
# request below. Any CPU pool the cluster has does: name it with AOT_NODE_SELECTOR.
DEFAULT_NODE_SELECTOR = (("node.kubernetes.io/instance-type", "n2-standard-16"),)
# Sized from benchmarks/reports/maxtext-aot_tpu7x_2026-12-03.md: compiling the 397B cell's programs
# for tpu7x:4x4x8 on a 2-core host, one program at a time, peaked at 17.50 GiB of host memory
# (`aot`, MaxText's programs), 17.40 GiB (`hlo-overlap`, MaxText's) and 18.38 GiB (`hlo-overlap`,
# the built-in engine's). The request is the largest and a quarter; the limit leaves room for a
# libtpu that compiles more fusions at once on more cores (INFERRED: measured on 2 cores only). No
# CPU limit: a compile throttled below its cores only takes longer.
RESOURCES = {"requests": {"cpu": "8", "memory": "24Gi"}, "limits": {"memory": "48Gi"}}
# What the job keeps of the trainer's pod: where the image comes from and what it may read.
KEPT_POD_FIELDS = (
    "serviceAccountName",
    "imagePullSecrets",
    "priorityClassName",
    "terminationGracePeriodSeconds",  # the copy of the reports when SIGTERM ends the job
)
KEPT_CONTAINER_FIELDS = ("image", "imagePullPolicy", "envFrom", "workingDir")


def render_aot_job(
    text: str, source: str, knobs: RenderKnobs, bench: Rendered
) -> tuple[str, list[str]]:
    """The AOT JobSet of a launch render, with the bench's knobs (`bench`: the bench rendered
    from the same launch and knobs, its same-pod A/B planned with it), and its summary lines;
    validated, or UserError."""
    trainer = find_trainer(read_documents(text, source), source, knobs.trainer_jobset)
    exports = bench_exports(bench)
    client = client_container(trainer)
    if not client.get("image"):
        raise UserError(
            f"JobSet {jobset_name(trainer)}: its client container {client.get('name')!r} names no"
            " image, and the AOT job runs in the trainer's image: render from the launcher's"
            " DRY_RUN output, whose client container has one"
        )
    launch = read_client_command(command_words(client))
    slice_name = exports.get("TRAINER_SLICE")
    if not slice_name:
        raise UserError(
            "AOT_JOB compiles for the trainer's slice, and the trainer's node selectors name"
            " none: set TRAINER_SLICE (e.g. tpu7x:4x4x8)"
        )
    jobset = _skeleton(trainer)
    name = bench_name(jobset, None, JOB_SUFFIX)
    jobset["metadata"]["name"] = name
    environment, results = _job_environment(trainer, client, launch, knobs, exports, name)
    if bench.ab is not None:
        environment[AB_VARIABLE] = same_pod_ab_table(pod_environment(client, exports), bench.ab)
    engine = bench.plan.config.engine
    sha = code_digest.code_sha256(engine=engine, aot_job=True)
    environment["BENCH_CODE_SHA256"] = sha
    container = _container(client, launch, environment, engine, jobset_name(trainer))
    spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    spec["containers"] = [container]
    spec["nodeSelector"] = dict(knobs.aot_node_selector or DEFAULT_NODE_SELECTOR)
    volumes = _mounted_volumes(trainer, client)
    if volumes:
        spec["volumes"] = volumes
    jobset["metadata"]["annotations"] = {
        JOB_ANNOTATION: JOB_KIND,
        CODE_SHA_ANNOTATION: sha,
        TRAINER_ANNOTATION: jobset_name(trainer),
        SLICE_ANNOTATION: slice_name,
    }
    validate.check(jobset, f"AOT job rendered from {source}")  # kubectl apply's size limit too
    return dump_yaml(jobset), _summary(jobset, environment, results)


def bench_exports(bench: Rendered) -> dict[str, str]:
    """The knobs the bench's client script exports, read back from the rendered bench: not the
    script's own code folder and import path, which each script sets for itself."""
    script = command_words(client_container(bench.jobset))
    exports = read_client_command(script).env
    return {k: v for k, v in exports.items() if k not in (CODE_DIR_VARIABLE, "PYTHONPATH")}


def same_pod_ab_table(pod_env: Mapping[str, str], ab: SamePodAb) -> str:
    """AOT_AB: the A/B's arms, the ENGINE_FLAGS its program sets are composed over (the pod's,
    which the A/B was planned from), and each program set (its settings, the knobs it sets over
    the pod's) as the render planned them, so the pod's `aot --ab-arms` compiles what the A/B
    runs without planning it again."""
    table = {
        "arms": pod_env[AB_ARMS],
        "engine_flags": pod_env.get("ENGINE_FLAGS", ""),
        "program_sets": [
            {"settings": list(settings), "knobs": dict(set_knobs)}
            for settings, set_knobs in ab.program_sets
        ],
    }
    return json.dumps(table, separators=(",", ":"))


def _job_environment(
    trainer: Mapping,
    client: Mapping,
    launch: ClientCommand,
    knobs: RenderKnobs,
    exports: Mapping[str, str],
    name: str,
) -> tuple[dict[str, str], tuple[str, str] | None]:
    """What the job's script exports: the bench pod's knobs, its own results folder and
    destination; and (RESULTS_URI, what chose it), None when nothing durable did."""
    environment = {
        key: value
        for key, value in exports.items()
        if key not in (AB_ARMS, "RESULTS_URI", "BENCH_CODE_SHA256", "RESULTS_DIR")
    }
    environment["RESULTS_DIR"] = RESULTS_DIR
    results = _results_uri(trainer, launch, knobs.passed("RESULTS_URI"), name)
    if results is not None:
        environment["RESULTS_URI"] = results[0]
    return environment, results


def _skeleton(trainer: Mapping) -> dict:
    """A JobSet of one pod, in the trainer's namespace, keeping what the trainer's pod reads its
    image and secrets with; named after the trainer until `bench_name` names it."""
    where = client_location(trainer)
    trainer_pod = pod_spec(replicated_jobs(trainer)[where.job_index])
    kept = {
        field: copy.deepcopy(trainer_pod[field])
        for field in KEPT_POD_FIELDS
        if field in trainer_pod
    }
    metadata = {"name": jobset_name(trainer)}
    namespace = (trainer.get("metadata") or {}).get("namespace")
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": validate.API_VERSION,
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [
                {
                    "name": REPLICATED_JOB,
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "backoffLimit": 0,
                            "completions": 1,
                            "parallelism": 1,
                            "template": {"spec": {"restartPolicy": "Never", **kept}},
                        }
                    },
                }
            ],
        },
    }


def _container(
    client: Mapping,
    launch: ClientCommand,
    environment: Mapping[str, str],
    engine: str,
    trainer: str,
) -> dict:
    """The job's one container: the client's image and environment (JAX on the CPU), the embedded
    job, the measured resources and no TPU."""
    env = [
        copy.deepcopy(item)
        for item in client.get("env") or []
        if item.get("name") != "JAX_PLATFORMS"
    ]
    env.append({"name": "JAX_PLATFORMS", "value": "cpu"})
    container = {
        "name": CONTAINER,
        **{
            field: copy.deepcopy(client[field])
            for field in KEPT_CONTAINER_FIELDS
            if field in client
        },
        "command": [
            "bash",
            "-c",
            bench_script(
                interpreter=launch.program[0],
                environment=environment,
                has_driver_script=False,
                trainer_jobset=trainer,
                entry_module=ENTRY_MODULE,
            ),
            SCRIPT_NAME,
            *code_bundle.bundle_parts(engine=engine, aot_job=True),
        ],
        "env": env,
        "resources": copy.deepcopy(RESOURCES),
    }
    mounts = [copy.deepcopy(m) for m in client.get("volumeMounts") or []]
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _mounted_volumes(trainer: Mapping, client: Mapping) -> list[dict]:
    """The volumes the client container mounts (a results folder on a persistent volume, keys a
    secret holds); a generic ephemeral volume, a disk provisioned for each pod, becomes an
    emptyDir at the same mount: the job keeps the path, not the disk."""
    where = client_location(trainer)
    mounted = {m.get("name") for m in client.get("volumeMounts") or []}
    volumes = []
    for volume in pod_spec(replicated_jobs(trainer)[where.job_index]).get("volumes") or []:
        if volume.get("name") not in mounted:
            continue
        if "ephemeral" in volume:
            volumes.append({"name": volume["name"], "emptyDir": {}})
        else:
            volumes.append(copy.deepcopy(volume))
    return volumes


def _results_uri(
    trainer: Mapping, launch: ClientCommand, knob: str | None, name: str
) -> tuple[str, str] | None:
    """(RESULTS_URI, what chose it): the knob's, else under the trainer's durable output folder."""
    if knob is not None:
        return knob, "the RESULTS_URI knob"
    found = trainer_output(trainer, launch)
    if found is None:
        return None
    location, source = found
    return results_location.results_uri(location, name), source


def _ab_compiles(program_sets: list[dict]) -> str:
    """What the job compiles of a same-pod A/B, as the A/B runs it."""
    sets = "; ".join("+".join(item["settings"]) for item in program_sets)
    return (
        f"the same-pod A/B as it runs: one `aot --ab-arms` (one state for every arm, each program"
        f" set compiled beside it: {sets}), whose report and exit code are the A/B's fit verdict,"
        " and hlo-overlap once per program set (sets whose flags it reads alike, once)"
    )


def _summary(
    jobset: Mapping, environment: Mapping[str, str], results: tuple[str, str] | None
) -> list[str]:
    name = jobset_name(jobset)
    spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    selector = " ".join(f"{k}={v}" for k, v in spec["nodeSelector"].items())
    resources = container["resources"]
    flags = environment.get("LIBTPU_INIT_ARGS")
    ab = json.loads(environment[AB_VARIABLE]) if AB_VARIABLE in environment else None
    lines = [
        f"aot job: JobSet {name}: aot and hlo-overlap for {environment['TRAINER_SLICE']} in the"
        f" trainer's image {container.get('image', '(none)')}, JAX_PLATFORMS=cpu, no"
        f" {TPU_RESOURCE} requested",
        f"aot job: node selector {selector}; requests cpu {resources['requests']['cpu']} memory"
        f" {resources['requests']['memory']}, limit memory {resources['limits']['memory']} (the"
        " 397B cell's programs for tpu7x:4x4x8 peaked at 17.4-18.4 GiB of host memory and took"
        " 12-36 minutes a command on a 2-core host: BENCHMARKS.md)",
        "aot job: libtpu flags: "
        + (f"LIBTPU_INIT_ARGS={flags}" if flags else "none (libtpu's defaults)"),
        "aot job: compiles "
        + (
            _ab_compiles(ab["program_sets"])
            if ab
            else "the trainer's programs (TRAINER_ARGV, ENGINE_FLAGS)"
        )
        + "; the pod says first which MaxText and libtpu it compiles with, and refuses in one"
        " line when the image lacks them (PLAN_ONLY=1, or `rl-trainer-bench plan` on this file,"
        " stops there)",
    ]
    if results is None:
        lines.append(
            f"aot job: results: {RESULTS_DIR} on the pod's disk, lost with the pod (no durable"
            " output folder in the trainer's command or mounts): set RESULTS_URI"
        )
    else:
        lines.append(
            f"aot job: results: copied as it goes and when it ends to {results[0]}/<UTC time>/"
            f" (RESULTS_URI from {results[1]})"
        )
    image = str(container.get("image", ""))
    if "@sha256:" not in image:
        lines.append(
            f"aot job: the image {image} is named by a tag: the job compiles with what the tag"
            " names when its pod starts, the trainer with what it named when the trainer's did;"
            " name the image by digest (@sha256:...) in the launcher to compile the same image"
        )
    lines.append(
        f"aot job: manifest: {apply_size.stored_annotation_bytes(jobset):,} bytes of annotations"
        " once `kubectl apply` stores it (the API server's limit:"
        f" {apply_size.ANNOTATIONS_LIMIT:,})"
    )
    return lines
