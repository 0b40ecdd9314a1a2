"""The renderer on the hand-written DRY_RUN fixture: what moves, what stays, and every knob."""

import shlex

import pytest
import yaml
from render_helpers import FIXTURE, exports, load_manifest, render_fixture

from rl_trainer_bench.config.engine_keys import parse_engine_flags
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.diff import diff, unexpected
from rl_trainer_bench.launch.dry_run import find_trainer, read_documents
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render
from rl_trainer_bench.launch.validate import jobset_problems


def _trainer() -> dict:
    return find_trainer(read_documents(FIXTURE.read_text(), "fixture"), "fixture")


def _job(bench: dict, name: str) -> dict:
    return next(job for job in bench["spec"]["replicatedJobs"] if job["name"] == name)


def _pod(bench: dict, name: str) -> dict:
    return _job(bench, name)["template"]["spec"]["template"]["spec"]


def _container(bench: dict, job: str, name: str) -> dict:
    return next(c for c in _pod(bench, job)["containers"] if c["name"] == name)


def test_bench_changes_only_names_restarts_command_and_provenance():
    bench = render_fixture()
    changes = diff(_trainer(), bench)
    assert unexpected(changes, {"names", "restarts", "command", "provenance"}) == []
    assert {c.kind for c in changes} == {"names", "restarts", "command", "provenance"}
    assert jobset_problems(bench) == []


def test_every_reference_to_the_trainer_name_moves_with_it():
    bench = render_fixture()
    assert bench["metadata"]["name"] == "fixture-train-bench"
    affinity = _pod(bench, "proc")["affinity"]["podAffinity"]
    selector = affinity["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]
    assert selector["matchExpressions"][0]["values"] == ["fixture-train-bench"]
    anti = _pod(bench, "pw-node")["affinity"]["podAntiAffinity"]
    anti_selector = anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]
    assert anti_selector["matchExpressions"][0]["values"] == ["fixture-train-bench"]
    env = {e["name"]: e.get("value") for e in _container(bench, "proc", "main")["env"]}
    assert env["TRAINER_HOST"] == "fixture-train-bench-proc-0-0.fixture-train-bench"
    assert env["UNRELATED_NAME"] == "fixture-train2"  # a longer name is not a reference
    del _container(bench, "proc", "main")["command"]  # the trainer's own argv is kept verbatim
    text = yaml.safe_dump(bench["spec"])
    assert "fixture-train" not in text.replace("fixture-train-bench", "").replace("train2", "")


def test_scheduling_and_pathways_containers_are_kept():
    bench, trainer = render_fixture(), _trainer()
    for job in ("proc", "pw-node"):
        for key in ("nodeSelector", "tolerations", "priorityClassName", "volumes", "hostNetwork"):
            assert _pod(bench, job).get(key) == _pod(trainer, job).get(key)
    for name in ("pathways-rm", "pathways-proxy"):
        assert _container(bench, "proc", name) == _container(trainer, "proc", name)
    assert _container(bench, "pw-node", "pathways-worker") == _container(
        trainer, "pw-node", "pathways-worker"
    )


def test_renders_are_byte_identical_when_repeated():
    knobs = RenderKnobs.from_strings({"steps": "3", "driver_env": "A='x y'"})
    text = FIXTURE.read_text()
    assert render(text, "f", knobs) == render(text, "f", knobs)


def test_trainer_env_prefix_and_argv_reach_the_driver():
    env = exports(render_fixture())
    assert env["LIBTPU_INIT_ARGS"] == "--xla_a=1 --xla_b=true"
    assert env["MAXTEXT_EXTRA_FLAGS"] == "--remat_policy=full --scan_layers=true"
    assert shlex.split(env["TRAINER_ARGV"]) == [
        # the variable that carries the trainer's MaxText keys travels with its flags
        "MAXTEXT_EXTRA_FLAGS=--remat_policy=full --scan_layers=true",
        "--discovery_addrs=fixture-orch:20000",
        "--worker_id=fixture-train",
        "--mesh_fsdp=8",
        "--model_name=Qwen3-30B-A3B",
        "--max_prompt_length=1024",
        "--max_response_length=3072",
        "--optimizer_chain_kwargs={'max_norm': 0.125}",
        "--trainable_parameters_mask=^(?!.*gate).*",
    ]
    assert "2>&1" not in env["TRAINER_ARGV"]


