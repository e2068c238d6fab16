"""The installed distribution: one top-level name, `quotasched`, and nothing a user's own
`services`, `events` or `projections` package could collide with (issue 19, part 1)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = {"services": "quotasched.services", "events": "quotasched.events",
         "projections": "quotasched.projections", "examples": "quotasched.examples"}  # fmt: skip


def test_every_package_of_the_tree_is_listed_under_the_namespace():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])  # fmt: skip
    in_tree = {"quotasched"}
    for folder, name in PARTS.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_dir() and "__pycache__" not in path.parts and "_native" not in path.name \
                    and any(p.is_file() for p in path.iterdir()):  # fmt: skip (code or data)
                in_tree.add(".".join([name, *path.relative_to(ROOT / folder).parts]))
        in_tree.add(name)
    assert listed == in_tree


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel .` of a copy of the sources (a build writes build/ beside them)."""
    out, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
    ignore = shutil.ignore_patterns("__pycache__", "_native*", "*.egg-info")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("quotasched", *PARTS):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", str(source), "--no-deps",
                           "--no-build-isolation", "--wheel-dir", str(out)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "License classifiers are deprecated" not in done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    assert "project.license` as a TOML table is deprecated" not in done.stderr
    [built] = out.glob("quotasched-*.whl")
    return built


def test_the_wheel_adds_one_top_level_name(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert {name for name in top if not name.endswith(".dist-info")} == {"quotasched"}
    assert "quotasched/services/cli/main.py" in names
    assert "quotasched/examples/notebook.jsonl" in names  # `quotasched demo` needs it
    assert "quotasched/examples/simulate/itp-fixed.yaml" in names
    for static in ("index.html", "app.js", "style.css", "vendor/chart.umd.min.js",
                   "vendor/LICENSE.md", "vendor/PROVENANCE"):  # the web view, offline
        assert f"quotasched/services/web/static/{static}" in names
    assert not any("/_native/" in name for name in names)  # a build is local, never shipped


def test_an_installed_wheel_works_beside_a_users_own_services_package(wheel: Path, tmp_path):
    """A fresh venv with the wheel (its dependencies seen from this venv): `quotasched
    --version`, `replay` of the packaged notebook, and a pipeline whose own `services` package
    imports as its own while `quotasched.services` is ours."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    ours = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (site / "dependencies.pth").write_text(ours + "\n")  # the dependencies, not our package
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "--no-deps", str(wheel)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    pipeline = tmp_path / "pipeline"
    (pipeline / "services").mkdir(parents=True)
    (pipeline / "services" / "__init__.py").write_text("OWNER = 'the pipeline'\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    check = ("import services, quotasched, quotasched.services.client as client\n"
             "assert services.OWNER == 'the pipeline', services.__file__\n"
             "assert quotasched.__file__.startswith(%r), quotasched.__file__\n"
             "print(quotasched.__version__)\n") % str(site)  # fmt: skip
    done = subprocess.run([str(python), "-c", check], cwd=pipeline, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    version = done.stdout.strip()
    cli = env_dir / "bin" / "quotasched"
    done = subprocess.run([str(cli), "--version"], cwd=pipeline, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == f"quotasched {version}", done.stderr
    done = subprocess.run([str(python), "-c", "from quotasched import examples_dir; "
                           "print(examples_dir())"], cwd=pipeline, env=env, capture_output=True,
                          text=True)  # fmt: skip
    examples = Path(done.stdout.strip())
    assert str(examples).startswith(str(site)), examples
    done = subprocess.run([str(cli), "replay", str(examples / "notebook.jsonl")], cwd=pipeline,
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and '"JobDispatched"' in done.stdout, done.stderr[-2000:]


def test_shell_completion_is_offered():
    done = subprocess.run([str(Path(sys.executable).parent / "quotasched"), "--help"],
                          capture_output=True, text=True)  # fmt: skip
    assert "--install-completion" in done.stdout and "--version" in done.stdout


@pytest.mark.parametrize("words, offered", [
    ("up --executor ", "simulated process sagemaker agent none"),
    ("up --executor a", "agent"),
    ("executor --kind ", "simulated process sagemaker"),
    ("demo --executor ", "simulated agent"),
])  # fmt: skip
def test_shell_completion_offers_the_executors(words, offered):
    """What bash completion (`--install-completion`) offers after the option, by asking the
    CLI as the installed completion script does."""
    line = f"quotasched {words}"
    env = {**os.environ, "_QUOTASCHED_COMPLETE": "complete_bash", "COMP_WORDS": line,
           "COMP_CWORD": str(len(line.split()) - (0 if line.endswith(" ") else 1))}  # fmt: skip
    done = subprocess.run([str(Path(sys.executable).parent / "quotasched")], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == offered.split()
