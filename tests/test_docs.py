"""The docs stay true to the repository: every relative link resolves, every ``python -m milestones`` command runs.

Links: README.md, AGENTS.md, docs/**/*.md and the markdown cells of notebooks/*.ipynb. A link's ``#anchor`` is
dropped before the check (anchors are not checked); http(s) and other URLs with a scheme are skipped; links
inside code are not links.

Commands: every command in README.md and docs/**/*.md, in a fenced code block or an inline code span, that
starts with ``python -m milestones`` (or ``.venv/bin/python -m milestones``). Each runs in a fresh process on the
CPU and must exit with status 0. To keep the whole file at about a minute of CPU time, a milestone's demo is run
* with ``--device cpu`` and the ``tiny`` preset (a hub id or a local checkpoint becomes ``tiny``: no network
  here), and
* with its size flags capped at ``SMALL`` (a flag the command leaves out is added when the demo has it);
so the test proves that the flags a page shows exist and that the code path runs, not the page's numbers.
``python -m milestones`` itself (the list, ``diff``) runs exactly as written, in this process (it builds no
model, and a new interpreter per command would cost seconds of imports each). A synopsis with placeholders
(``python -m milestones diff OLD NEW``, ``<name>``, ``...``) is not a command and is skipped. A ``serve``
command would block: it is started on a free loopback port instead, must answer HTTP within
``SERVE_START_S``, and is then stopped. Every run gets ``OMP_NUM_THREADS=1`` (on the tiny model threads only
contend) and the session's temporary tokenizer cache.

Also: the architecture diagram's script runs (into a temp dir) and every file, function and class its boxes
name exists; every Python solution in docs/workshop.md runs against the code.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import end_with_this_process, env_with_checkout

REPO = Path(__file__).resolve().parents[1]
LINKED_DOCS = [REPO / "README.md", REPO / "AGENTS.md", *sorted((REPO / "docs").rglob("*.md"))]
COMMAND_DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))

SMALL = {  # a demo's size flag -> the most it gets here (a list with any element above it: SMALL_LISTS)
    "--max-tokens": 4, "--min-tokens": 2, "--short-tokens": 2, "--long-tokens": 8, "--num-prompts": 4,
    "--prompt-len": 16, "--prompt-lens": 16, "--min-prompt-len": 8, "--max-prompt-len": 16,
    "--repeats": 1,  # demo.measure's timed rounds: one proves the path runs
    "--long-len": 256, "--decoder-tokens": 4,  # m07's long prompts and its decoders
    "--num-requests": 8,  # the servers' demos (m09, m11): streams at once
    "--timeline-steps": 2,  # m12's timed decode steps (fewer than --max-tokens)
}
SMALL_LISTS = {"--prompt-lens": "8,16"}  # what a list flag gets instead
COMMAND_TIMEOUT_S = 120
SERVE_START_S = 90

# ---- markdown ---------------------------------------------------------------------------------------------------

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+[\"'(][^)]*)?\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
HTML_LINK = re.compile(r"<(?:a|img|source)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def split_markdown(text: str) -> tuple[str, list[str]]:
    """(the prose with fenced code blocks blanked out, the lines of every fenced block)."""
    prose, code, fence = [], [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            prose.append("")
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            else:
                code.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), code


def link_targets(markdown: str) -> list[str]:
    """Every link and image target in ``markdown`` outside code."""
    prose = INLINE_CODE.sub("", split_markdown(markdown)[0])
    found = [m.group(1) for pattern in (LINK, REFERENCE, HTML_LINK) for m in pattern.finditer(prose)]
    return [t[1:-1] if t.startswith("<") and t.endswith(">") else t for t in found]


def broken_links(markdown: str, base: Path) -> list[str]:
    """Relative targets in ``markdown`` (a file in ``base``) whose file does not exist, anchor dropped."""
    broken = []
    for target in link_targets(markdown):
        if SCHEME.match(target) or target.startswith("#"):
            continue
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        resolved = REPO / path.lstrip("/") if path.startswith("/") else base / path
        if not resolved.exists():
            broken.append(target)
    return broken


def notebook_markdown(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


# ---- commands ---------------------------------------------------------------------------------------------------

COMMAND_START = re.compile(r"^(?:\$\s+)?((?:\w+=\S*\s+)*(?:\S*/)?python3?\s+-m\s+milestones(?:[.\s]|$).*)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|<[^>]+>|\.\.\.|^\[.*\]$")
OPERATORS = {"|", "||", "&", "&&", ";", ">", ">>", "<", ">&", "&>", "2>&1"}


@dataclass(frozen=True)
class DocCommand:
    """One command as a page writes it, parsed: environment assignments, the module, its arguments."""

    source: str  # "docs/m02-kv-cache.md: .venv/bin/python -m milestones.m02_kv_cache ..."
    env: tuple[tuple[str, str], ...]
    module: str
    args: tuple[str, ...]

    @property
    def is_demo(self) -> bool:
        return re.fullmatch(r"milestones\.m\d{2}_\w+", self.module) is not None


def parse_command(line: str, source: str) -> DocCommand | None:
    """A ``python -m milestones...`` command from one shell line (comments, pipes and redirections dropped)."""
    match = COMMAND_START.match(line.strip())
    if not match:
        return None
    written = re.split(r"\s[|;&>]", match.group(1).split("#")[0])[0].split()
    if any(PLACEHOLDER.search(word) for word in written[written.index("-m") + 1:]):
        return None  # a synopsis such as `python -m milestones diff OLD NEW`, not a command to run
    lexer = shlex.shlex(match.group(1), posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    tokens = []
    for token in lexer:
        if token in OPERATORS:
            break
        tokens.append(token)
    env = []
    while "=" in tokens[0] and not tokens[0].startswith("-"):
        env.append(tuple(tokens.pop(0).split("=", 1)))
    return DocCommand(f"{source}: {match.group(1).split('#')[0].strip()}", tuple(env), tokens[2], tuple(tokens[3:]))


def commands_in(markdown: str, source: str) -> list[DocCommand]:
    """Commands in fenced blocks (backslash continuations joined) and in inline code spans."""
    prose, code = split_markdown(markdown)
    lines = re.sub(r"\\\n\s*", " ", "\n".join(code)).splitlines()
    lines += [m.group(2) for m in INLINE_CODE.finditer(prose)]
    return [c for c in (parse_command(line, source) for line in lines) if c is not None]


def demo_flags(module: str, subcommand: tuple[str, ...] = ()) -> set[str]:
    """The flags a demo (or its ``subcommand``) accepts, from its own ``--help``; empty if that fails."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            importlib.import_module(f"{module}.__main__").main([*subcommand, "--help"])
    except SystemExit:
        pass
    except Exception:  # noqa: BLE001 - a broken demo fails in its own test, with its own traceback
        return set()
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out.getvalue()))


