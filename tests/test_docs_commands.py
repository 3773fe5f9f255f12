"""Every `capacity ...` command in a fenced code block of README.md and docs/*.md runs, as written.

The commands are extracted, not listed here, so a new documented command is covered without touching this file:

- in a fenced block with `$ ` lines, those lines are the commands (the rest is the output they printed);
- in any other fenced block, every line whose first word is `capacity` (or `.venv/bin/capacity`, or such a part
  of an `a && b` line) is a command; `\\` continues a line, `#` starts a comment.

A block's commands run in order, in one scratch folder that mirrors the repository root (so `examples/...`,
`models/...` resolve and files a command writes land in the scratch folder), with `capacity` the entry point of
the Python running the tests, COLUMNS=80 and the result cache off. Each must exit 0. A command is the argv bash
would give it (`capacity_parts` rejoins the words with `shlex.join`, so bash only splits them again), and it runs
through the real `main()` in this process (`tests/conftest.py` `run_cli`: that argv, environment and folder, its
exit code and output), fleet-day through `bash -c` as its own process (OWN_PROCESS); CAPACITY_TEST_SUBPROCESS=1
runs every one that way, and `test_a_command_prints_the_same_in_process_and_through_bash` checks the two agree
(docs/ci.md: about 1.5 s of interpreter start and imports per command, 55 commands).

Blocks of quick commands (memory, models, gpus, --help, ...) run in the default suite; any block with a
simulation in it is in the `slow` group (CI runs it with `pytest -m slow`). A block the docs mark with
`<!-- not run: REASON -->` on the line before its fence (a live server, a real engine) is skipped with that
reason, and listed by `test_blocks_not_run_are_listed`.
"""
from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted(Path(p) for p in glob.glob(str(ROOT / "docs" / "*.md")))]
# Commands that only read tables or solve the memory budget: seconds each, so they run in the default suite.
FAST = {"memory", "models", "gpus", "engines", "schema", "profiles", "step-cost", "fleet", "compare", "export",
        "trace"}
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
FENCE = re.compile(r"^\s*(```|~~~)(.*)$")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lines: list[str]
    not_run: str | None = None
    commands: list[str] = field(default_factory=list)
    output: list[str] = field(default_factory=list)  # what a `$ ` block shows its commands printed
    launch: str | None = None  # a `vllm serve` block right after it: the command the output printed

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def fast(self) -> bool:
        return all(is_fast(c) for c in self.commands)


def logical_lines(lines: list[str]) -> list[str]:
    out: list[str] = []
    buf = ""
    for raw in lines:
        s = raw.rstrip()
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        out.append(buf + s)
        buf = ""
    if buf:
        out.append(buf)
    return out


def capacity_parts(line: str) -> list[str]:
    """The `capacity ...` commands of one shell line (its `&&`/`;` parts that start with the entry point)."""
    line = line.strip()
    if not line or line.startswith("#"):
        return []
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return []
    parts: list[list[str]] = [[]]
    for w in words:
        if w in ("&&", ";", "||"):
            parts.append([])
        else:
            parts[-1].append(w)
    cmds = []
    for p in parts:
        while p and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", p[0]):  # VAR=value prefixes
            p = p[1:]
        if p and (p[0] == "capacity" or p[0].endswith("/capacity")):
            cmds.append(shlex.join(["capacity", *p[1:]]))
    return cmds


def extract(path: Path) -> list[Block]:
    text = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(text):
        m = FENCE.match(text[i])
        if not m:
            i += 1
            continue
        fence, start = m.group(1), i
        body: list[str] = []
        i += 1
        while i < len(text) and not text[i].strip().startswith(fence):
            body.append(text[i])
            i += 1
        i += 1  # the closing fence
        prev = next((text[j] for j in range(start - 1, -1, -1) if text[j].strip()), "")
        nr = NOT_RUN.search(prev)
        b = Block(path, start + 1, body, nr.group(1) if nr else None)
        if any(ln.startswith("$ ") for ln in body):
            lines = []
            k = 0
            while k < len(body):
                if body[k].startswith("$ "):
                    cmd = [body[k][2:]]
                    while cmd[-1].rstrip().endswith("\\") and k + len(cmd) < len(body):
                        cmd.append(body[k + len(cmd)])
                    lines += logical_lines(cmd)
                    k += len(cmd)
                else:
                    b.output.append(body[k].rstrip())
                    k += 1
        else:
            lines = logical_lines(body)
        for ln in lines:
            b.commands += capacity_parts(ln)
        if blocks and blocks[-1].output and " ".join(body).startswith("vllm serve "):
            blocks[-1].launch = " ".join(" ".join(logical_lines(body)).split())
        blocks.append(b)
    return blocks


