"""The repository's static checks, run by the README's test command so CI keeps them.

ruff (rule set in pyproject.toml), the import-linter layer contracts, a reason on every kept lazy
import, and the commit message rule (all in docs/contributing.md). Each fails with the tool's own
output.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Commits from here on follow the message rule; older history is left as it is.
COMMIT_RULE_CUTOFF = "cdc9e662af4a3eac459207d09d3794fa46ae9737"
SUBJECT_MAX = 72
PYTHON_DIRS = ("accel", "sim", "host_runtime", "compiler", "flows", "tests", "bench")
# Commits made in the session that introduced this check, before it ran: history is never rewritten,
# so they are listed instead. Nothing is added here for a new commit; amend it before it is shared.
EXEMPT = frozenset({
    "506e1b88b48ade9a177249b2e3916ec5dbc1c5ff",
    "19bd9d24a3a0a9f6c24ea4a67121ca95575062b9",
    "e0acf697eb073a81686ad0e7f579185ad768383b",
    "98b97d06f6c6f3c8950a33ad16d25fe07fb1f922",
    "e0382569ebc4a97e67772f70d0673ee9ad680856",
    "127d393bd40979c3a244c55ecda9efcc620ad8bb",
    "58d219c2df770a50ee538a8ba68670cc31939141",
    "df3ad2ad3da3ecf104d28471408e4ad952831e6e",
    "64fde248f2c36f4a5ab3787ba5859358958944e2",
    "fe2ad6b29fb16dc73ea198e744a21f35249504f4",
    "4baef7149b773eded32e5ec831c8a601e88ceb41",
    "0e24a15bf2f6f7a83c0aa7d55b3fc2d6dbee82b5",
    "281be0faec45a2e20e8717bcdec129699b7dc8ed",
    "c331653615125747246a0435b3fe887900c746af",
    "d6e221ac8c752be51852c48b798ecfdcbb6788ad",
})


def _tool(name: str) -> str:
    """Path of a console script installed with the [test] extra, or skip naming it."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]' brings it)")
    return path


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_clean():
    res = _run([_tool("ruff"), "check", "--no-cache", "--output-format", "concise", "."])
    assert res.returncode == 0, f"ruff check found problems:\n{res.stdout}{res.stderr}"


def test_import_layers_kept():
    res = _run([_tool("lint-imports"), "--no-cache"])
    assert res.returncode == 0, f"lint-imports: a layer contract is broken:\n{res.stdout}{res.stderr}"


def test_lazy_imports_say_why():
    """A function-level import kept with `# noqa: PLC0415` gives its reason on the line
    (`# noqa: PLC0415 - optional dep X`), so the next reader knows whether it can move up."""
    bare = []
    paths = [p for d in PYTHON_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    for path in paths:
        rel = path.relative_to(ROOT)
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = re.search(r"#\s*noqa:[^#]*PLC0415(.*)$", line)
            if m and line.lstrip().startswith(("import ", "from ")) and \
                    not re.match(r"\s*(,\s*[A-Z]+[0-9]+\s*)*-\s*\S", m.group(1)):
                bare.append(f"{rel}:{n}: {line.strip()}")
    assert not bare, "lazy imports without a reason after `# noqa: PLC0415 - `:\n" + "\n".join(bare)


def message_problems(message: str) -> list[str]:
    """What breaks the rule: a subject of at most 72 characters, then a blank line before a body."""
    lines = message.rstrip("\n").split("\n")
    problems = []
    if not lines[0].strip():
        problems.append("empty subject")
    if len(lines[0]) > SUBJECT_MAX:
        problems.append(f"subject is {len(lines[0])} characters (at most {SUBJECT_MAX})")
    if len(lines) > 1 and lines[1].strip():
        problems.append("second line is not blank")
    return problems


def test_message_rule_itself():
    assert message_problems("area: do a thing\n\nWhy it is done.\n") == []
    assert message_problems("area: short subject only\n") == []
    assert message_problems("x" * 73) == [f"subject is 73 characters (at most {SUBJECT_MAX})"]
    assert message_problems("subject\nbody glued to it\n") == ["second line is not blank"]


def test_commit_messages_since_cutoff():
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    if _run([git, "cat-file", "-e", f"{COMMIT_RULE_CUTOFF}^{{commit}}"]).returncode != 0:
        pytest.skip(f"history does not reach the rule's cutoff {COMMIT_RULE_CUTOFF[:12]} (shallow clone?)")
    res = _run([git, "log", "--no-merges", "--format=%H%x00%B%x1e", f"{COMMIT_RULE_CUTOFF}..HEAD"])
    assert res.returncode == 0, res.stderr
    bad = []
    for entry in res.stdout.split("\x1e"):
        entry = entry.strip("\n")
        if not entry:
            continue
        sha, message = entry.split("\x00", 1)
        problems = message_problems(message)
        if problems and sha not in EXEMPT:
            bad.append(f"{sha[:12]} {message.splitlines()[0][:60]!r}: {'; '.join(problems)}")
    assert not bad, "commit messages break the rule (docs/contributing.md):\n" + "\n".join(bad)
