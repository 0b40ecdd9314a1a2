"""LIBTPU_FLAGS reaches every container that compiles or runs the trainer's programs: the client's
LIBTPU_INIT_ARGS, and under Pathways the proxy's and the workers' arguments (as the public recipes
pass them); the summary shows each container's flags and warns when the trainer's disagree.
"""

from __future__ import annotations

from reference_data import launch_render
from render_helpers import FIXTURE, exports, load_manifest

from rl_trainer_bench import cli
from rl_trainer_bench.launch.diff import diff, unexpected
from rl_trainer_bench.launch.dry_run import containers, find_trainer, read_documents
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render

RENDER_KINDS = {"names", "restarts", "command", "provenance"}


def _containers(bench: dict) -> dict[str, dict]:
    return {c["name"]: c for job in bench["spec"]["replicatedJobs"] for c in containers(job)}


def _render(text: str, **knobs: str) -> dict:
    return load_manifest(render(text, "launch.yaml", RenderKnobs.from_strings(knobs)))


def _summary(path, capsys, *flags: str) -> list[str]:
    out = path.parent / "bench.yaml"
    assert cli.main(["render", "--launch-render", str(path), "--output", str(out), *flags]) == 0
    return [line for line in capsys.readouterr().err.splitlines() if "libtpu flags" in line]


def test_the_knob_reaches_client_proxy_and_workers_but_not_the_resource_manager():
    bench = _render(FIXTURE.read_text(), libtpu_flags="--xla_a=3 --xla_c=2")
    by_name = _containers(bench)
    assert exports(bench)["LIBTPU_INIT_ARGS"] == "--xla_a=3 --xla_b=true --xla_c=2"
    assert by_name["pathways-proxy"]["args"] == [
        "--server_port=29000",
        "--resource_manager_address=$(PATHWAYS_HEAD):29001",
        "--xla_a=3",
        "--xla_c=2",
    ]
    assert by_name["pathways-worker"]["args"][-2:] == ["--xla_a=3", "--xla_c=2"]
    assert not any(arg.startswith("--xla") for arg in by_name["pathways-rm"]["args"])


def test_a_flag_a_server_already_has_is_replaced_in_place():
    text = FIXTURE.read_text().replace(
        "              - --server_port=29000\n",
        "              - --server_port=29000\n              - --xla_c=0\n",
    )
    args = _containers(_render(text, libtpu_flags="--xla_c=2"))["pathways-proxy"]["args"]
    assert args == [
        "--server_port=29000",
        "--xla_c=2",
        "--resource_manager_address=$(PATHWAYS_HEAD):29001",
    ]


def test_render_diff_names_the_servers_flags_as_their_own_kind():
    trainer = find_trainer(read_documents(FIXTURE.read_text(), "f"), "f")
    bench = _render(FIXTURE.read_text(), libtpu_flags="--xla_c=2")
    changes = diff(trainer, bench)
    assert {c.kind for c in unexpected(changes, RENDER_KINDS)} == {"libtpu-flags"}
    assert unexpected(changes, RENDER_KINDS | {"libtpu-flags"}) == []
    assert unexpected(diff(trainer, _render(FIXTURE.read_text())), RENDER_KINDS) == []


def test_the_summary_shows_each_containers_flags_and_the_trainers_disagreement(capsys, tmp_path):
    launch = tmp_path / "launch.yaml"
    launch.write_text(FIXTURE.read_text())
    lines = _summary(launch, capsys, "--libtpu-flags=--xla_c=2")
    assert lines == [
        "render: libtpu flags: main (client, LIBTPU_INIT_ARGS): --xla_a=1 --xla_b=true --xla_c=2",
        "render: libtpu flags: pathways-proxy (proxy, args): --xla_c=2",
        "render: libtpu flags: pathways-worker (worker, args): --xla_c=2",
        "render: WARNING: the trainer's compiling containers disagree on libtpu flags (main only:"
        " --xla_a=1 --xla_b=true): under Pathways the proxy compiles and the workers run the"
        " programs, and the public recipes pass them their flags as arguments, so a flag the"
        " client alone has may never reach the compiler; the bench keeps each container's flags"
        " as the trainer has them (LIBTPU_FLAGS sets a flag on all of them)",
    ]