def all_blocks() -> list[Block]:
    return [b for p in DOC_FILES for b in extract(p) if b.commands]


def is_fast(cmd: str) -> bool:
    words = shlex.split(cmd)
    return "--help" in words or len(words) < 2 or words[1] in FAST


BLOCKS = all_blocks()


def _same_as(b: Block) -> Block | None:
    """A block of exactly the commands of another that runs and checks more (its pasted output): run once."""
    if b.output or b.launch:
        return None
    return next((o for o in BLOCKS if o is not b and not o.not_run and o.commands == b.commands
                 and (o.output or BLOCKS.index(o) < BLOCKS.index(b))), None)


def _param(b: Block):
    marks = []
    if b.not_run:
        marks.append(pytest.mark.skip(reason=f"not run ({b.not_run})"))
    elif (twin := _same_as(b)) is not None:
        marks.append(pytest.mark.skip(reason=f"the same commands run as {twin.id}"))
    if not b.fast:
        marks.append(pytest.mark.slow)
    return pytest.param(b, id=b.id, marks=marks)


def scratch_root(tmp: Path) -> Path:
    """A folder that looks like the repository root: every top-level entry linked, a `capacity` shim on PATH."""
    work = tmp / "root"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in (".git", ".venv", "out"):
            continue
        (work / entry.name).symlink_to(entry)
    bindir = tmp / "bin"
    bindir.mkdir()
    shim = bindir / "capacity"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "from capacity.cli import main; main()" "$@"\n')
    shim.chmod(0o755)
    return work


# Subcommands that still run as their own process: fleet-day's example runs a process pool for minutes (its
# interpreter start is under 1% of it), which this test process should not fork and hold.
OWN_PROCESS = {"fleet-day"}


