"""The README stays a front page and the docs stay whole: the README is short, every link in
it and in the docs reaches a file and an anchor that exist, the configuration reference names
every key the parser accepts, the API reference every public name, and the README's quick
starts run as written."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import fanout
from fanout import ConfigError
from fanout.config import parse_config

from .docs import DOCS, README, ROOT, page, section

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(path: Path) -> set[str]:
    """The ids MkDocs gives the headings of a page (the same ``toc`` extension)."""
    import markdown

    html = markdown.markdown(path.read_text(encoding="utf-8"),
                             extensions=["toc", "tables", "attr_list", "pymdownx.superfences"])
    return set(re.findall(r'\bid="([^"]+)"', html))


def _links(path: Path) -> list[tuple[str, Path, str]]:
    """Every relative link of a Markdown file: (as written, the file it names, its anchor)."""
    found = []
    for match in LINK.finditer(_prose(path.read_text(encoding="utf-8"))):
        target = match.group(1) or match.group(2)
        parts = urlsplit(target)
        if parts.scheme or target.startswith("//"):
            continue  # https://..., mailto:
        file = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        found.append((target, file, parts.fragment))
    return found


def test_the_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) <= 250
    for needed in ("make demo", "make test", "pip install -e '.[serve]'",
                   "source .venv/bin/activate", "docs/img/compare.svg"):
        assert needed in README, needed


@pytest.mark.parametrize("markdown_file", [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_an_anchor(markdown_file: Path) -> None:
    pytest.importorskip("markdown")  # the docs extra (make test installs it)
    for target, file, anchor in _links(markdown_file):
        assert file.exists(), f"{markdown_file.name}: {target}: no such file"
        if anchor:
            assert file.suffix == ".md", target
            assert anchor in _anchors(file), f"{markdown_file.name}: {target}: no such anchor"


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    pytest.importorskip("markdown")
    (tmp_path / "a.md").write_text("# A\n\n## Two words\n")
    (tmp_path / "b.md").write_text("[ok](a.md#two-words) [bad](a.md#three) [gone](c.md) "
                                   "`[code](nope.md)` ![pic](img.svg)\n")
    links = _links(tmp_path / "b.md")
    assert [(target, file.exists()) for target, file, _ in links] == [
        ("a.md#two-words", True), ("a.md#three", True), ("c.md", False), ("img.svg", False)]
    assert "two-words" in _anchors(tmp_path / "a.md")
    assert "three" not in _anchors(tmp_path / "a.md")


def _known_keys(config: str) -> list[str]:
    """The keys the parser accepts where ``config`` puts an unknown one (from its error)."""
    with pytest.raises(ConfigError) as caught:
        parse_config(config, "fanout.toml")
    known = re.search(r"\(known: ([^)]*)\)", str(caught.value))
    assert known is not None, caught.value
    return known.group(1).split(", ")


MODEL = '[[models]]\nname = "m"\nid = "mock/fast"\n'
TABLES = {
    "Top level": "nonsense_key = 1\n",
    "`[endpoint]`": "[endpoint]\nnonsense_key = 1\n",
    "`[deadlines]`": "[deadlines]\nnonsense_key = 1\n",
    "`[concurrency]`": "[concurrency]\nnonsense_key = 1\n",
    "`[parser]`": "[parser]\nnonsense_key = 1\n",
    "`[compare]`": "[compare]\nnonsense_key = 1\n",
    "`[batch]`": "[batch]\nnonsense_key = 1\n",
    "`[serve]`": "[serve]\nnonsense_key = 1\n",
    "`[[models]]`": MODEL + "nonsense_key = 1\n",
    "`[[models]]` price": MODEL + "price = { input = 1, output = 1, nonsense_key = 1 }\n",
}


def test_the_configuration_reference_names_every_key_the_parser_accepts() -> None:
    reference = section(page("configuration.md"), "Reference")
    for title, config in TABLES.items():
        keys = _known_keys(config)
        assert keys, title
        text = section(reference, "`[[models]]`") if title.endswith("price") else section(
            reference, title)
        for key in keys:
            assert f"`{key}`" in text, (title, key)


def test_the_configuration_reference_gives_the_real_defaults() -> None:
    from fanout import Deadlines
    from fanout.config import ServeConfig

    reference = section(page("configuration.md"), "Reference")
    deadlines = section(reference, "`[deadlines]`")
    for name in ("connect", "first_byte", "idle", "total"):
        assert f"| `{name}` | {getattr(Deadlines(), name):g} |" in deadlines, name
    assert Deadlines().first_token is None and "| `first_token` | none |" in deadlines
    serve = section(reference, "`[serve]`")
    defaults = ServeConfig()
    for name in ("port", "max_streams", "max_fanouts", "retry_after", "keepalive",
                 "head_timeout", "body_timeout", "body_min_rate", "max_reading_connections"):
        assert f"| `{name}` | {getattr(defaults, name):g} " in serve, name
    assert f"| `host` | `{defaults.host}` |" in serve
    assert f"| `max_body_bytes` | {defaults.max_body_bytes} (1 MiB) |" in serve


def test_the_api_reference_renders_every_public_name() -> None:
    api = page("api.md")
    rendered = set(re.findall(r"^::: fanout\.(\w+)$", api, re.M))
    assert set(fanout.__all__) <= rendered, set(fanout.__all__) - rendered


def _fenced(text: str, after: str, language: str) -> str:
    match = re.compile(rf"^```{language}\n(.*?)^```$", re.S | re.M).search(text, text.index(after))
    assert match is not None, after
    return match.group(1)


QUICK_EMBEDDED = "## Quick start: the embedded default"
QUICK_RELAY = "## Quick start: a real OpenAI-compatible relay"


def test_the_readme_quick_starts_are_the_getting_started_ones() -> None:
    started = page("getting-started.md")
    for heading, language in ((QUICK_EMBEDDED, "sh"), (QUICK_RELAY, "sh"),
                              ("## In your own trio program", "python")):
        assert _fenced(README, heading, language) == _fenced(started, heading, language), heading


def _fanout(argv: list[str], cwd: Path, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "fanout"
    return subprocess.run([sys.executable, "-m", "fanout.cli.main", *argv[1:]], cwd=cwd,
                          env={**os.environ, "COLUMNS": "100", **(env or {})},
                          capture_output=True, text=True, timeout=120)


def test_the_embedded_quick_start_runs_as_written(tmp_path: Path) -> None:
    block = _fenced(README, QUICK_EMBEDDED, "sh")
    statuses = []
    for line in block.splitlines():
        command = line.split("  #")[0].strip()
        if command.startswith("source "):
            continue  # the venv: here, this interpreter
        for part in command.split(" && "):
            argv = shlex.split(part)
            if argv[0] == "fanout":
                done = _fanout(argv, tmp_path)
            else:
                done = subprocess.run(["bash", "-c", part], cwd=tmp_path, capture_output=True,
                                      text=True, timeout=60)
            assert "Traceback" not in done.stderr, done.stderr
            statuses.append((argv[:2], done.returncode))
            if argv[:2] == ["fanout", "report"]:
                assert "completed" in done.stdout and "1 (100%)" in done.stdout
    # The default four complete; the cut and the stall are said, and fail the run.
    assert statuses == [(["fanout", "compare"], 0), (["fanout", "compare"], 1),
                        (["echo", "{\"id\": \"q1\", \"prompt\": \"Say hello\"}"], 0),
                        (["fanout", "batch"], 0), (["fanout", "report"], 0)]


def test_the_relay_quick_start_runs_as_written(tmp_path: Path) -> None:
    block = _fenced(README, QUICK_RELAY, "sh")
    config = block[block.index("<<'EOF'\n") + len("<<'EOF'\n"):block.index("\nEOF\n")]
    command = shlex.split(block.splitlines()[-1])
    assert "export RELAY_API_KEY=" in block and command[:2] == ["fanout", "compare"]
    checked = parse_config(config, "fanout.toml")
    assert [m.name for m in checked.models] == ["gpt", "claude"]
    endpoint = checked.endpoint({"RELAY_API_KEY": "sk-relay"})
    assert endpoint is not None and endpoint.base_url.startswith("https://")
    # The same file against a relay of our own (the embedded upstream with a key), its ids
    # ones that relay serves.
    mock = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--port", "0",
                             "--key", "sk-relay"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert mock.stdout is not None
        url = mock.stdout.readline().strip()
        local = config.replace(endpoint.base_url, url)
        for model in checked.models:
            local = local.replace(f'"{model.id}"', '"mock/fast"')
        (tmp_path / "fanout.toml").write_text(local)
        done = _fanout(command, tmp_path, {"RELAY_API_KEY": "sk-relay"})
        assert done.returncode == 0, done.stderr
        assert "gpt" in done.stdout and "claude" in done.stdout
        wrong = _fanout(command, tmp_path, {"RELAY_API_KEY": "sk-wrong"})
        assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr
        assert "sk-wrong" not in wrong.stdout + wrong.stderr
    finally:
        mock.terminate()
        mock.communicate(timeout=15)


def test_the_readme_library_snippet_runs_as_written(tmp_path: Path) -> None:
    code = _fenced(README, "## In your own trio program", "python")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("mock/slow '") for line in lines)
    assert "mock/slow completed None" in lines
    assert any(line.startswith("fault/truncate truncated the connection broke after")
               for line in lines)