def test_a_launcher_whose_containers_agree_gets_no_warning(capsys, tmp_path):
    flags = "              - --xla_a=1\n              - --xla_b=true\n"
    text = FIXTURE.read_text()
    for port in ("29000", "29005"):
        text = text.replace(
            f"              - --server_port={port}\n",
            f"              - --server_port={port}\n{flags}",
        )
    launch = tmp_path / "launch.yaml"
    launch.write_text(text)
    lines = _summary(launch, capsys)
    assert lines[1:] == [
        "render: libtpu flags: pathways-proxy (proxy, args): --xla_a=1 --xla_b=true",
        "render: libtpu flags: pathways-worker (worker, args): --xla_a=1 --xla_b=true",
    ]


def test_a_worker_with_another_value_is_named(capsys, tmp_path):
    text = FIXTURE.read_text()
    text = text.replace(
        "              - --server_port=29000\n",
        "              - --server_port=29000\n              - --xla_a=1\n              - --xla_b=true\n",
    )
    text = text.replace(
        "              - --server_port=29005\n",
        "              - --server_port=29005\n              - --xla_a=2\n              - --xla_b=true\n",
    )
    launch = tmp_path / "launch.yaml"
    launch.write_text(text)
    warning = _summary(launch, capsys)[-1]
    assert "(main, pathways-proxy only: --xla_a=1; pathways-worker only: --xla_a=2)" in warning


def test_the_real_launchers_proxy_and_workers_carry_the_knob():
    path = launch_render("tunix-mlperf-397b-256-v5p-trainer.stdout.txt")
    by_name = _containers(
        _render(path.read_text(), libtpu_flags="--xla_tpu_scoped_vmem_limit_kib=98304")
    )
    for name in ("pathways-proxy", "pathways-worker"):
        assert by_name[name]["args"][-1] == "--xla_tpu_scoped_vmem_limit_kib=98304"


_WORKER_ENV = '              - name: TPU_MIN_LOG_LEVEL\n                value: "0"\n'


def _with_worker_env(text: str, entry: str) -> str:
    """The fixture with `entry` (YAML lines of one env item) added to the worker's env."""
    assert _WORKER_ENV in text
    return text.replace(_WORKER_ENV, _WORKER_ENV + entry)


def _libtpu_env(value: str) -> str:
    return f"              - name: LIBTPU_INIT_ARGS\n                value: '{value}'\n"


def _env_value(container: dict) -> str:
    return next(e["value"] for e in container["env"] if e["name"] == "LIBTPU_INIT_ARGS")


def test_a_worker_with_its_flags_in_its_environment_is_read_from_there(capsys, tmp_path):
    text = _with_worker_env(FIXTURE.read_text(), _libtpu_env("--xla_a=1 --xla_b=true"))
    text = text.replace(
        "              - --server_port=29000\n",
        "              - --server_port=29000\n              - --xla_a=1\n              - --xla_b=true\n",
    )
    launch = tmp_path / "launch.yaml"
    launch.write_text(text)
    assert _summary(launch, capsys) == [
        "render: libtpu flags: main (client, LIBTPU_INIT_ARGS): --xla_a=1 --xla_b=true",
        "render: libtpu flags: pathways-proxy (proxy, args): --xla_a=1 --xla_b=true",
        "render: libtpu flags: pathways-worker (worker, LIBTPU_INIT_ARGS): --xla_a=1 --xla_b=true",
    ]


