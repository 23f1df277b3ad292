"""Every command and snippet in README.md runs as written.

The fenced blocks are read from the README itself: each line of a plain (shell) block is one
command, run from a scratch directory that sees the repository's ``examples/`` (so the files a
command writes stay out of the checkout); each ``python`` block runs as a script there. A block
whose first line is ``# continues the quickstart`` runs after the quickstart's code. Long runs
get small arguments (fewer steps) from ``SMALLER`` below; ``make`` targets are checked through
their recipe (``make -n``: running ``make test`` from the test suite would recurse) and their
command is run; ``pip install`` is a dry run into this environment.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fork_server, paths

ROOT = Path(paths.REPO)
README = ROOT / "README.md"

#: Extra arguments that keep a long command short (appended to the README's command).
SMALLER = {
    "python examples/trainer_mnist.py": ["--steps", "20"],
    "examples/gpt_adamw.py --backend CSX --num-csx 4 --weight-servers 1": [
        "--steps",
        "21",
        "--log-every",
        "7",
    ],  # 21 > the 20 batches: the loader is cycled
    "make demo": ["--steps", "30"],
    "cstorch.parity examples/gpt_adamw.py": ["--layers", "1", "--d-model", "32", "--seq-len", "16"],
}
#: Commands that take a minute or more even when small.
SLOW = ("cstorch.distributed.launch", "cstorch.parity")
#: The YAML run by the README, with fewer steps (the copy the scratch directory sees).
YAML_STEPS = {
    "num_steps: 200": "num_steps: 20",
    "total_iters: 200": "total_iters: 20",
    "eval_frequency: 100": "eval_frequency: 10",
    "steps: 100": "steps: 10",
}


def _blocks() -> list:
    """``(language, text, heading)`` of every fenced block, in order."""
    blocks, heading, language, body = [], "", None, []
    for line in README.read_text().splitlines():
        if language is None:
            if line.startswith("#") and not line.startswith("#!"):
                heading = line.lstrip("#").strip()
            match = re.match(r"^```(\w*)\s*$", line)
            if match:
                language, body = match.group(1) or "shell", []
        elif line.startswith("```"):
            blocks.append((language, "\n".join(body), heading))
            language = None
        else:
            body.append(line)
    assert language is None, "README.md has an unclosed fenced block"
    return blocks


def _commands() -> list:
    commands = []
    for language, text, _ in _blocks():
        if language not in ("shell", "sh", "bash", "console"):
            continue
        for line in text.replace("\\\n", " ").splitlines():
            command = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if command:
                commands.append(" ".join(command.split()))
    return commands


def _python_blocks() -> list:
    return [(text, heading) for language, text, heading in _blocks() if language == "python"]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A working directory whose ``examples/`` holds the repository's examples (the YAML
    with fewer steps), so commands run as from the repository root but write here."""
    return make_scratch(tmp_path_factory.mktemp("readme"))


def make_scratch(directory):
    """Fills ``directory`` with ``examples/`` as ``scratch`` does (tests/test_guide.py too)."""
    examples = directory / "examples"
    examples.mkdir()
    for source in (ROOT / "examples").iterdir():
        if source.name == "trainer_mnist.yaml":
            text = source.read_text()
            for long, short in YAML_STEPS.items():
                assert long in text, f"the README test expects {long!r} in {source}"
                text = text.replace(long, short)
            (examples / source.name).write_text(text)
        elif source.is_file():
            (examples / source.name).symlink_to(source)
    return directory


