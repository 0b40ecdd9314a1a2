"""`rl-trainer-bench plan BENCH.yaml`: the plan a rendered bench pod will print, without the pod.

A rendered JobSet carries everything its pod plans from: the knobs its client script exports and
the bench code it embeds as base64 parts. This command takes the client command apart as the
pod's shell would, unpacks the embedded code into a temporary folder, checks it against the
JobSet's `rl-trainer-bench/code-sha256` annotation, and runs that code's own
`bench_driver.py --plan` with exactly the exported environment. So the plan printed is the pod's:
its code, its knobs, no device and no JAX (planning is host work). Decoding the bundle by hand is
what this replaces.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import io
import lzma
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rl_trainer_bench.code_digest import DRIVER_SCRIPT, code_sha256
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import read_user_text
from rl_trainer_bench.launch import aot_job
from rl_trainer_bench.launch.client_command import read_client_command
from rl_trainer_bench.launch.dry_run import client_container, jobset_name, jobsets, read_documents
from rl_trainer_bench.launch.pod_script import AB_ARMS, DRIVER_MODULE, SCRIPT_NAME
from rl_trainer_bench.launch.render import CODE_SHA_ANNOTATION, pod_environment

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
        print(
            f"plan: JobSet {name} from {args.file}: the pod's code (sha256 {found[:12]}) and"
            " environment, planned here",
            flush=True,
        )
        driver = root / DRIVER_SCRIPT  # as the pod's script runs it (`pod_script.bench_script`)
        program = [str(driver)] if driver.is_file() else ["-m", DRIVER_MODULE]
        if is_aot_job:  # the AOT job's pod, which plans with PLAN_ONLY=1 and takes no flags
            program, environment = ["-m", aot_job.ENTRY_MODULE], {**environment, "PLAN_ONLY": "1"}
        done = subprocess.run(
            [sys.executable, *program, *([] if is_aot_job else ["--plan"])],
            env={**environment, "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(root)},
            cwd=root,
            check=False,
        )
    return done.returncode


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
