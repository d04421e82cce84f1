"""Files poolctl writes stay right under hostile input (issue 31): a planted symlink at a
temporary name, a config that is itself a symlink, `init` into a folder with links, and a
value shared through a YAML anchor or merge key that an in-place edit would change for
another pool."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from poolctl.errors import UsageError
from poolctl.files import create_new, replace_file
from poolctl.home import write_private
from poolctl.runtime.fileedit import edit_scalar, set_scalar
from tests.unit.test_perf_fit import EXAMPLE
from tests.unit.test_perf_fit import results as results  # noqa: F401 (the fixture)
from tests.unit.test_simulate import one_line, poolctl_main


def test_a_symlink_planted_at_the_old_temporary_name_is_never_followed(tmp_path, monkeypatch,
                                                                       capsys, results):
    """`perf fit --write` (the same writer as `plan --search --write`, rollouts, records):
    the link and its target stay untouched, the config stays a regular file."""
    cfg = tmp_path / "poolctl.yaml"
    cfg.write_text(EXAMPLE.read_text())
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / ".poolctl.yaml.poolctl-tmp").symlink_to(victim)
    f = tmp_path / "result.jsonl"
    f.write_text(results)
    code, _, err = poolctl_main(monkeypatch, capsys, "perf", "fit", str(f), "-f", str(cfg),
                                "--cloud", "aws", "--write")
    assert code == 0, err
    assert victim.read_text() == "precious\n"
    assert not cfg.is_symlink() and "perf:" in cfg.read_text()
    assert (tmp_path / ".poolctl.yaml.poolctl-tmp").is_symlink()
    # nothing else left behind: the writer's own temporary file is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".poolctl.yaml.poolctl-tmp", "poolctl.yaml", "result.jsonl", "victim.txt"]


def test_a_config_that_is_a_symlink_stays_a_link_to_its_updated_target(tmp_path, monkeypatch,
                                                                       capsys, results):
    real = tmp_path / "configs" / "prod.yaml"
    real.parent.mkdir()
    real.write_text(EXAMPLE.read_text())
    os.chmod(real, 0o640)
    link = tmp_path / "poolctl.yaml"
    link.symlink_to(Path("configs") / "prod.yaml")
    f = tmp_path / "result.jsonl"
    f.write_text(results)
    code, _, err = poolctl_main(monkeypatch, capsys, "perf", "fit", str(f), "-f", str(link),
                                "--cloud", "aws", "--write")
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(Path("configs") / "prod.yaml")
    assert "perf:" in real.read_text() and real.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in real.parent.iterdir()) == ["prod.yaml"]


def test_a_dangling_or_looping_config_link_is_one_line(tmp_path):
    dangling = tmp_path / "poolctl.yaml"
    dangling.symlink_to(tmp_path / "elsewhere" / "gone.yaml")
    with pytest.raises(UsageError, match="a symlink to nothing that can be written"):
        replace_file(dangling, "x")
    assert not (tmp_path / "elsewhere").exists()
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    with pytest.raises(UsageError, match="a symlink to nothing"):
        replace_file(loop, "x")


def test_private_files_ignore_a_planted_temporary_name(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (home / ".state.json.poolctl-tmp").symlink_to(victim)
    write_private(home / "state.json", "{}", home)
    assert victim.read_text() == "precious"
    assert (home / "state.json").read_text() == "{}"
    assert (home / "state.json").stat().st_mode & 0o777 == 0o600


def test_create_new_refuses_a_dangling_symlink(tmp_path):
    (tmp_path / "f").symlink_to(tmp_path / "outside")
    with pytest.raises(FileExistsError):
        create_new(tmp_path / "f", "x")
    assert not (tmp_path / "outside").exists()


def test_init_into_a_dangling_symlink_writes_nothing_outside_dir(tmp_path, monkeypatch, capsys):
    d = tmp_path / "d"
    d.mkdir()
    outside = tmp_path / "outside.yaml"
    (d / "poolctl.yaml").symlink_to(outside)
    code, _, err = poolctl_main(monkeypatch, capsys, "init", "--dir", str(d))
    line = one_line(code, err)
    assert "--force" in line and "poolctl.yaml" in line
    assert not outside.exists() and sorted(p.name for p in d.iterdir()) == ["poolctl.yaml"]


def test_init_force_replaces_a_link_instead_of_writing_through_it(tmp_path, monkeypatch,
                                                                  capsys):
    d = tmp_path / "d"
    d.mkdir()
    outside = tmp_path / "outside.yaml"
    outside.write_text("mine\n")
    (d / "poolctl.yaml").symlink_to(outside)
    code, _, err = poolctl_main(monkeypatch, capsys, "init", "--dir", str(d), "--force")
    assert code == 0, err
    assert outside.read_text() == "mine\n"
    assert not (d / "poolctl.yaml").is_symlink() and "pools:" in (d / "poolctl.yaml").read_text()


def test_init_refuses_a_linked_folder_inside_dir(tmp_path, monkeypatch, capsys):
    d, elsewhere = tmp_path / "d", tmp_path / "elsewhere"
    d.mkdir()
    elsewhere.mkdir()
    (d / ".github").symlink_to(elsewhere)
    code, _, err = poolctl_main(monkeypatch, capsys, "init", "--dir", str(d))
    assert ".github is a symlink" in one_line(code, err)
    assert list(elsewhere.iterdir()) == [] and not (d / "poolctl.yaml").exists()


SHARED = """\
project: acme
x-serving: &serving
  image: vllm/vllm-openai:v0.11.0
  tensor_parallel: 1