def _capped(flag: str, value: str) -> str:
    """``value`` if it is within ``SMALL[flag]`` (every element, for a list), else the small setting."""
    parts = value.split(",")
    if not all(p.strip().isdigit() for p in parts) or all(int(p) <= SMALL[flag] for p in parts):
        return value
    return SMALL_LISTS.get(flag, str(SMALL[flag]))


def options(args: list[str] | tuple[str, ...], takes_value: set[str]) -> list[tuple[str, str | None]]:
    """``args`` as (token, value) pairs: ``--flag value`` and ``--flag=value`` for the flags in ``takes_value``."""
    pairs, rest = [], list(args)
    while rest:
        token = rest.pop(0)
        flag, equals, value = token.partition("=")
        if flag in takes_value and equals:
            pairs.append((flag, value))
        elif token in takes_value and rest:
            pairs.append((token, rest.pop(0)))
        else:
            pairs.append((token, None))
    return pairs


def runnable_args(command: DocCommand, flags: set[str]) -> list[str]:
    """A demo's arguments made small and CPU-only (see the module docstring); other commands' unchanged.

    The result is in one order (the command's other arguments, then the size flags in ``SMALL``'s order, then
    ``--model tiny --device cpu``), so commands that differ only in what was capped run once. A ``serve``
    command loses its ``--host`` and ``--port`` (the test picks them) and gets no size flags.
    """
    if not command.is_demo or {"--help", "-h"} & set(command.args):
        return list(command.args)
    serving = command.args[:1] == ("serve",)
    kept, sizes = [], {}
    for flag, value in options(command.args, {"--device", "--model", "--host", "--port", *SMALL}):
        if flag in ("--device", "--model", "--host", "--port"):
            continue  # set below, or by the test
        if flag in SMALL and value is not None and not serving:
            sizes[flag] = _capped(flag, value)
        else:
            kept += [flag] if value is None else [flag, value]
    args = kept
    for flag in SMALL:
        if flag in sizes or (flag in flags and not serving):
            args += [flag, sizes.get(flag, SMALL_LISTS.get(flag, str(SMALL[flag])))]
    return args + ["--model", "tiny"] * ("--model" in flags) + ["--device", "cpu"] * ("--device" in flags)


