"""`rl-trainer-bench plan BENCH.yaml`: the plan a rendered bench pod will execute, without the pod.

A rendered JobSet carries everything its pod plans from: the knobs its client script exports, the
bench code it embeds as base64 parts, and beside that code the plan resolved at render time
(`bench/plan_document.py`). This command takes the client command apart as the pod's shell would,
unpacks the code and the plan into a temporary folder, checks each against its annotation, and
runs that code's own entry in plan-only mode with exactly the pod's environment: it compares the
plan that code resolves with the embedded one, as the pod does first, and prints the embedded
plan, with what only the trainer's image can answer marked as checked in the pod. No device and no
JAX (planning is host work). Decoding the bundle by hand is what this replaces.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import io
import lzma
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rl_trainer_bench.bench import plan_document
from rl_trainer_bench.code_digest import DRIVER_SCRIPT, code_sha256
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.config.values import shell_writable
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import read_user_text
from rl_trainer_bench.launch import aot_job
from rl_trainer_bench.launch.client_command import read_client_command
from rl_trainer_bench.launch.dry_run import client_container, jobset_name, jobsets, read_documents
from rl_trainer_bench.launch.pod_script import (
    AB_ARMS,
    DRIVER_MODULE,
    SAME_POD_AB_MODULE,
    SCRIPT_NAME,
)
from rl_trainer_bench.launch.render import CODE_SHA_ANNOTATION, PLAN_SHA_ANNOTATION, pod_environment

RENDERED = "a JobSet rendered by `rl-trainer-bench render`"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="BENCH.yaml", help="a JobSet rendered by `render`")
    parser.add_argument(
        "--jobset", metavar="NAME", help="which bench JobSet of the file (when it holds several)"
    )


def run(args: argparse.Namespace) -> int:
    """The pod's own plan (its exit code: 0, or 2 when the pod would refuse its knobs)."""
    jobset = bench_jobset(read_user_text(args.file, "BENCH.yaml"), args.file, args.jobset)
    name = jobset_name(jobset)
    script, parts = _client_script(jobset, name)
    # The pod's whole environment: its container's own `env` (where launchers set JAX_PLATFORMS),
    # then what the script exports, as the pod's driver sees it.
    environment = pod_environment(client_container(jobset), read_client_command(script).env)
    for variable, value in environment.items():  # a literal `env` value no process can be given
        shell_writable(f"JobSet {name}'s {variable}", value)
    expected = _annotations(jobset)[CODE_SHA_ANNOTATION]
    is_aot_job = _annotations(jobset).get(aot_job.JOB_ANNOTATION) == aot_job.JOB_KIND
    with tempfile.TemporaryDirectory(prefix="rl-trainer-bench-plan-") as folder:
        root = Path(folder)
        _unpack(parts, root, name)
        found = code_sha256(
            root,
            engine=BenchConfig.from_env(environment).engine,  # as the pod resolves it
            same_pod_ab=AB_ARMS in environment,
            aot_job=is_aot_job,
        )
        if found != expected:
            raise UserError(
                f"{args.file}: JobSet {name}'s embedded code has sha256 {found}, not the"
                f" {expected} of its {CODE_SHA_ANNOTATION} annotation: the manifest was edited"
                " after rendering; render it again"
            )
        if is_aot_job:  # the AOT job's pod (`launch/aot_job.py`): its own plan-only mode
            print(
                f"plan: JobSet {name} from {args.file}: the AOT job's code (sha256 {found[:12]})"
                " and environment, planned here",
                flush=True,
            )
            program = ["-m", aot_job.ENTRY_MODULE]
        else:
            program = _bench_entry(root, jobset, environment, args.file, found)
        done = subprocess.run(
            [sys.executable, *program],
            env={
                **environment,
                "PLAN_ONLY": "1",
                plan_document.OFF_POD_VARIABLE: "1",
                plan_document.CODE_DIR_VARIABLE: str(root),
                "PATH": os.environ.get("PATH", ""),
                "PYTHONPATH": str(root),
            },
            cwd=root,
            check=False,
        )
    return done.returncode


def _bench_entry(
    root: Path, jobset: Mapping, environment: Mapping[str, str], source: str, found: str
) -> list[str]:
    """The bench pod's own entry, as its script runs it (`pod_script.bench_script`), once its
    embedded plan is checked: in plan-only mode it compares the embedded plan with the one its
    code resolves from the manifest's environment, prints the embedded plan, and leaves the
    image's checks to the pod."""
    name = jobset_name(jobset)
    print(
        f"plan: JobSet {name} from {source}: the plan resolved when it was rendered,"
        f" compared here with the one its code (sha256 {found[:12]}) resolves from its"
        " environment; what only the image answers is checked in the pod",
        flush=True,
    )
    _check_plan_digest(root, jobset, source, name)
    if AB_ARMS in environment:
        return ["-m", SAME_POD_AB_MODULE]
    driver = root / DRIVER_SCRIPT
    return [str(driver)] if driver.is_file() else ["-m", DRIVER_MODULE]


