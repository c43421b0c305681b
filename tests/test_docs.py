"""The README stays a front page and the docs stay whole: the README is short, every link in
it and in the docs reaches a file and an anchor that exist, the configuration reference names
every key the parser accepts, the API reference every public name, and the README's quick
starts run as written."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

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


def test_what_the_package_tells_users_to_read_exists() -> None:
    """Text the package shows (``fanout init``'s starter config, help, messages) that sends a
    reader to the documentation names a page that exists, never a README section: the README
    is a front page, its old sections are pages of docs/."""
    named = []
    for path in sorted((ROOT / "fanout").rglob("*")):
        if path.suffix not in (".py", ".toml") or "__pycache__" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"README's \"[^\"]+\" section", text), path
        named += [(path, ROOT / name) for name in re.findall(r"\bdocs/[\w/-]+\.md\b", text)]
    assert named  # fanout init's starter names the configuration reference
    for path, doc in named:
        assert doc.is_file(), (path, doc)


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
    import fanout.batch

    api = page("api.md")
    rendered = set(re.findall(r"^::: fanout\.([\w.]+)$", api, re.M))
    for module, prefix in ((fanout, ""), (fanout.batch, "batch.")):
        names = {prefix + name for name in module.__all__}
        assert names <= rendered, names - rendered


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


@pytest.fixture
def relay() -> Iterator[str]:
    """A relay of our own on loopback: the embedded upstream, wanting the key ``sk-relay``."""
    mock = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--port", "0",
                             "--key", "sk-relay"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert mock.stdout is not None
        yield mock.stdout.readline().strip()
    finally:
        mock.terminate()
        mock.communicate(timeout=15)


def test_the_relay_quick_start_runs_as_written(tmp_path: Path, relay: str) -> None:
    """Each line against our relay, its model ids swapped for ones it serves."""
    block = _fenced(README, QUICK_RELAY, "sh")
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    export = shlex.split(lines[0])
    assert export[0] == "export"
    environ = dict(item.split("=", 1) for item in export[1:])
    assert set(environ) == {"OPENAI_BASE_URL", "OPENAI_API_KEY"}
    environ = {"OPENAI_BASE_URL": relay, "OPENAI_API_KEY": "sk-relay"}
    (tmp_path / "prompts.jsonl").write_text('{"id": "q1", "prompt": "Say hello"}\n')
    ids = {"openai/gpt-4o-mini": "mock/fast", "anthropic/claude-3.5-haiku": "mock/slow"}
    ran = []
    for line in lines[1:]:
        argv = [ids.get(arg, arg) for arg in shlex.split(line)]
        done = _fanout(argv, tmp_path, environ)
        assert done.returncode == 0, (argv, done.stderr)
        assert "sk-relay" not in done.stdout + done.stderr
        ran.append(argv[1])
        if argv[1] == "models":
            assert "mock/fast" in done.stdout.split()
        if argv[1] == "compare":
            assert "mock/fast" in done.stdout and "mock/slow" in done.stdout
    assert ran == ["models", "compare", "batch", "init"]
    assert (tmp_path / "fanout.toml").is_file()  # what fanout init wrote
    wrong = _fanout(["fanout", "compare", "hi", "-m", "mock/fast"], tmp_path / "..",
                    {**environ, "OPENAI_API_KEY": "sk-wrong"})
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr
    assert "sk-wrong" not in wrong.stdout + wrong.stderr


def _shown(text: str) -> set[str]:
    """The lines of a page's plain fenced blocks (what a command printed)."""
    shown: set[str] = set()
    opener = None
    for line in text.splitlines():
        if line.startswith("```"):
            opener = line if opener is None else None
        elif opener == "```":
            shown.add(line)
    return shown


def test_the_troubleshooting_errors_are_the_real_ones(tmp_path: Path, relay: str) -> None:
    shown = _shown(page("troubleshooting.md"))
    port = urlsplit(relay).port

    def said(argv: list[str], environ: dict[str, str]) -> str:
        base = {k: v for k, v in os.environ.items()
                if k not in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
        done = subprocess.run([sys.executable, "-m", "fanout.cli.main", *argv], cwd=tmp_path,
                              env={**base, **environ}, capture_output=True, text=True,
                              timeout=120)
        assert "Traceback" not in done.stderr
        last = done.stderr.strip().splitlines()[-1]
        return last.replace(f"127.0.0.1:{port}", "127.0.0.1:8000")

    real = {"OPENAI_BASE_URL": relay}
    lines = [
        said(["compare", "hi", "-m", "mock/fast"], real),
        said(["compare", "hi", "-m", "mock/fast"], {**real, "OPENAI_API_KEY": "sk-wrong"}),
        said(["compare", "hi", "-m", "gpt-4o-mnii"], {**real, "OPENAI_API_KEY": "sk-relay"}),
        said(["compare", "hi", "-m", "m"], {"OPENAI_BASE_URL": "http://localhost:9/v1",
                                           "OPENAI_API_KEY": "x"}),
        said(["compare", "hi", "-m", "mock/fast"], {"OPENAI_BASE_URL": relay.removesuffix("/v1"),
                                                    "OPENAI_API_KEY": "sk-relay"}),
    ]
    (tmp_path / "fanout.toml").write_text(
        f'[endpoint]\nbase_url = "{relay}"\napi_key_env = "RELAY_API_KEY"\n')
    lines.append(said(["compare", "hi", "-m", "mock/fast"], {}))
    for line in lines:
        assert line in shown, line
    # A cut stream, as the embedded quick start shows it: both of fault/truncate's lines.
    (tmp_path / "fanout.toml").unlink()
    cut = subprocess.run([sys.executable, "-m", "fanout.cli.main", "compare", "hi", "-m", "writer",
                          "-m", "fault/truncate", "-m", "fault/stall:3"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items()
                                           if k not in ("OPENAI_BASE_URL", "OPENAI_API_KEY")})
    flaky = [line for line in cut.stderr.splitlines()
             if line.startswith("fanout compare: fault/truncate")]
    assert len(flaky) == 2 and all(line in shown for line in flaky), flaky


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


def _make_docs(tmp_path: Path, *targets: str) -> list[str]:
    """The commands ``make VENV=v <targets>`` runs with the checkout's Makefile and
    pyproject.toml in ``tmp_path``: its venv's python only logs what it is asked."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    for name in ("Makefile", "pyproject.toml"):
        if not (tmp_path / name).exists():
            shutil.copy(ROOT / name, tmp_path / name)
    python = tmp_path / "v" / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "calls.log"
    python.write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(log))}\n')
    python.chmod(0o755)
    log.write_text("")
    done = subprocess.run(["make", "-s", "VENV=v", *targets], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines()


def test_make_docs_installs_only_the_docs_extra(tmp_path: Path) -> None:
    """`make docs` from nothing installs the package with its docs extra, not the dev tools
    and Ray (minutes and a gigabyte), then builds with --strict; again, it only builds."""
    build = "-m mkdocs build --strict -d site"
    assert _make_docs(tmp_path, "docs") == ["-m pip install --quiet -e .[docs]", build]
    assert _make_docs(tmp_path, "docs") == [build]
    # The dev extra on top (what `make test` needs) installs the rest once; after it,
    # neither `make docs` nor the dev stamp installs anything again.
    assert _make_docs(tmp_path, "v/.installed-dev") == [
        "-m pip install --quiet -e .[serve]", "-m pip install --quiet -e .[dev,ray]"]
    assert _make_docs(tmp_path, "v/.installed-dev", "docs") == [build]


def test_a_dev_venv_needs_no_install_for_the_docs(tmp_path: Path) -> None:
    """A venv `make test` set up before the docs had their own stamp holds the docs extra
    (the dev extra holds fanout[docs]): `make docs` and `make test` install nothing."""
    _make_docs(tmp_path, "v/.installed-dev")
    (tmp_path / "v" / ".installed-docs").unlink()
    assert _make_docs(tmp_path, "docs", "v/.installed-dev") == [
        "-m mkdocs build --strict -d site"]
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert "fanout[docs]" in extras["dev"]
    assert not {"ray", "pytest", "mypy"} & {re.split(r"[\[<>=]", dep)[0] for dep in extras["docs"]}


def test_the_site_searches_from_disk_with_nothing_fetched() -> None:
    """mkdocs.yml enables Material's offline plugin (the search index inlined as a script)
    and lists our own worker polyfill, so the plugin adds none from unpkg.com: the search of
    site/index.html opened from disk works offline (tests/test_docs_browser.py runs it)."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    plugins = [next(iter(p)) if isinstance(p, dict) else p for p in config["plugins"]]
    assert "search" in plugins and "offline" in plugins
    assert config["use_directory_urls"] is False and config["theme"]["font"] is False
    polyfills = config["extra"]["polyfills"]
    assert any("iframe-worker" in src for src in polyfills)  # else the plugin adds unpkg's
    for src in polyfills + config.get("extra_javascript", []) + config.get("extra_css", []):
        assert not urlsplit(src).scheme and not src.startswith("//"), src
        assert (DOCS / src).is_file(), src