def doc_commands() -> list[DocCommand]:
    found = []
    for path in COMMAND_DOCS:
        found += commands_in(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers_http(process: subprocess.Popen, port: int, within_s: float) -> bool:
    """Whether a server started as ``process`` answers any HTTP request on ``port`` within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            return True
        except urllib.error.HTTPError:
            return True  # it answered, even if not with 200
        except OSError:
            time.sleep(0.3)
    return False


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ---- tests -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", LINKED_DOCS + NOTEBOOKS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(path: Path):
    text = notebook_markdown(path) if path.suffix == ".ipynb" else path.read_text(encoding="utf-8")
    assert broken_links(text, path.parent) == []


def test_the_link_checker_finds_broken_links_and_ignores_code_and_urls(tmp_path):
    (tmp_path / "here.md").write_text("x")
    page = ("[ok](here.md#part) ![img](<here.md>) [ref]: here.md\n[gone](missing.md#a) <img src=\"nope.png\">\n"
            "`[in code](nothere.md)` [web](https://example.com/x.md) [top](#top)\n```\n[fenced](absent.md)\n```\n")
    assert broken_links(page, tmp_path) == ["missing.md#a", "nope.png"]


def test_commands_are_parsed_from_code_blocks_and_spans():
    page = ("Run `python -m milestones.m02_kv_cache` or:\n\n```bash\n"
            "$ NO_COLOR=1 .venv/bin/python -m milestones diff \\\n"
            "    m01 m02 --stat | less -R   # a comment\n.venv/bin/python -m benchmarks.run\n```\n")
    assert commands_in("`python -m milestones diff OLD NEW` `python -m milestones.<mNN_idea>`", "p.md") == []
    commands = commands_in(page, "page.md")
    assert [(c.module, c.args, c.env) for c in commands] == [
        ("milestones", ("diff", "m01", "m02", "--stat"), (("NO_COLOR", "1"),)),
        ("milestones.m02_kv_cache", (), ()),
    ]
    flags = {"--device", "--model", "--max-tokens", "--prompt-lens"}
    big = DocCommand("x", (), "milestones.m01_naive_loop", ("--model", "Qwen/Qwen3-0.6B", "--max-tokens", "64",
                                                             "--device", "cuda", "--prompt-lens", "8,2048"))
    assert runnable_args(big, flags) == ["--max-tokens", "4", "--prompt-lens", "8,16", "--model", "tiny",
                                         "--device", "cpu"]
    kept = DocCommand("x", (), "milestones.m04_continuous_batching", ("--long-every", "4", "--max-tokens=3"))
    assert runnable_args(kept, flags) == ["--long-every", "4", "--max-tokens", "3", "--prompt-lens", "8,16",
                                          "--model", "tiny", "--device", "cpu"]
    serve = DocCommand("x", (), "milestones.m09_server", ("serve", "--model", "Qwen/Qwen3-0.6B", "--port", "8000"))
    assert runnable_args(serve, flags) == ["serve", "--model", "tiny", "--device", "cpu"]


def test_the_docs_show_python_m_milestones_commands():
    commands = doc_commands()
    assert any(c.module == "milestones.m01_naive_loop" and c.source.startswith("README.md") for c in commands)
    assert any(c.module == "milestones" and c.args[:1] == ("diff",) for c in commands), "docs/course-tools.md?"


def _unique_runs() -> list[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...], str]]:
    """(where it is written, the arguments to run, its environment, the module), each distinct run once."""
    runs, seen = [], set()
    flags_of: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for command in doc_commands():
        subcommand = ("serve",) if command.args[:1] == ("serve",) else ()
        if command.is_demo and (command.module, subcommand) not in flags_of:
            flags_of[command.module, subcommand] = demo_flags(command.module, subcommand)
        args = tuple(runnable_args(command, flags_of.get((command.module, subcommand), set())))
        key = (command.module, args, command.env)
        if key not in seen:
            seen.add(key)
            runs.append((command.source, args, command.env, command.module))
    return runs


RUNS = _unique_runs()


@pytest.mark.slow
@pytest.mark.parametrize("source, args, env, module", RUNS, ids=[f"{m} {' '.join(a)}" for _, a, _, m in RUNS])
def test_every_documented_command_runs_on_the_cpu(source, args, env, module, tokenizer_cache, tmp_path,
                                                 monkeypatch, capsys):
    if module == "milestones":  # the course tools, in this process (see the module docstring)
        from milestones._course.cli import main as course_main

        for name, value in env:
            monkeypatch.setenv(name, value)
        status = course_main(list(args))
        captured = capsys.readouterr()
        assert status == 0 and captured.out, f"{source}\nran: python -m milestones {' '.join(args)}\n{captured.err}"
        return
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **dict(env)}  # tiny model: threads only contend
    argv = [sys.executable, "-m", module, *args]
    if args[:1] == ("serve",):
        port = free_port()
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        log = tmp_path / "serve.log"
        with log.open("w") as sink:
            process = subprocess.Popen(argv, cwd=REPO, env=environment, stdout=sink, stderr=subprocess.STDOUT,
                                       preexec_fn=end_with_this_process)
            try:
                up = answers_http(process, port, SERVE_START_S)
            finally:
                stop(process)
        assert up, f"{source}\nran: {' '.join(argv[1:])}\nnever answered HTTP:\n{log.read_text()[-2000:]}"
        return
    done = subprocess.run(argv, cwd=REPO, env=environment, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert done.returncode == 0, f"{source}\nran: {' '.join(argv[1:])}\n{done.stderr[-2000:]}"


@pytest.mark.slow
def test_a_server_that_comes_up_is_seen_answering():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=end_with_this_process)
    try:
        assert answers_http(process, port, 30)
    finally:
        stop(process)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    assert not answers_http(dead, free_port(), 5)


ORPHAN_SCRIPT = """
import subprocess, sys, time
from conftest import end_with_this_process
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=end_with_this_process)
print(server.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_a_test_starts_ends_when_the_test_process_is_killed():
    """A suite killed from outside (SIGKILL: no finally runs) leaves none of the servers its tests started."""
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT], cwd=Path(__file__).parent, stdout=subprocess.PIPE,
                              text=True, preexec_fn=end_with_this_process)
    try:
        server = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not process_is_gone(server):
        assert time.monotonic() < deadline, "the server outlived the process that started it"
        time.sleep(0.05)


