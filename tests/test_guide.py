"""Every code block of the user's guide (docs/guide/*.md) runs as written, and the API
reference covers every public name with a docstring.

The mechanism is the README's (tests/test_readme.py): a page's blocks run in order in one
scratch directory that sees the repository's ``examples/``. A ``python`` block runs as a
script, unless its first line is ``# file: NAME`` (it is saved as NAME for the commands that
follow) or ``# continues the quickstart`` (the README's quickstart runs first, with fewer
steps); each line of a plain block is one command. A block preceded by
``<!-- not run: why -->`` is not run (multi-host and GPU-only commands; few, listed in
NOT_RUN). Blocks included from the README (``--8<-- "README.md:..."``) are tested there; a
block that includes a file (``--8<-- "examples/x.yaml"``) must name an existing file.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import types
from pathlib import Path

import pytest

from tests.test_readme import QUICKSTART, ROOT, _run, make_scratch, run_command

GUIDE = ROOT / "docs" / "guide"
PAGES = sorted(GUIDE.glob("*.md"))
#: The blocks that are not run, by page: each needs what a test machine does not have.
NOT_RUN = {"distributed.md": 1, "gpu.md": 1}


def blocks(page: Path) -> list:
    """``(language, text, not_run)`` of every fenced block of ``page``, in order."""
    found, language, body, not_run, previous = [], None, [], None, ""
    for line in page.read_text().splitlines():
        if language is None:
            match = re.match(r"^```(\w*)\s*$", line)
            if match:
                language, body = match.group(1) or "shell", []
                note = re.fullmatch(r"<!-- not run: (.+) -->", previous.strip())
                not_run = note.group(1) if note else None
            previous = line
        elif line.startswith("```"):
            found.append((language, "\n".join(body), not_run))
            language = None
        else:
            body.append(line)
    assert language is None, f"{page.name} has an unclosed fenced block"
    return found


def _commands(text: str) -> list:
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        command = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
        if command:
            commands.append(" ".join(command.split()))
    return commands


def _slow(page: Path) -> bool:
    return any(
        language in ("python", "shell") and not not_run for language, _, not_run in blocks(page)
    )


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if _slow(p) else []) for p in PAGES],
)
def test_every_block_of_the_page_runs(page, tmp_path):
    scratch = make_scratch(tmp_path)
    outputs = []
    for language, text, not_run in blocks(page):
        include = re.fullmatch(r'--8<-- "([^":]+)"', text.strip())
        if not_run or language == "text":
            continue
        if include:
            assert (ROOT / include.group(1)).is_file(), include.group(1)
            continue
        if language == "python":
            first = text.splitlines()[0]
            name = re.fullmatch(r"# file: (\S+)", first)
            if name:
                (scratch / name.group(1)).write_text(text + "\n")
                continue
            if first == "# continues the quickstart":
                text = QUICKSTART.replace("num_steps=200", "num_steps=25") + "\n" + text
            script = scratch / "snippet.py"
            script.write_text(text + "\n")
            outputs.append(_run([sys.executable, str(script)], scratch).stdout)
        else:
            assert language in ("shell", "sh", "bash"), (page.name, language)
            for command in _commands(text):
                result = run_command(command, scratch)
                outputs.append(result.stdout if result is not None else "")
    if page.name == "checkpoints.md":  # the resumed run continues the first exactly
        first, resumed = outputs
        steps = lambda out: re.findall(r"^step \d+: loss [\d.]+$", out, re.M)  # noqa: E731
        assert len(steps(first)) == 20 and steps(resumed) == steps(first)[10:]
    if page.name == "logging.md":  # progress lines, forced on under a pipe
        assert re.search(
            r"^train 60/60 \| loss \d\.\d{4} \| [\d,]+\.\d samples/s \| took ", outputs[-1], re.M
        ), outputs[-1]


def test_blocks_not_run_are_few_and_say_why():
    counts = {}
    for page in PAGES:
        for language, _, not_run in blocks(page):
            assert language in ("python", "shell", "yaml", "text"), (page.name, language)
            if not_run:
                counts[page.name] = counts.get(page.name, 0) + 1
    assert counts == NOT_RUN


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert {p.name for p in PAGES} == set(re.findall(r":\s+(\S+\.md)$", nav, re.M))


# ------------------------------------------------------------------------ the API reference
#: The packages whose ``__all__`` is the public API (cerebras.pytorch is cstorch).
PUBLIC = [
    "cstorch",
    "cstorch.optim",
    "cstorch.optim.lr_scheduler",
    "cstorch.amp",
    "cstorch.utils.data",
    "cstorch.utils.tensorboard",
    "cstorch.metrics",
    "cstorch.sparse",
    "cstorch.distributed",
    "cstorch.nn",
    "cstorch.mesh",
    "cstorch.experimental",
    "cstorch.profiler",
    "cstorch.utils",
    "cstorch.parity",
]


def _public_names():
    for module_name in PUBLIC:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            yield module_name, name, getattr(module, name)


def test_every_public_name_has_a_docstring():
    missing = []
    for module_name, name, value in _public_names():
        if isinstance(value, types.ModuleType):
            documented = bool((value.__doc__ or "").strip())
        elif inspect.isclass(value) or inspect.isroutine(value):
            documented = bool(inspect.getdoc(value))
        else:
            continue  # data (constants, the ``backends`` flags object, type aliases)
        if not documented:
            missing.append(f"{module_name}.{name}")
    assert not missing, f"public names without a docstring: {missing}"


def test_the_reference_page_covers_every_public_package():
    reference = (GUIDE / "reference.md").read_text()
    directives = set(re.findall(r"^::: (\S+)$", reference, re.M))
    for module_name in PUBLIC:
        if module_name in ("cstorch", "cstorch.utils"):
            continue  # their names are listed one by one, or are re-exports
        assert module_name in directives, module_name
    for name in importlib.import_module("cstorch").__all__:
        value = getattr(importlib.import_module("cstorch"), name)
        if isinstance(value, types.ModuleType):
            assert (
                value.__name__ in directives
                or value.__name__ + ".backends" in directives
                or value.__name__ == "cstorch.utils"
            ), value.__name__
        elif callable(value):
            assert any(
                d.endswith("." + name) or d == getattr(value, "__module__", None)
                for d in directives
            ), name
