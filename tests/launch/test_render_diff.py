"""render-diff: named list items match by name, each change gets a kind, --expect-only fails on others."""

import copy

import yaml
from render_helpers import FIXTURE, render_fixture

from rl_trainer_bench import cli
from rl_trainer_bench.launch.diff import diff, format_path, unexpected
from rl_trainer_bench.launch.dry_run import find_trainer, read_documents


def _trainer() -> dict:
    return find_trainer(read_documents(FIXTURE.read_text(), "f"), "f")


def test_identical_documents_have_no_changes():
    assert diff(_trainer(), _trainer()) == []


def test_named_list_items_are_matched_by_name_not_position():
    before = _trainer()
    after = copy.deepcopy(before)
    after["spec"]["replicatedJobs"].reverse()
    assert diff(before, after) == []


def test_changes_are_classified_by_kind():
    before = _trainer()
    after = copy.deepcopy(before)
    pod = after["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][2]["image"] = "example.com/other:2"
    pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] = "2x2x4"
    after["spec"]["failurePolicy"]["maxRestarts"] = 3
    kinds = {format_path(c.path): c.kind for c in diff(before, after)}
    prefix = "spec.replicatedJobs[name=proc].template.spec.template.spec."
    assert kinds == {
        prefix + "containers[name=main].image": "other",
        prefix + "nodeSelector.cloud.google.com/gke-tpu-topology": "slice",
        "spec.failurePolicy.maxRestarts": "restarts",
    }


def test_expect_only_fails_when_anything_else_changed(tmp_path, capsys):
    bench = render_fixture()
    good = tmp_path / "bench.yaml"
    good.write_text(yaml.safe_dump(bench))
    kinds = "names,restarts,command,provenance"
    assert cli.main(["render-diff", str(FIXTURE), str(good), "--expect-only", kinds]) == 0
    bench["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["hostNetwork"] = (
        False
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(bench))
    assert cli.main(["render-diff", str(FIXTURE), str(bad), "--expect-only", kinds]) == 1
    assert "hostNetwork" in capsys.readouterr().err
    assert unexpected(diff(_trainer(), bench), set(kinds.split(","))) != []


def test_unknown_expected_kind_is_a_user_error(tmp_path, capsys):
    assert cli.main(["render-diff", str(FIXTURE), str(FIXTURE), "--expect-only", "nmes"]) == 2
    assert "unknown kind nmes" in capsys.readouterr().err


def test_json_output_lists_every_change(tmp_path, capsys):
    bench = tmp_path / "bench.yaml"
    bench.write_text(yaml.safe_dump(render_fixture()))
    assert cli.main(["render-diff", str(FIXTURE), str(bench), "--json"]) == 0
    rows = yaml.safe_load(capsys.readouterr().out)
    assert {row["kind"] for row in rows} == {"names", "restarts", "command", "provenance"}