def test_orchestrator_argv_comes_from_the_orchestrator_jobset_or_the_knob():
    assert exports(render_fixture())["ORCH_ARGV"] == (
        "--discovery_id=fixture-orch --batch_size=8 --num_generations=4"
    )
    assert exports(render_fixture(orch_argv="--batch_size=2"))["ORCH_ARGV"] == "--batch_size=2"


def test_trainer_argv_knob_replaces_the_parsed_flags():
    argv = "--model_name=Qwen3-30B-A3B --mesh_fsdp=8 --max_prompt_length=8 --max_response_length=8"
    env = exports(render_fixture(trainer_argv=f"{argv} --x='a b'"))
    assert shlex.split(env["TRAINER_ARGV"]) == [*argv.split(), "--x=a b"]


def test_engine_flags_reach_the_pod_as_given_and_the_last_one_wins():
    env = exports(render_fixture(engine_flags=" a=1,b=2 a=3 "))
    assert env["ENGINE_FLAGS"] == "a=1,b=2 a=3"
    assert parse_engine_flags(env["ENGINE_FLAGS"]) == {"a": "3", "b": "2"}


def test_libtpu_flags_merge_keeping_unrelated_and_overriding_given():
    env = exports(render_fixture(libtpu_flags="--xla_b=false --xla_c=7"))
    assert env["LIBTPU_INIT_ARGS"] == "--xla_a=1 --xla_b=false --xla_c=7"


def test_libtpu_flags_are_created_when_the_trainer_had_none():
    text = FIXTURE.read_text().replace("LIBTPU_INIT_ARGS='--xla_a=1 --xla_b=true' ", "")
    knobs = RenderKnobs.from_strings({"libtpu_flags": "--xla_c=1"})
    assert exports(load_manifest(render(text, "f", knobs)))["LIBTPU_INIT_ARGS"] == "--xla_c=1"


def test_step_knobs_are_exported_only_when_given():
    env = exports(render_fixture(steps="5", micro_steps="3", profile_steps="2-3"))
    assert (env["STEPS"], env["MICRO_STEPS"], env["PROFILE_STEPS"]) == ("5", "3", "2:3")
    assert not {"STEPS", "MICRO_STEPS", "PROFILE_STEPS"} & set(exports(render_fixture()))


def test_max_restarts_defaults_to_zero_and_is_a_knob():
    assert render_fixture()["spec"]["failurePolicy"] == {
        "restartStrategy": "Recreate",
        "maxRestarts": 0,
    }
    assert render_fixture(max_restarts="4")["spec"]["failurePolicy"]["maxRestarts"] == 4


def test_driver_env_values_are_exported_literally():
    env = exports(render_fixture(driver_env="""A='x $(touch /tmp/p) `id`' B="it's" C="""))
    assert (env["A"], env["B"], env["C"]) == ("x $(touch /tmp/p) `id`", "it's", "")