def run_documented(cmd: str, work: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """One documented command, as `bash -c cmd` in `work` would run it: in this process (the same argv, environment
    and folder), or through bash for OWN_PROCESS and under CAPACITY_TEST_SUBPROCESS=1."""
    words = shlex.split(cmd)
    if os.environ.get("CAPACITY_TEST_SUBPROCESS") or (len(words) > 1 and words[1] in OWN_PROCESS):
        return subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    assert words[0] == "capacity", cmd
    return run_cli(*words[1:], timeout=timeout, cwd=work, env=env)


def _documented_env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, COLUMNS="80", CAPACITY_CACHE_DIR="off",
                PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_documented_commands_run_as_written(block: Block, tmp_path):
    work = scratch_root(tmp_path)
    env = _documented_env(tmp_path)
    printed: list[str] = []
    for cmd in block.commands:
        r = run_documented(cmd, work, env, timeout=120 if is_fast(cmd) else 1800)
        assert r.returncode == 0, f"{block.id}: `{cmd}` exited {r.returncode}\n{r.stderr[-3000:]}\n{r.stdout[-2000:]}"
        assert "Traceback" not in r.stderr, f"{block.id}: `{cmd}`\n{r.stderr[-3000:]}"
        printed += [ln.rstrip() for ln in r.stdout.splitlines()]
    # The output a document shows is what the commands print today: every line shown (`...` marks a cut) starts
    # a printed line (a line cut at 80 columns is a prefix), in order. Rerun the command and paste when it moves.
    at = 0
    for shown in block.output:
        if shown.strip() in ("", "..."):
            continue
        hit = next((i for i in range(at, len(printed)) if printed[i].startswith(shown)), None)
        assert hit is not None, f"{block.id}: the document shows a line the command no longer prints:\n{shown}\n" \
            f"printed:\n" + "\n".join(printed[:60])
        at = hit + 1
    if block.launch:  # the `vllm serve` block after the output is the command the plan printed
        assert any(" ".join(ln.split()) == block.launch for ln in printed), (block.launch, printed[:12])


def test_the_extraction_finds_the_documented_commands():
    """The parser sees what a reader sees: the README's questions, `$ ` lines in output blocks, `&&` parts."""
    ids = {b.id.split(":")[0] for b in BLOCKS}
    assert "README.md" in ids and "docs/fleet.md" in ids
    readme = [c for b in BLOCKS if b.path.name == "README.md" for c in b.commands]
    assert any(c.startswith("capacity plan -m llama-3.1-70b") for c in readme)
    assert capacity_parts("python3 -m venv .venv && .venv/bin/capacity plan --model m.yaml  # comment") \
        == ["capacity plan --model m.yaml"]
    assert capacity_parts("CAPACITY_CACHE_DIR=off capacity gpus") == ["capacity gpus"]
    b = Block(ROOT / "README.md", 1, [])
    assert is_fast("capacity memory -m x") and not is_fast("capacity plan -m x") and is_fast("capacity plan --help")
    assert b.fast  # no commands: nothing slow


def test_blocks_not_run_are_listed():
    """Only blocks that need what CI lacks (a live server, a real engine) are marked not run, each with its
    reason; this prints them so the list stays short and visible."""
    skipped = [(b.id, b.not_run) for b in BLOCKS if b.not_run]
    for bid, reason in skipped:
        print(f"not run: {bid}: {reason}")
        assert reason.startswith("needs "), (bid, reason)
    assert len(skipped) <= 3, skipped


def test_every_example_file_the_docs_name_is_shipped():
    """`examples/...` in any document is a file in the repository (issue 48: day.yaml and fleet.yaml were not)."""
    missing = []
    for p in DOC_FILES:
        for m in re.finditer(r"(?<![\w/])examples/[\w./-]*\w", p.read_text()):
            if not (ROOT / m.group(0)).exists():
                missing.append(f"{p.relative_to(ROOT)}: {m.group(0)}")
    assert not missing, missing


def test_the_readme_starts_with_the_two_commands_and_ci_runs_the_second():
    """The README opens with the main job and the tests, each one command on a fresh machine; `.ci/run` runs the
    test command verbatim (keep them in sync)."""
    readme = extract(ROOT / "README.md")
    first, second = ("\n".join(b.lines).strip() for b in readme[:2])
    assert first.startswith("python3 -m venv .venv && ") and "capacity plan" in first
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    at = next(i for i, ln in enumerate(ci) if "README's test command" in ln)
    ci_cmd = next(ln for ln in ci[at + 1:] if ln.startswith("python3 -m venv"))
    assert second == ci_cmd.strip()
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_the_readme_output_fits_80_columns():
    """The output pasted in the README is as the commands print it at 80 columns."""
    wide = [(b.id, ln) for b in extract(ROOT / "README.md")[2:] for ln in b.lines if len(ln) > 80]
    assert not wide, wide


def test_no_documented_command_escapes_the_extraction():
    """A fenced line that reads as a `capacity` command (`python -m capacity plan`, `x | capacity ...`) but that
    the extraction does not turn into one fails here, so it is written the way the test runs it."""
    missed = []
    for p in DOC_FILES:
        for b in extract(p):
            lines = [] if b.output or any(ln.startswith("$ ") for ln in b.lines) else logical_lines(b.lines)
            for ln in lines:
                code = "" if ln.lstrip().startswith("#") else ln.split(" #")[0]
                if re.search(r"(^|[\s;&|(])(\S*/)?capacity\s+[a-z-]", code) and not capacity_parts(ln):
                    missed.append(f"{b.id}: {ln.strip()}")
    assert not missed, missed


def test_a_command_prints_the_same_in_process_and_through_bash(tmp_path):
    """What lets the documented commands run in this process: a documented command (the README's memory answer,
    a table and its notes) and a refused one print the same, byte for byte, with the same exit code, in process as
    through `bash -c` and the `capacity` shim, in the scratch folder."""
    work = scratch_root(tmp_path)
    env = _documented_env(tmp_path)
    readme = next(c for b in BLOCKS if b.path.name == "README.md" for c in b.commands if c.startswith("capacity memory"))
    for cmd in (readme, "capacity memory -m no-such-model"):
        a = run_documented(cmd, work, env, timeout=120)
        b = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr), cmd
    assert a.returncode == 1 and a.stderr.startswith("error: ")
