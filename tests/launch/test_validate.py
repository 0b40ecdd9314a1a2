"""validate: the CRD schema (strict), null pruning, the webhook's name budgets, slice consistency."""

import copy

import pytest
import yaml
from render_helpers import FIXTURE, render_fixture

from rl_trainer_bench import cli
from rl_trainer_bench.launch.dry_run import find_trainer, read_documents
from rl_trainer_bench.launch.validate import jobset_problems


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


def test_wrong_api_version_is_refused():
    jobset = dict(_trainer(), apiVersion="jobset.x-k8s.io/v1alpha1")
    assert any("apiVersion" in p for p in jobset_problems(jobset))


@pytest.mark.parametrize(
    ("name", "budget"),
    [("a" * 27, "coordinator label"), ("B", "DNS-1035")],
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