def test_trainer_slice_moves_selectors_hosts_chips_and_instance_type_together():
    # 128 chips = 256 devices: the trainer's mesh (8 devices) moves with the slice, or the pod
    # would refuse it.
    bench = render_fixture(trainer_slice="tpu7x:4x4x8", engine_flags="mesh_context=32")
    changes = diff(_trainer(), bench)
    assert unexpected(changes, {"names", "restarts", "command", "provenance", "slice"}) == []
    for job in ("proc", "pw-node"):
        assert _pod(bench, job)["nodeSelector"] == {
            "cloud.google.com/gke-tpu-accelerator": "tpu7x",
            "cloud.google.com/gke-tpu-topology": "4x4x8",
        }
    assert _job(bench, "pw-node")["template"]["spec"]["completions"] == 32
    assert _job(bench, "pw-node")["template"]["spec"]["parallelism"] == 32
    assert _container(bench, "pw-node", "pathways-worker")["resources"]["limits"] == {
        "google.com/tpu": "4"
    }
    assert "--instance_type=tpu7x:4x4x8" in _container(bench, "proc", "pathways-rm")["args"]
    assert bench["metadata"]["annotations"]["rl-trainer-bench/slice"] == "tpu7x:4x4x8"
    assert jobset_problems(bench) == []


def test_a_slice_the_trainers_mesh_does_not_fill_is_refused_at_render_time():
    with pytest.raises(UserError, match=r"TRAINER_SLICE=v5e:2x2 \(4 chips\) has 4: set mesh_fsdp"):
        render_fixture(trainer_slice="v5e:2x2")


def test_single_host_slice_gets_one_host_with_its_chips():
    bench = render_fixture(trainer_slice="v5e:2x2", engine_flags="mesh_fsdp=4")
    assert _job(bench, "pw-node")["template"]["spec"]["completions"] == 1
    assert jobset_problems(bench) == []


def test_name_knob_and_trainer_jobset_knob():
    bench = render_fixture(bench_name="my-bench", trainer_jobset="fixture-train")
    assert bench["metadata"]["name"] == "my-bench"
    env = {e["name"]: e.get("value") for e in _container(bench, "proc", "main")["env"]}
    assert env["TRAINER_HOST"] == "my-bench-proc-0-0.my-bench"


def test_long_trainer_name_is_shortened_to_fit_the_budgets_deterministically():
    long_name = "a-very-long-trainer-jobset-name"
    text = FIXTURE.read_text().replace("fixture-train", long_name)
    first = load_manifest(render(text, "f", RenderKnobs()))
    name = first["metadata"]["name"]
    assert name.endswith("-bench") and 2 * len(name) + len("proc") <= 57
    assert name == load_manifest(render(text, "f", RenderKnobs()))["metadata"]["name"]
    assert jobset_problems(first) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        ("   \n\n", "is empty"),
        ("kubectl delete jobset x\n---\n{a: [1, 2\n", "is not YAML"),
        ("just some words", "not a Kubernetes object"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n", "no JobSet"),
    ],
)
def test_bad_input_is_one_clear_error(text, message):
    with pytest.raises(UserError, match=message) as raised:
        render(text, "in.yaml", RenderKnobs())
    assert "\n" not in str(raised.value)


def test_non_yaml_noise_before_the_first_document_is_skipped():
    noise = "Warning: jobset x: missing: field\n- [unclosed\n"
    bench = load_manifest(render(noise + FIXTURE.read_text(), "f", RenderKnobs()))
    assert bench["metadata"]["name"] == "fixture-train-bench"


def test_trainer_without_client_container_is_refused():
    text = FIXTURE.read_text().replace("python -m app.trainer", "trainer-binary")
    with pytest.raises(UserError, match=r"fixture-train.*client containers"):
        render(text, "f", RenderKnobs.from_strings({"trainer_jobset": "fixture-train"}))
    with pytest.raises(
        UserError, match=r"no trainer JobSet.*fixture-train \(0 client containers\)"
    ):
        render(text, "f", RenderKnobs())


def test_a_named_trainer_is_held_to_the_trainer_checks():
    """--trainer-jobset chooses among JobSets; it waives no check: a named JobSet whose worker asks
    for no TPU (or has no Pathways head) is refused as the unnamed search refuses it."""
    no_tpus = FIXTURE.read_text().replace('google.com/tpu: "4"', 'example.com/gpu: "4"', 2)
    for knobs in ({"trainer_jobset": "fixture-train"}, {}):
        with pytest.raises(UserError, match=r"fixture-train.*no TPU workers.*Pathways trainer"):
            render(no_tpus, "f", RenderKnobs.from_strings(knobs))
    no_head = FIXTURE.read_text().replace("name: pathways-", "name: service-")
    with pytest.raises(UserError, match=r"JobSet fixture-train in f is not a Pathways trainer"):
        render(no_head, "f", RenderKnobs.from_strings({"trainer_jobset": "fixture-train"}))