def test_the_knob_replaces_the_value_in_every_place_a_container_reads_it(capsys, tmp_path):
    flag = "--xla_tpu_scoped_vmem_limit_kib"
    text = _with_worker_env(FIXTURE.read_text(), _libtpu_env(f"{flag}=65536 --xla_b=true"))
    bench = _render(text, libtpu_flags=f"{flag}=32768")
    worker = _containers(bench)["pathways-worker"]
    assert _env_value(worker) == f"{flag}=32768 --xla_b=true"
    assert worker["args"][-1] == f"{flag}=32768"
    assert not any("65536" in str(arg) for arg in worker["args"])
    trainer = find_trainer(read_documents(text, "f"), "f")
    kinds = {c.kind for c in unexpected(diff(trainer, bench), RENDER_KINDS)}
    assert kinds == {"libtpu-flags"}
    launch = tmp_path / "launch.yaml"
    launch.write_text(text)
    out = tmp_path / "bench.yaml"
    argv = ["render", "--launch-render", str(launch), "--output", str(out)]
    assert cli.main([*argv, f"--libtpu-flags={flag}=32768"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert (
        "render: libtpu flags: pathways-worker (worker): args and LIBTPU_INIT_ARGS:"
        f" {flag}=32768; LIBTPU_INIT_ARGS: --xla_b=true"
    ) in lines
    assert not any("several values" in line for line in lines)


def test_a_flag_given_two_values_in_one_container_is_reported(capsys, tmp_path):
    text = _with_worker_env(FIXTURE.read_text(), _libtpu_env("--xla_a=1"))
    text = text.replace(
        "              - --server_port=29005\n",
        "              - --server_port=29005\n              - --xla_a=2\n",
    )
    text = text.replace(
        "LIBTPU_INIT_ARGS='--xla_a=1 --xla_b=true'", "LIBTPU_INIT_ARGS='--xla_b=1 --xla_b=0'"
    )
    launch = tmp_path / "launch.yaml"
    launch.write_text(text)
    out = tmp_path / "bench.yaml"
    assert cli.main(["render", "--launch-render", str(launch), "--output", str(out)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "several values" in line]
    tail = (
        ": set it once, or with LIBTPU_FLAGS, which the render writes in every place a container"
        " reads it"
    )
    assert warnings == [
        "render: WARNING: the trainer's main (client) sets --xla_b to several values:"
        " 1 (LIBTPU_INIT_ARGS), 0 (LIBTPU_INIT_ARGS); which one libtpu takes is not known, and"
        f" the bench's has --xla_b=0{tail}",
        "render: WARNING: the trainer's pathways-worker (worker) sets --xla_a to several values:"
        " 2 (args), 1 (LIBTPU_INIT_ARGS); which one libtpu takes is not known, and the bench"
        f" keeps them all{tail}",
    ]


def test_flags_the_render_cannot_read_are_said_and_the_knob_is_refused_there(capsys, tmp_path):
    entry = (
        "              - name: LIBTPU_INIT_ARGS\n                valueFrom:\n"
        "                  configMapKeyRef: {name: tpu-flags, key: args}\n"
    )
    launch = tmp_path / "launch.yaml"
    launch.write_text(_with_worker_env(FIXTURE.read_text(), entry))
    assert _summary(launch, capsys)[2] == (
        "render: libtpu flags: pathways-worker (worker): LIBTPU_INIT_ARGS from valueFrom, known"
        " only in the pod"
    )
    out = tmp_path / "refused.yaml"
    argv = ["render", "--launch-render", str(launch), "--output", str(out)]
    assert cli.main([*argv, "--libtpu-flags=--xla_c=2"]) == 2
    err = capsys.readouterr().err
    assert not out.exists() and len(err.strip().splitlines()) == 1
    assert "LIBTPU_FLAGS: container pathways-worker" in err
    assert (
        "takes LIBTPU_INIT_ARGS from valueFrom, which the render can neither read nor change" in err
    )


def test_a_client_with_its_flags_in_its_container_env_keeps_them_under_the_knob():
    text = FIXTURE.read_text().replace("LIBTPU_INIT_ARGS='--xla_a=1 --xla_b=true' ", "")
    text = text.replace(
        "              - name: JAX_PLATFORMS\n",
        _libtpu_env("--xla_a=1 --xla_b=true") + "              - name: JAX_PLATFORMS\n",
    )
    bench = _render(text, libtpu_flags="--xla_b=false")
    assert exports(bench)["LIBTPU_INIT_ARGS"] == "--xla_a=1 --xla_b=false"
    assert _env_value(_containers(bench)["main"]) == "--xla_a=1 --xla_b=false"


def test_a_value_that_starts_with_a_dash_may_follow_its_option_as_its_own_word(capsys, tmp_path):
    out = tmp_path / "bench.yaml"
    argv = ["render", "--launch-render", str(FIXTURE), "--output", str(out)]
    assert cli.main([*argv, "--libtpu-flags", "--xla_c=2"]) == 0
    assert _containers(load_manifest(out.read_text()))["pathways-worker"]["args"][-1] == "--xla_c=2"
    capsys.readouterr()
    forgotten = ["render", "--launch-render", str(FIXTURE), "--libtpu-flags", "--output", str(out)]
    assert cli.main(forgotten) == 2
    assert "argument --libtpu-flags: expected one argument" in capsys.readouterr().err