def _check_plan_digest(root: Path, jobset: Mapping, source: str, name: str) -> None:
    """The embedded plan is the one the render annotated (a manifest from before the plan was
    embedded, or one edited since, is refused with the way out)."""
    expected = _annotations(jobset).get(PLAN_SHA_ANNOTATION)
    path = root / plan_document.PLAN_FILE
    if not isinstance(expected, str) or not path.is_file():
        raise UserError(
            f"{source}: JobSet {name} carries no resolved plan ({PLAN_SHA_ANNOTATION}): it was"
            " rendered by an older bench; render it again"
        )
    found = hashlib.sha256(path.read_bytes()).hexdigest()
    if found != expected:
        raise UserError(
            f"{source}: JobSet {name}'s embedded plan has sha256 {found}, not the {expected} of"
            f" its {PLAN_SHA_ANNOTATION} annotation: the manifest was edited after rendering;"
            " render it again"
        )


def embedded_document(jobset: Mapping, source: str) -> plan_document.PlanDocument:
    """The resolved plan a bench JobSet carries, checked against its annotation."""
    name = jobset_name(jobset)
    _, parts = _client_script(jobset, name)
    with tempfile.TemporaryDirectory(prefix="rl-trainer-bench-plan-") as folder:
        root = Path(folder)
        _unpack(parts, root, name)
        _check_plan_digest(root, jobset, source, name)
        path = root / plan_document.PLAN_FILE
        return plan_document.PlanDocument.from_json(path.read_text(encoding="utf-8"), source)


def bench_jobset(text: str, source: str, wanted: str | None) -> Mapping:
    """The one bench JobSet of `text` (the one named `wanted`); a UserError naming the choice."""
    rendered = [j for j in jobsets(read_documents(text, source, RENDERED)) if _is_bench(j)]
    names = [jobset_name(j) for j in rendered]
    if wanted is not None:
        if wanted not in names:
            raise UserError(
                f"--jobset {wanted!r}: {source} holds no bench JobSet of that name"
                f" (bench JobSets: {', '.join(names) or 'none'})"
            )
        return rendered[names.index(wanted)]
    if not rendered:
        raise UserError(
            f"{source} holds no bench JobSet (one with the {CODE_SHA_ANNOTATION} annotation):"
            " pass the file `rl-trainer-bench render` wrote"
        )
    if len(rendered) > 1:
        raise UserError(
            f"{source} holds {len(rendered)} bench JobSets: choose one with --jobset"
            f" ({', '.join(names)})"
        )
    return rendered[0]


def _annotations(jobset: Mapping) -> Mapping:
    metadata = jobset.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def _is_bench(jobset: Mapping) -> bool:
    return isinstance(_annotations(jobset).get(CODE_SHA_ANNOTATION), str)


def _client_script(jobset: Mapping, name: str) -> tuple[str, list[str]]:
    """The client script and the code's base64 parts: `bash -c SCRIPT rl-trainer-bench-pod PART...`."""
    command = client_container(jobset).get("command")
    words = command if isinstance(command, list) else []
    if len(words) < 5 or words[:2] != ["bash", "-c"] or words[3] != SCRIPT_NAME:
        raise UserError(
            f"JobSet {name}: its client command is not a bench pod's (bash -c SCRIPT {SCRIPT_NAME}"
            " PART...): render the JobSet again with `rl-trainer-bench render`"
        )
    if not all(isinstance(word, str) for word in words):
        raise UserError(f"JobSet {name}: its client command holds a word that is not a string")
    for word in words:  # a NUL the pod cannot start with; base64 decoding would skip it here
        shell_writable(f"JobSet {name}'s client command", word)
    return words[2], words[4:]


def _unpack(parts: list[str], folder: Path, name: str) -> None:
    """The embedded code into `folder`, as the pod's script unpacks it (base64 of a tar.xz)."""
    try:
        data = base64.b64decode("\n".join(parts))
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as archive:
            archive.extractall(folder, filter="data")
    except (binascii.Error, lzma.LZMAError, tarfile.TarError, EOFError) as error:
        raise UserError(
            f"JobSet {name}: its embedded code does not unpack ({error}): the manifest was edited"
            " or cut short; render it again"
        ) from None