pools:
  - name: a
    serving: *serving
  - name: b
    serving: *serving
  - name: c
    <<: &base
      model:
        id: m
    serving:
      <<: *serving
      max_num_seqs: 64
"""


@pytest.mark.parametrize(("path", "anchor"), [
    (("pools", 1, "serving", "tensor_parallel"), "serving"),  # b, through *serving
    (("pools", 0, "serving", "image"), "serving"),  # a: the same node
    (("x-serving", "tensor_parallel"), "serving"),  # the anchor itself: a and b would change
])
def test_a_value_shared_through_an_anchor_is_refused_naming_it(path, anchor):
    with pytest.raises(UsageError, match=rf"shared through the anchor &{anchor}") as e:
        edit_scalar(SHARED, path, "8", plain=True)
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match=rf"&{anchor}"):
        set_scalar(SHARED, path, "8", plain=True)


def test_a_key_that_comes_from_a_merge_key_is_refused_naming_the_anchor():
    with pytest.raises(UsageError, match=r"comes from the merge key `<<: \*base`|&base"):
        set_scalar(SHARED, ("pools", 2, "model", "id"), "n")


def test_a_key_beside_a_merge_key_is_written_in_that_mapping_only():
    """`serving: {<<: *serving, max_num_seqs: 64}`: a key written there overrides the merged
    one for pool c alone, which is what YAML means."""
    import yaml

    text, old, _ = set_scalar(SHARED, ("pools", 2, "serving", "tensor_parallel"), "8",
                              plain=True)
    assert old is None
    doc = yaml.safe_load(text)
    assert doc["pools"][2]["serving"]["tensor_parallel"] == 8
    assert doc["pools"][0]["serving"]["tensor_parallel"] == 1
    assert doc["pools"][1]["serving"]["tensor_parallel"] == 1


def test_plan_search_write_refuses_a_pool_whose_serving_is_an_alias(tmp_path, monkeypatch,
                                                                   capsys):
    """The issue's row: pool b's `serving` is pool a's; writing b's search result must not
    change a. Refused, naming the anchor; the file untouched."""
    from tests.unit.test_search import AZURE

    lines = EXAMPLE.read_text().splitlines(keepends=True)
    text = EXAMPLE.read_text().replace("    serving:\n", "    serving: &s\n", 1)
    pool = text[text.index("  - name: chat-70b"):]
    second = pool.replace("name: chat-70b", "name: b", 1)
    start = second.index("    serving: &s\n")
    end = start + len("    serving: &s\n")
    while second[end:].startswith("      "):
        end = second.index("\n", end) + 1
    second = second[:start] + "    serving: *s\n" + second[end:]
    cfg = tmp_path / "poolctl.yaml"
    cfg.write_text(text + second)
    before = cfg.read_text()
    trace = tmp_path / "t.csv"
    trace.write_text("".join(AZURE.read_text().splitlines(keepends=True)[:300]))
    assert lines  # the example is there to copy
    code, _, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(cfg), "--pool", "b",
                                "--cloud", "aws", "--traffic", str(trace), "--search",
                                "--write", "--json")
    line = one_line(code, err)
    assert "&s" in line, line
    assert cfg.read_text() == before
    json.loads(capsys.readouterr().out or "{}")


ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[H\u202e"


def test_a_bench_label_with_escape_sequences_is_printed_escaped(tmp_path, monkeypatch, capsys,
                                                               results):
    runs = [json.loads(line) for line in results.splitlines()]
    runs[0]["label"] = ESC
    f = tmp_path / "result.jsonl"
    f.write_text("".join(json.dumps(o) + "\n" for o in runs))
    code, out, err = poolctl_main(monkeypatch, capsys, "perf", "fit", str(f), "-f",
                                  str(EXAMPLE), "--cloud", "aws")
    assert code == 0, err
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in out and "\\u202e" in out
    assert not any(c in out + err for c in "\x1b\x07\u202e")


def test_init_dir_with_escape_sequences_is_printed_escaped(tmp_path, monkeypatch, capsys):
    d = tmp_path / f"d{ESC}"
    code, out, err = poolctl_main(monkeypatch, capsys, "init", "--dir", str(d))
    assert code == 0, err
    assert (d / "poolctl.yaml").is_file()
    assert "\\x1b[2J" in out and not any(c in out + err for c in "\x1b\x07\u202e")


def test_an_error_naming_an_outside_string_is_escaped_too(tmp_path, monkeypatch, capsys):
    code, _, err = poolctl_main(monkeypatch, capsys, "validate", "-f", str(tmp_path / ESC))
    line = one_line(code, err)
    assert "\\x1b" in line and "\x1b" not in err


def test_weights_manifest_refuses_a_file_whose_bytes_are_not_its_size(tmp_path, monkeypatch,
                                                                       capsys):
    """A link to a /proc file: its size reads 0, its bytes are many; the manifest would list
    0 bytes that `weights verify` (and every node) then rejects."""
    w = tmp_path / "w"
    w.mkdir()
    (w / "model.safetensors").write_bytes(b"x" * 10)
    (w / "status").symlink_to("/proc/self/status")
    code, _, err = poolctl_main(monkeypatch, capsys, "weights", "manifest", str(w))
    line = one_line(code, err)
    assert "status" in line and "0 bytes by its size" in line and "/proc" in line
    assert not (w / "manifest.json").exists()


@pytest.mark.parametrize("name", ["a\nb.bin", "tab\tname", "esc\x1b[2J"])
def test_weights_manifest_refuses_a_name_it_cannot_list_faithfully(tmp_path, monkeypatch,
                                                                   capsys, name):
    w = tmp_path / "w"
    w.mkdir()
    (w / "ok.bin").write_bytes(b"1")
    (w / name).write_bytes(b"2")
    code, _, err = poolctl_main(monkeypatch, capsys, "weights", "manifest", str(w))
    assert "cannot list faithfully" in one_line(code, err)
    assert not (w / "manifest.json").exists()


def test_weights_manifest_refuses_a_name_that_is_not_utf8(tmp_path, monkeypatch, capsys):
    w = tmp_path / "w"
    w.mkdir()
    (w / "ok.bin").write_bytes(b"1")
    with open(os.path.join(os.fsencode(w), b"bad\xff.bin"), "wb") as fh:
        fh.write(b"2")
    code, _, err = poolctl_main(monkeypatch, capsys, "weights", "manifest", str(w))
    assert "is not UTF-8" in one_line(code, err)


def test_weights_verify_reports_a_file_that_grew_past_its_size(tmp_path, monkeypatch, capsys):
    from poolctl.weights import verify, write_manifest

    w = tmp_path / "w"
    w.mkdir()
    (w / "a.bin").write_bytes(b"1234")
    write_manifest(w)
    (w / "a.bin").unlink()
    (w / "a.bin").symlink_to("/proc/self/status")  # size 0, bytes many
    doc = json.loads((w / "manifest.json").read_text())
    doc["files"]["a.bin"]["bytes"] = 0
    (w / "manifest.json").write_text(json.dumps(doc))
    got = verify(w)
    assert got.problems == ["a.bin: " + got.problems[0].split(": ", 1)[1]]
    assert "bytes read, manifest says 0" in got.problems[0]
