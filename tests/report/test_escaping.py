"""Text from run folders reaches a paper's LaTeX and report.md as text: every LaTeX special in
every string that reaches ``table.tex`` (cells, headers and the caption) is escaped, and
report.md shows run ids, labels and notes without raw HTML or a ``|`` that splits a table.
Nothing is compiled: the text is read back and un-escaped."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from suite.report.load import load_runs
from suite.report.render import run_table, write_tables
from suite.report.tables import markdown_text, to_markdown
from tests.report.varied_runs import REFERENCE

#: LaTeX's ten special characters, and one reading as a command
SPECIALS = "#$%&~_^\\{}"
#: each special as escaped text, the character it stands for
ESCAPED = {r"\textbackslash ": "\\", r"\textasciitilde ": "~", r"\textasciicircum ": "^",
           **{f"\\{c}": c for c in "#$%&_{}"}}
UNESCAPE = re.compile("|".join(re.escape(e) for e in ESCAPED))


def marked(field: str) -> str:
    """A field's value: the specials and a command, between markers naming the field."""
    return f"Q{field}q{SPECIALS}\\input{{x}}q{field}Q"


def copy_run(root: Path, run_id: str, method: str, fields: str) -> None:
    """A copy of the reference ddp run with every string a table shows set to ``marked``
    values (``fields`` tells them apart: a second run differs in each)."""
    source = next(p for p in REFERENCE.iterdir() if p.name.startswith("ddp-cnn"))
    target = root / run_id
    shutil.copytree(source, target)
    summary = json.loads((target / "summary.json").read_text())
    manifest = json.loads((target / "manifest.json").read_text())
    summary.update(run_id=run_id, method=method, workload=marked(f"workload{fields}"))
    manifest["config"].update(method=method, workload=summary["workload"])
    manifest["backend"] = marked(f"backend{fields}")  # the machine class: cpu-<backend>
    manifest["hardware"]["cpu_capability"] = ""
    manifest["network"] = {"mode": "emulated", "inter_bw": marked(f"link{fields}")}
    (target / "summary.json").write_text(json.dumps(summary))
    (target / "manifest.json").write_text(json.dumps(manifest))


def marked_texts(tex: str) -> dict[str, list[str]]:
    """Every marked value in ``tex``, un-escaped, by field; asserts that nothing between the
    markers is a LaTeX special left raw."""
    found: dict[str, list[str]] = {}
    for field, inner in re.findall(r"Q(\w+?)q(.*?)q\1Q", tex, flags=re.S):
        rest = UNESCAPE.sub("", inner)
        assert not set(rest) & set(SPECIALS), (field, inner)
        found.setdefault(field, []).append(UNESCAPE.sub(lambda m: ESCAPED[m.group()], inner))
    return found


def test_every_latex_special_of_every_string_in_table_tex_is_escaped(tmp_path):
    """One run (its workload, setting and machine class said once, in the caption) and two
    runs of another method name that differ in each (said in the cells): every marked value
    comes out escaped, as the words it was."""
    expected = SPECIALS + "\\input{x}"
    one, two = tmp_path / "one", tmp_path / "two"
    copy_run(one, "only", marked("methodA"), "A")
    copy_run(two, "first", marked("methodB"), "B")
    copy_run(two, "second", marked("methodB"), "C")
    for root, fields in ((one, ("workloadA", "backendA", "linkA")),
                         (two, ("methodB", "workloadB", "workloadC", "backendB", "backendC",
                                "linkB", "linkC"))):
        runs, _ = load_runs(root)
        out = root / "report"
        out.mkdir()
        write_tables(runs, out)
        tex = (out / "table.tex").read_text()
        found = marked_texts(tex)
        assert set(fields) <= set(found), (sorted(found), tex)
        assert all(text == expected for texts in found.values() for text in texts), found
        assert "\\input{x}" not in tex and "\\_" in tex
    caption = (one / "report" / "table.tex").read_text().split(r"\caption{")[1]
    assert "QworkloadAq" in caption and "QbackendAq" in caption  # said there, escaped


def test_report_md_shows_folder_text_as_text(tmp_path):
    """A run id with raw HTML, a ``|`` and a line break: report.md's tables keep their
    columns and nothing of it is markup."""
    copy_run(tmp_path, "run", "ddp", "A")
    folder = tmp_path / "run"
    hostile = "<img src=x onerror=alert(1)>|a\nb"
    summary = json.loads((folder / "summary.json").read_text())
    summary["run_id"] = hostile
    (folder / "summary.json").write_text(json.dumps(summary))
    runs, _ = load_runs(tmp_path)
    table = to_markdown(run_table(runs))
    lines = table.splitlines()
    assert len(lines) == 3 and len({line.count("|") - line.count("\\|") for line in lines}) == 1
    assert "<img" not in table and "&lt;img src=x onerror=alert(1)&gt;\\|a b" in table
    assert markdown_text("[x](javascript:1) `c`") == "\\[x\\](javascript:1) \\`c\\`"
