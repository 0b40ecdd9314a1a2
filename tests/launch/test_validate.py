"""validate: null pruning, the webhook's defaults, the CRD schema (strict), list keys, the webhook's
name budgets, container names, slice consistency; every file reported, never a traceback."""

import copy

import pytest
import yaml
from render_helpers import FIXTURE, load_manifest, render_fixture

from rl_trainer_bench import cli
from rl_trainer_bench.launch.dry_run import find_trainer, read_documents
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render
from rl_trainer_bench.launch.validate import admitted_tree, jobset_problems


def _trainer() -> dict:
    return find_trainer(read_documents(FIXTURE.read_text(), "f"), "f")


def _proc_pod(jobset: dict) -> dict:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_launcher_trainer_with_null_annotations_is_valid():
    assert _trainer()["metadata"]["annotations"] is None
    assert jobset_problems(_trainer()) == []


def test_unknown_field_is_refused_as_strict_kubectl_would():
    jobset = _trainer()
    _proc_pod(jobset)["nodeSelectr"] = {}
    assert any("nodeSelectr" in p for p in jobset_problems(jobset))


def test_fractional_cpu_quantity_is_refused():
    jobset = _trainer()
    _proc_pod(jobset)["containers"][0]["resources"]["limits"]["cpu"] = 0.5
    assert any("limits" in p for p in jobset_problems(jobset))


def test_integers_past_the_widths_the_api_server_stores_are_refused():
    """The CRD marks its integers int32 or int64; JSON Schema checks a format only with a checker
    for it, so 2^31 replicas passed the schema and only the API server refused them."""
    jobset = _trainer()
    job_spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    job_spec["backoffLimit"] = 2**31 - 1
    _proc_pod(jobset)["terminationGracePeriodSeconds"] = 2**63 - 1
    assert jobset_problems(jobset) == []
    job_spec["backoffLimit"] = 2**31
    _proc_pod(jobset)["terminationGracePeriodSeconds"] = -(2**63) - 1
    problems = jobset_problems(jobset)
    assert problems == [
        "$.spec.replicatedJobs[0].template.spec.backoffLimit: 2147483648 is past the int32 the API"
        " server stores (-2,147,483,648 to 2,147,483,647)",
        "$.spec.replicatedJobs[0].template.spec.template.spec.terminationGracePeriodSeconds:"
        " -9223372036854775809 is past the int64 the API server stores"
        " (-9,223,372,036,854,775,808 to 9,223,372,036,854,775,807)",
    ]


@pytest.mark.parametrize("name", ["ma\u00efn", "Main", "-main", "main_1", "m" * 64])
def test_a_container_name_the_api_server_refuses_is_refused(name):
    jobset = _trainer()
    _proc_pod(jobset)["containers"][0]["name"] = name
    (problem,) = jobset_problems(jobset)
    assert problem.startswith(
        f"$.spec.replicatedJobs[0].template.spec.template.spec.containers[0].name: {name!r} is"
        " not a DNS-1123 label"
    )
    _proc_pod(jobset)["containers"][0]["name"] = "m" * 63
    assert jobset_problems(jobset) == []


def test_worker_slices_must_agree_with_the_pathways_instance_count():
    """Pathways starts --instance_count slices; TPU worker jobs that hold another number (a
    second worker job, or replicas) describe a cluster it does not run."""
    jobset = _trainer()
    worker = next(job for job in jobset["spec"]["replicatedJobs"] if job["name"] == "pw-node")
    worker["replicas"] = 2
    assert jobset_problems(jobset) == [
        "the TPU worker jobs hold 2 slice(s) ('pw-node' x2) but Pathways --instance_count=1;"
        " make them agree"
    ]
    for container in _proc_pod(jobset)["containers"]:  # the Pathways head's job
        container["args"] = [
            "--instance_count=2" if arg == "--instance_count=1" else arg
            for arg in container.get("args") or []
        ]
    assert jobset_problems(jobset) == []


def test_wrong_api_version_is_refused():
    jobset = dict(_trainer(), apiVersion="jobset.x-k8s.io/v1alpha1")
    assert any("apiVersion" in p for p in jobset_problems(jobset))


@pytest.mark.parametrize(
    ("name", "budget"),
    [("a" * 27, "coordinator label"), ("1b", "DNS-1035")],
)
def test_name_budgets_are_checked(name, budget):
    jobset = copy.deepcopy(_trainer())
    jobset["metadata"]["name"] = name
    assert any(budget in p for p in jobset_problems(jobset))
    jobset["metadata"]["name"] = "a" * 26
    assert jobset_problems(jobset) == []


def test_pod_name_budget_without_coordinator():
    jobset = copy.deepcopy(_trainer())
    del jobset["spec"]["coordinator"]
    jobset["metadata"]["name"] = "a" * 45  # 45 + len("pw-node") + 1 + 1 = 54: fits
    assert jobset_problems(jobset) == []
    jobset["metadata"]["name"] = "a" * 46
    assert any("pod names" in p for p in jobset_problems(jobset))


def test_half_edited_slice_is_refused():
    jobset = _trainer()
    workers = jobset["spec"]["replicatedJobs"][1]["template"]["spec"]
    workers["completions"] = 4
    assert any("4 hosts x 4" in p for p in jobset_problems(jobset))
    jobset = _trainer()
    _proc_pod(jobset)["nodeSelector"]["cloud.google.com/gke-tpu-topology"] = "2x2x4"
    assert any("--instance_type" in p for p in jobset_problems(jobset))