def process_is_gone(pid: int) -> bool:
    """No such process, or a zombie (it ended; its new parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


# ---- the architecture diagram --------------------------------------------------------------------------------------

DIAGRAM = REPO / "docs" / "diagrams" / "architecture.py"
SNAKE_OR_CAMEL = re.compile(r"\b[a-z]+(?:_[a-z0-9]+)+\b|\b[A-Z][a-z]+(?:[A-Z][a-z0-9]*)+\b|\b[A-Z]{2,}[a-z]+[A-Za-z]*\b")


def diagram_module():
    spec = importlib.util.spec_from_file_location("architecture_diagram", DIAGRAM)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_architecture_diagram_is_drawn_from_its_source(tmp_path):
    """The committed image can always be regenerated: the script runs (into a temp dir) and writes a PNG."""
    out = tmp_path / "architecture.png"
    done = subprocess.run([sys.executable, str(DIAGRAM), "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    committed = REPO / "docs" / "images" / "architecture.png"
    assert committed.is_file() and "images/architecture.png" in (REPO / "docs" / "architecture.md").read_text()


def test_the_architecture_diagram_names_files_and_functions_that_exist():
    """Every ``file.py``, snake_case and CamelCase name in the diagram's boxes is in the code it describes."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "milestones").rglob("*.py"))
    files = {p.name for p in (REPO / "milestones").rglob("*.py")}
    missing = []
    for box in diagram_module().BOXES:
        text = f"{box.title} {box.detail}"
        missing += [f for f in re.findall(r"\b\w+\.py\b", text) if f not in files]
        missing += [name for name in SNAKE_OR_CAMEL.findall(text.replace(".py", "")) if name not in source]
    assert missing == []