def test_a_named_trainer_that_two_jobsets_share_is_refused_naming_the_clash():
    text = FIXTURE.read_text().replace("name: fixture-orch", "name: fixture-train", 1)
    knobs = RenderKnobs.from_strings({"trainer_jobset": "fixture-train"})
    with pytest.raises(UserError, match=r"2 JobSets of that name in f; .* remove or rename"):
        render(text, "f", knobs)


def test_a_trainer_across_several_slices_is_refused_not_cut_to_one():
    """The bench times one trainer slice; a trainer whose workers hold two (and whose Pathways
    starts two) runs its program over both, so cutting it would change its mesh."""
    text = FIXTURE.read_text().replace("--instance_count=1", "--instance_count=2")
    text = text.replace(
        "  - name: pw-node\n    replicas: 1\n", "  - name: pw-node\n    replicas: 2\n"
    )
    with pytest.raises(UserError, match=r"fixture-train in f spans 2 TPU slices \('pw-node' x2\)"):
        render(text, "f", RenderKnobs())


def test_unknown_trainer_jobset_lists_the_jobsets_found():
    with pytest.raises(UserError, match="found fixture-orch, fixture-train, fixture-roll"):
        render(FIXTURE.read_text(), "f", RenderKnobs.from_strings({"trainer_jobset": "nope"}))


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"bogus": "1"}, "unknown knob bogus"),
        ({"trainer_slice": "v9:2x2"}, "known forms are"),
        ({"steps": "0"}, "STEPS=0 is too small: use an integer >= 1"),
        ({"micro_steps": "x"}, "MICRO_STEPS"),
        ({"max_restarts": "-1"}, "MAX_RESTARTS"),
        ({"profile_steps": "a"}, "PROFILE_STEPS"),
        ({"engine_flags": "novalue"}, "ENGINE_FLAGS"),
        ({"driver_env": "1A=2"}, "DRIVER_ENV"),
        ({"driver_env": "STEPS=2"}, "DRIVER_ENV sets STEPS"),
        ({"driver_env": "A='unterminated"}, "fix its quoting"),
        ({"libtpu_flags": "notaflag"}, "LIBTPU_FLAGS"),
    ],
)
def test_bad_knobs_are_refused_with_the_knob_named(knobs, message):
    with pytest.raises(UserError, match=message):
        render(FIXTURE.read_text(), "f", RenderKnobs.from_strings(knobs))


@pytest.mark.parametrize("name", ["x" * 27, "Upper", "a_b", "-a"])
def test_name_over_budget_or_not_dns_is_refused(name):
    with pytest.raises(UserError, match=f"--name {name}"):
        render(FIXTURE.read_text(), "f", RenderKnobs.from_strings({"bench_name": name}))


def test_exported_and_prefixed_maxtext_variables_travel_with_the_trainer_flags():
    from rl_trainer_bench.launch.client_command import read_client_command, trainer_command_words

    script = (
        "export MAXTEXT_EXTRA_FLAGS='ragged_buffer_factor=2.0 mu_dtype=bfloat16'\n"
        "export UNRELATED=1\n"
        "REMAT_POLICY=custom LIBTPU_INIT_ARGS=--xla_a=1 python -m tunix.main --mesh_fsdp=8\n"
    )
    assert trainer_command_words(read_client_command(script)) == [
        "REMAT_POLICY=custom",
        "MAXTEXT_EXTRA_FLAGS=ragged_buffer_factor=2.0 mu_dtype=bfloat16",
        "--mesh_fsdp=8",
    ]
