"""After `pip install .`, from any folder: the packaged default config (the README's models
and scorers) and the sample prompts are there, and `fanout compare` and `fanout batch`
run on them.  The wheel is built offline (hatchling, no build isolation) and installed
with --no-deps into a fresh venv that borrows the dev venv's site-packages (a .pth line:
its .pth files, the editable checkout's among them, are not read)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

import fanout.config

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(fanout.config.__file__).parent / "data"


def test_the_sample_prompts_are_the_packaged_ones() -> None:
    assert (ROOT / "examples/prompts.jsonl").read_bytes() == (DATA / "prompts.jsonl").read_bytes()
    lines = [json.loads(line) for line in (DATA / "prompts.jsonl").read_text().splitlines()]
    assert len(lines) == 12 and all(line.get("expected") for line in lines)
    assert len({line["id"] for line in lines}) == 12


def test_an_installed_wheel_runs_the_readme_from_any_folder(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="the dev extra builds the wheel offline")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(wheels)], check=True,
                   capture_output=True, timeout=120)
    (wheel,) = wheels.glob("fanout-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True, timeout=120)
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "dev-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "OPENAI_BASE_URL", "OPENAI_API_KEY")}
    fanout_command = str(env_dir / "bin" / "fanout")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([fanout_command, *args], cwd=work, env=environ, text=True,
                              capture_output=True, timeout=120)

    where = subprocess.run([str(python), "-c", "import fanout; print(fanout.__file__)"],
                           cwd=work, env=environ, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(site)  # the wheel's, not the checkout's
    # A checkout's compiled core (gitignored) stays out of the platform-independent wheel.
    assert run("--version").stdout.endswith("(core: pure Python)\n")
    compared = run("compare", "Paris", "-m", "echo", "-m", "writer")
    assert compared.returncode == 0, compared.stderr
    prompts = Path(site) / "fanout" / "data" / "prompts.jsonl"
    batched = run("batch", str(prompts), "-m", "echo", "-o", "run.jsonl",
                  "--score", "has-answer", "--score", "judged")
    assert batched.returncode == 0, batched.stderr
    records = (work / "run.jsonl").read_text().splitlines()
    scores = [json.loads(line) for line in (work / "run.scores.jsonl").read_text().splitlines()]
    assert len(records) == 12 and len(scores) == 24
    assert {s["scorer"] for s in scores} == {"has-answer", "judged"}


def test_a_wheel_built_with_the_hook_runs_the_compiled_core(tmp_path: Path) -> None:
    """HATCH_BUILD_HOOK_ENABLE_CUSTOM=1 (hatch_build.py): a platform wheel holding the core
    compiled with mypyc, built from a copy of the tree (the checkout's own compiled modules
    are never rewritten under a running test)."""
    pytest.importorskip("hatchling", reason="the dev extra builds the wheel offline")
    pytest.importorskip("mypyc", reason="the dev extra's mypy compiles the core")
    sys.path.insert(0, str(ROOT))
    try:
        import build_core
    finally:
        sys.path.remove(str(ROOT))
    why = build_core.missing_compiler()
    if why:
        pytest.skip(f"the core cannot be compiled here: {why}")
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", source)
    for name in ("_fanout_entry.py", "build_core.py", "hatch_build.py", "README.md"):
        shutil.copy2(ROOT / name, source)
    shutil.copytree(ROOT / "fanout", source / "fanout",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    wheels = tmp_path / "wheels"
    environ = {**os.environ, "HATCH_BUILD_HOOK_ENABLE_CUSTOM": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(wheels)], check=True,
                   capture_output=True, timeout=600, env=environ)
    (wheel,) = wheels.glob("fanout-*.whl")
    assert "-py3-none-any" not in wheel.name  # a platform wheel
    target = tmp_path / "installed"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ["PYTHONPATH"] = str(target)
    done = subprocess.run([sys.executable, "-c", "import fanout.core, fanout.cli.main as m; "
                           "print(fanout.core.__file__, fanout.core.COMPILED)"],
                          cwd=tmp_path, env=environ, capture_output=True, text=True, check=True)
    assert done.stdout == f"{target / 'fanout' / 'core' / '__init__.py'} True\n", done.stdout
