"""The user's YAML is read strictly about keys and leniently about line ends, by every command."""

import pytest
from render_helpers import FIXTURE

from rl_trainer_bench import cli
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch import yaml_reader
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render

# The fixture's trainer JobSet names itself on line 42; a second `name:` two lines below it is the
# hand edit that used to render a bench whose references still named the first.
_TRAINER_NAME = "  name: fixture-train\n"
_TWICE_NAMED = FIXTURE.read_text().replace(
    _TRAINER_NAME, _TRAINER_NAME + "  namespace: bench-ns\n  name: other-train\n", 1
)


def test_the_fixture_trainer_name_is_where_the_duplicate_tests_expect_it():
    assert FIXTURE.read_text().splitlines()[41] == _TRAINER_NAME.rstrip("\n")


def test_a_render_of_a_trainer_named_twice_is_refused_with_both_lines():
    with pytest.raises(UserError) as raised:
        render(_TWICE_NAMED, "launch.yaml", RenderKnobs())
    assert str(raised.value) == (
        "launch.yaml: line 44, column 3: the key 'name' appears twice in one mapping "
        "(first at line 42, column 3); keep one"
    )


@pytest.mark.parametrize("command", ["validate", "render-diff", "config-diff", "render"])
def test_every_command_that_reads_the_users_yaml_refuses_a_repeated_key(command, tmp_path, capsys):
    path = tmp_path / "launch.yaml"
    path.write_text(_TWICE_NAMED)
    argv = {
        "validate": ["validate", str(path)],
        "render-diff": ["render-diff", str(FIXTURE), str(path)],
        "config-diff": ["config-diff", str(path), "a=1"],
        "render": ["render", "--launch-render", str(path), "--output", str(tmp_path / "o.yaml")],
    }[command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 44, column 3: the key 'name' appears twice" in err
    assert not (tmp_path / "o.yaml").exists()


@pytest.mark.parametrize(
    ("written", "reads_as"),
    [("yes", "a boolean (True)"), ("8080", "an integer (8080)"), ("~", "null (None)")],
)
@pytest.mark.parametrize("command", ["validate", "render"])
def test_a_key_yaml_reads_as_no_string_is_refused_where_it_is_written(
    command, written, reads_as, tmp_path, capsys
):
    """YAML 1.1 reads an unquoted `yes:` or `8080:` as a boolean or an integer; a Kubernetes
    object's keys are strings, so the line says where and to quote it (it was an internal
    error where the render sorted the object's keys)."""
    selector = "            nodeSelector:\n"
    text = FIXTURE.read_text().replace(selector, f"{selector}              {written}: x\n", 1)
    path = tmp_path / "launch.yaml"
    path.write_text(text)
    out = tmp_path / "o.yaml"
    argv = {
        "validate": ["validate", str(path)],
        "render": ["render", "--launch-render", str(path), "--output", str(out)],
    }[command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (
        f"line 77, column 15: the key {written} reads as {reads_as}, and a Kubernetes object's"
        f" keys are strings; quote it: '{written}'" in err
    )
    assert not out.exists()
    quoted = text.replace(f"{written}: x", f"'{written}': x", 1)
    path.write_text(quoted)
    assert cli.main(argv) == 0  # quoted, the same key is a string


def test_a_repeated_key_in_a_yaml_mapping_of_flags_is_refused(tmp_path, capsys):
    flags = tmp_path / "flags.yaml"
    flags.write_text("base_emb_dim: 4096\nnum_experts: 512\nbase_emb_dim: 2048\n")
    assert cli.main(["config-diff", str(flags), "base_emb_dim=4096"]) == 2
    err = capsys.readouterr().err
    assert "line 3, column 1: the key 'base_emb_dim' appears twice" in err
    assert "(first at line 1, column 1)" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("a: {x: 1, y: 2, x: 3}\n", "x", 1),  # flow mapping
        ("- name: a\n  image: i\n  name: b\n", "name", 3),  # inside a list
        ("1: a\n1.0: b\n", 1.0, 2),  # equal as Python compares them: one would replace the other
        ('"k": 1\nk: 2\n', "k", 2),  # quoted and plain spellings of one key
        ("? [1, 2]\n: a\n? [1, 2]\n: b\n", (1, 2), None),  # sequences as keys are unhashable
    ],
)
def test_repeats_are_found_in_every_mapping_form(text, key, line):
    if line is None:
        with pytest.raises(Exception, match="unhashable"):
            yaml_reader.load(text)
        return
    with pytest.raises(yaml_reader.DuplicateKeyError) as raised:
        yaml_reader.load(text)
    assert raised.value.key == key
    assert yaml_reader.describe(raised.value).startswith(f"line {line}, ")


def test_a_key_beside_a_merge_overrides_the_merged_one():
    text = "base: &b {image: old, cpu: 1}\npod:\n  <<: *b\n  image: new\n"
    assert yaml_reader.load(text)["pod"] == {"image": "new", "cpu": 1}
    with pytest.raises(yaml_reader.DuplicateKeyError):
        yaml_reader.load(text + "  image: newer\n")


def test_lines_of_a_later_document_are_counted_in_the_whole_file():
    text = "---\na: 1\n---\nkind: JobSet\nmetadata: {name: x}\nkind: Pod\n"
    with pytest.raises(UserError, match=r"f: line 6, column 1: the key 'kind'"):
        render(text, "f", RenderKnobs())


_LF = FIXTURE.read_text()


@pytest.mark.parametrize(
    "variant",
    [
        _LF.replace("\n", "\r\n"),
        _LF.replace("\n", "\r"),
        "\ufeff" + _LF,
        "\ufeff" + _LF.replace("\n", "\r\n"),
        # mixed: a file edited on two systems
        "\r\n".join(_LF.split("\n")[:60]) + "\r\n" + "\n".join(_LF.split("\n")[60:]),
    ],
    ids=["crlf", "cr", "bom", "bom-crlf", "mixed"],
)
def test_windows_and_old_mac_line_ends_render_as_the_lf_file_byte_for_byte(variant):
    assert render(variant, "f", RenderKnobs()) == render(_LF, "f", RenderKnobs())


def test_crlf_files_validate_and_report_errors_at_the_users_line(tmp_path, capsys):
    path = tmp_path / "launch.yaml"
    path.write_bytes(_TWICE_NAMED.replace("\n", "\r\n").encode())
    assert cli.main(["validate", str(path)]) == 2
    assert "line 44, column 3" in capsys.readouterr().err
    path.write_bytes(b"\xef\xbb\xbf" + _LF.replace("\n", "\r\n").encode())
    assert cli.main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.count(": valid") == 3


def test_a_crlf_flag_mapping_reads_as_the_lf_one(tmp_path, capsys):
    crlf = tmp_path / "crlf.yaml"
    crlf.write_bytes(b"\xef\xbb\xbfbase_emb_dim: 4096\r\nnum_experts: 512\r\n")
    assert cli.main(["config-diff", str(crlf), "base_emb_dim=4096 num_experts=512"]) == 0
