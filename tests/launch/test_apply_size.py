"""The manifest's size as `kubectl apply` stores it, and the render's refusal past the API's limit."""

from __future__ import annotations

import json

from render_helpers import FIXTURE, load_manifest

from rl_trainer_bench import cli
from rl_trainer_bench.launch import apply_size


def test_the_stored_copy_is_compact_sorted_json_with_gos_html_escapes():
    document = {
        "kind": "JobSet",
        "metadata": {
            "name": "a",
            "annotations": {"x": "<&>", apply_size.LAST_APPLIED: "an older copy"},
        },
    }
    # Written out by hand as Go's encoding/json writes it (the older copy left out):
    stored = '{"kind":"JobSet","metadata":{"annotations":{"x":"\\u003c\\u0026\\u003e"},"name":"a"}}'
    assert apply_size.last_applied_json(document) == stored
    assert json.loads(stored)["metadata"]["annotations"]["x"] == "<&>"
    # len("x") + len("<&>") for the other annotation, then the key and value kubectl adds
    assert apply_size.stored_annotation_bytes(document) == 1 + 3 + 48 + len(stored)
    assert len(apply_size.LAST_APPLIED) == 48


def test_a_render_kubectl_apply_could_not_store_is_refused_in_one_line(tmp_path, capfd):
    output = tmp_path / "bench.yaml"
    big = "x" * 270_000  # one DRIVER_ENV value alone outgrows the annotations' limit
    code = cli.main(
        [
            "render",
            f"--launch-render={FIXTURE}",
            f"--output={output}",
            f"--driver-env=SOME_NOTE={big}",
        ]
    )
    err = capfd.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "once `kubectl apply` stores the object" in err and "--server-side" in err
    assert not output.exists()


def test_the_render_says_how_large_the_stored_copy_is(tmp_path, capfd):
    output = tmp_path / "bench.yaml"
    assert cli.main(["render", f"--launch-render={FIXTURE}", f"--output={output}"]) == 0
    line = next(x for x in capfd.readouterr().err.splitlines() if x.startswith("render: manifest:"))
    size = apply_size.stored_annotation_bytes(load_manifest(output.read_text()))
    assert line.startswith(f"render: manifest: {size:,} bytes of annotations")
    assert 50_000 < size < apply_size.ANNOTATIONS_LIMIT