def _environment(directory) -> dict:
    path = os.pathsep.join(
        [str(directory), str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    )
    return dict(os.environ, PYTHONPATH=path, CSTORCH_PROGRESS_BAR="0")


def _run(argv, cwd, env=None, timeout=900):
    result = fork_server.run(
        argv,
        cwd=cwd,
        env={**_environment(cwd), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"{' '.join(argv)} failed ({result.returncode}):\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return result


def _smaller(command: str) -> list:
    return next((extra for key, extra in SMALLER.items() if key in command), [])


def _executable(word: str) -> str:
    if word == "python":
        return sys.executable
    installed = Path(sys.executable).parent / word  # console scripts of this environment
    return str(installed) if installed.exists() else word


COMMANDS = _commands()


def test_the_readme_keeps_its_two_set_up_commands():
    install = [text for language, text, heading in _blocks() if heading == "Install"]
    assert install and install[0].splitlines()[:2] == [
        "make demo    # creates .venv, trains the docs' MNIST example on synthetic data",
        "make test    # runs the test suite",
    ]
    assert COMMANDS[:2] == ["make demo", "make test"]


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(c, id=c, marks=[pytest.mark.slow] if any(s in c for s in SLOW) else [])
        for c in COMMANDS
    ],
)
@pytest.mark.slow
def test_readme_command(command, scratch):
    run_command(command, scratch)


def run_command(command, scratch):
    """Runs one documented shell command as the README's tests do (leading ``NAME=value``
    words set the environment)."""
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words[0] == "make":
        recipe = subprocess.run(
            ["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert recipe.returncode == 0, recipe.stderr
        if words[1:] == ["docs"]:  # its own venv (.venv-docs); CI runs `make docs` itself
            assert "mkdocs build --strict" in recipe.stdout, recipe.stdout
            mkdocs = ROOT / ".venv-docs" / "bin" / "mkdocs"
            if not mkdocs.exists():
                pytest.skip("no .venv-docs here: `make docs` creates it")
            return _run(
                [str(mkdocs), "build", "--strict", "--quiet", "-d", str(scratch / "site")],
                ROOT,
                {"NO_MKDOCS_2_WARNING": "1"},
            )
        steps = [line for line in recipe.stdout.splitlines() if line.startswith(".venv/bin/python")]
        assert steps, f"`{command}` would first (re)build .venv:\n{recipe.stdout}"
        target = shlex.split(steps[-1])
        if target[1:3] == ["-m", "pytest"]:
            # make test runs this whole suite: options that only report (the slowest tests)
            # are fine, a selection is not
            assert target[3:5] == ["-q", "tests"]
            extra = target[5:]  # test-fast: the slow tests left out, nothing else
            if extra[:2] == ["-m", "not slow"]:
                extra = extra[2:]
            if extra[:3] == ["-n", "auto", "--maxprocesses=4"]:  # parallel processes
                extra = extra[3:]
                if extra[:2] == ["--dist", "worksteal"]:  # how they share the tests
                    extra = extra[2:]
            assert all(a.startswith("--durations") for a in extra), target
            return None
        return _run(
            [
                sys.executable,
                *[str(ROOT / w) if w.startswith("examples/") else w for w in target[1:]],
                *_smaller(command),
            ],
            scratch,
        )
    if words[:4] == ["python", "-m", "pip", "install"]:
        result = _run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--no-build-isolation",
                *words[4:],
            ],
            ROOT,
        )
        assert "Would install cstorch-jax" in result.stdout
        return result
    result = _run([_executable(words[0]), *words[1:], *_smaller(command)], scratch, env)
    if "cstorch.parity" in command:
        assert "PARITY OK" in result.stdout
    if "gpt_adamw.py --backend CSX" in command:
        assert re.search(r"step\s+21\s+loss", result.stdout), result.stdout
    return result


QUICKSTART = next(text for text, heading in _python_blocks() if heading == "Quickstart")
CONTINUES = "# continues the quickstart"


@pytest.mark.parametrize(
    "index",
    range(len(_python_blocks())),
    ids=[f"{i}-{h}" for i, (_, h) in enumerate(_python_blocks())],
)
@pytest.mark.slow
def test_readme_python_snippet(index, scratch, tmp_path):
    text, heading = _python_blocks()[index]
    if text.startswith(CONTINUES):  # fewer steps for the part it builds on
        text = QUICKSTART.replace("num_steps=200", "num_steps=25") + "\n" + text
    script = tmp_path / "snippet.py"
    script.write_text(text + "\n")
    result = _run([sys.executable, str(script)], tmp_path)
    if heading == "Quickstart":
        assert re.findall(r"^step (\d+): loss", result.stdout, re.M) == ["50", "100", "150", "200"]
        assert (tmp_path / "model.mdl").is_file()
        _run([sys.executable, str(script)], tmp_path)  # a second run overwrites its checkpoint


def test_every_block_is_exercised():
    languages = {language for language, _, _ in _blocks()}
    assert languages <= {"shell", "python"}, languages
    # the rest of the project's commands and snippets are in the guide (tests/test_guide.py)
    assert len(COMMANDS) >= 4 and len(_python_blocks()) >= 1