def test_validate_command_exit_codes(tmp_path, capsys):
    good = tmp_path / "bench.yaml"
    good.write_text(yaml.safe_dump(render_fixture()))
    assert cli.main(["validate", str(good)]) == 0
    assert "valid" in capsys.readouterr().out
    bench = render_fixture()
    bench["spec"]["bogus"] = 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(bench))
    assert cli.main(["validate", str(bad)]) == 2
    error = capsys.readouterr().err
    assert "bogus" in error and error.count("\n") == 1
    assert cli.main(["validate", str(tmp_path / "missing.yaml")]) == 2


UNNAMED_RULES = FIXTURE.parent / "jobset_unnamed_failure_rules.yaml"


def _manifest() -> dict:
    return yaml.safe_load(UNNAMED_RULES.read_text())


def test_unnamed_failure_policy_rules_are_named_as_the_webhook_names_them():
    assert jobset_problems(_manifest()) == []
    tree = admitted_tree(_manifest())
    names = [rule["name"] for rule in tree["spec"]["failurePolicy"]["rules"]]
    assert names == ["failurePolicyRule0", "failurePolicyRule1"]


def test_webhook_defaults_fill_only_what_is_absent():
    manifest = _manifest()
    manifest["spec"]["failurePolicy"]["rules"][1]["name"] = "mine"
    manifest["spec"]["network"] = {"enableDNSHostnames": False}
    tree = admitted_tree(manifest)
    assert [r["name"] for r in tree["spec"]["failurePolicy"]["rules"]] == [
        "failurePolicyRule0",
        "mine",
    ]
    assert tree["spec"]["network"] == {
        "enableDNSHostnames": False,
        "publishNotReadyAddresses": True,
    }
    assert tree["spec"]["successPolicy"] == {"operator": "All"}
    assert tree["spec"]["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    driver, workers = (job["template"]["spec"] for job in tree["spec"]["replicatedJobs"])
    assert driver["completionMode"] == workers["completionMode"] == "Indexed"
    assert driver["template"]["spec"]["restartPolicy"] == "Never"
    assert workers["template"]["spec"]["restartPolicy"] == "OnFailure"


def test_a_rule_of_the_wrong_type_is_still_refused():
    manifest = _manifest()
    manifest["spec"]["failurePolicy"]["rules"][0] = "restart"
    assert any("rules[0]" in p for p in jobset_problems(manifest))


def test_unnamed_rules_in_a_trainer_still_render():
    anchor = "    replicatedJob: proc\n  failurePolicy:\n"
    assert FIXTURE.read_text().count(anchor) == 1
    trainer_text = FIXTURE.read_text().replace(
        anchor, anchor + "    rules:\n    - action: FailJobSet\n"
    )
    bench = load_manifest(render(trainer_text, "f", RenderKnobs.from_strings({})))
    assert "name" not in bench["spec"]["failurePolicy"]["rules"][0]
    assert jobset_problems(bench) == []


def _set(tree: dict, path: str, value: object) -> dict:
    node = tree
    *parents, last = path.split(".")
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return tree


_POD = "spec.replicatedJobs.0.template.spec.template.spec"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec", "oops"),
        ("metadata", "oops"),
        ("spec.replicatedJobs", "workers"),
        ("spec.replicatedJobs", ["workers"]),
        ("spec.replicatedJobs.0.template", "oops"),
        (f"{_POD}.containers", "oops"),
        (f"{_POD}.nodeSelector", "oops"),
        ("spec.coordinator", "oops"),
        ("spec.failurePolicy", ["oops"]),
        ("spec.network", 3),
    ],
)
def test_a_wrong_typed_part_is_reported_by_the_schema_not_walked(tmp_path, capsys, path, value):
    for jobset in (_trainer(), render_fixture()):
        problems = jobset_problems(_set(copy.deepcopy(jobset), path, value))
        assert problems and all(p.startswith(("$", "apiVersion")) for p in problems)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_set(render_fixture(), path, value)))
    assert cli.main(["validate", str(bad)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_duplicate_keys_of_keyed_lists_are_refused():
    jobset = _manifest()
    jobs = jobset["spec"]["replicatedJobs"]
    jobs[1]["name"] = "driver"
    problems = jobset_problems(jobset)
    assert any("replicatedJobs[1]: duplicate entry name='driver'" in p for p in problems)
    jobset = _manifest()
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"].append(dict(pod["containers"][0]))
    assert any("containers[1]: duplicate entry name='driver'" in p for p in jobset_problems(jobset))


def test_every_file_is_reported_and_non_utf8_is_one_line(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(UNNAMED_RULES.read_text())
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"apiVersion: \xff\xfe\n")
    missing = tmp_path / "missing.yaml"
    assert cli.main(["validate", str(binary), str(good), str(missing), str(good)]) == 2
    captured = capsys.readouterr()
    assert captured.out.count("retry-on-eviction: valid") == 2
    errors = captured.err.splitlines()
    assert len(errors) == 2 and "not UTF-8" in errors[0] and "cannot read" in errors[1]


_BOMB = "\n".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]"
    for previous, name in zip("abcdefg", "bcdefgh", strict=False)
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("&a [*a]\n", "alias to one of its own ancestors"),
        ("kind: JobSet\nmetadata: &m {name: x, labels: *m}\n", "alias to one of its own"),
        ("kind: JobSet\nspec: " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
        ("kind: JobSet\nspec: " + "[" * 80 + "]" * 80 + "\n", "nests deeper than 64"),
        ("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + _BOMB + "\nkind: JobSet\n", "over 1000000"),
    ],
)
def test_yaml_that_no_walker_survives_is_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