# ---- the workshop's solutions -------------------------------------------------------------------------------------

WORKSHOP = REPO / "docs" / "workshop.md"


def python_blocks(markdown: str) -> list[str]:
    """The code of every fenced ```python block (the workshop's solutions are all Python)."""
    return re.findall(r"^```python\n(.*?)^```", markdown, re.S | re.M)


@pytest.mark.slow
def test_the_workshop_solutions_run(tokenizer_cache, tmp_path):
    """Every Python solution in docs/workshop.md runs against this code (one interpreter, a fresh namespace each),
    so a change that breaks an exercise's solution breaks this test."""
    blocks = python_blocks(WORKSHOP.read_text(encoding="utf-8"))
    assert len(blocks) >= 6, "docs/workshop.md lost its solutions?"
    script = tmp_path / "solutions.py"
    script.write_text("\n".join(f"print('== solution {i}', flush=True)\n"
                                f"exec(compile({block!r}, 'docs/workshop.md solution {i}', 'exec'), {{'__name__': '__main__'}})"
                                for i, block in enumerate(blocks)))
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env_with_checkout(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S * 3)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-3000:]
    assert done.stdout.count("== solution ") == len(blocks)


# ---- one source for what the docs say of the programs ------------------------------------------------------------

DEMO_TIME = re.compile(r"python -m milestones\.m\d\d\w*.*?(?:~|about |in )\d+(?:[–-]\d+)? ?s\b")


def test_only_the_readme_states_how_long_the_demos_take():
    """Demo times drift with the machine: one statement (the README's range), which every page links to."""
    stated = [f"{path.relative_to(REPO)}:{n}" for path in COMMAND_DOCS if path.name != "README.md" or path.parent != REPO
              for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if DEMO_TIME.search(line)]
    assert stated == []
    assert re.search(r"finishes in \d+–\d+ s on a 2-core CPU \(measured for all fourteen\)",
                     (REPO / "README.md").read_text(encoding="utf-8"))


LAYOUT_IMPLIED = {"__init__.py", "__main__.py", "engine.py", "config.py"}  # "Every package also has ..."


def test_the_readmes_layout_names_every_module_of_every_package():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    layout = text.split("## Layout", 1)[1].split("```", 2)[1]
    entries = re.split(r"\n  (?=\S)", layout)  # one entry per package, its continuation lines included
    for package in sorted((REPO / "milestones").iterdir()):
        if not (package / "__init__.py").is_file() or package.name == "_course":
            continue
        [entry] = [e for e in entries if e.startswith(f"{package.name}/")]
        missing = sorted(p.name for p in package.glob("*.py") if p.name not in LAYOUT_IMPLIED and p.name not in entry)
        assert not missing, f"README's layout line for {package.name}/ does not name {missing}"


def test_no_help_text_says_default_none():
    """A flag whose default is None says what None means, or shows no default (never "(default: None)")."""
    for module in [f"milestones.{p.name}" for p in sorted((REPO / "milestones").glob("m[0-9][0-9]_*"))]:
        for argv in (["--help"], ["serve", "--help"]) if module.endswith(("m09_server", "m10_cuda_graphs")) else (
                ["--help"],):
            out = run_module_help(module, argv)
            assert "(default: None)" not in " ".join(out.split()), f"{module} {' '.join(argv)}"


def run_module_help(module: str, argv: list[str]) -> str:
    demo = importlib.import_module(f"{module}.__main__")
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit):
        demo.main(argv)
    return out.getvalue()
