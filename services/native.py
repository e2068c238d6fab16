"""The compiled decision core: build it with mypyc, and decide at import whether to use it.

The decision core (services/scheduler/core) is plain, fully typed Python.  Compiled with
mypyc into C extensions it decides the same facts, byte for byte, in about four fifths of
the time (docs/performance.md).  Compiling is optional and needs a C compiler:

    python -m quotasched.services.native build     # what `make test` and `make demo` run
    python -m quotasched.services.native status    # which core this checkout would load, and why
    python -m quotasched.services.native clean

A build goes to `services/scheduler/core/_native/`, beside the sources and outside git, with
a stamp: a digest of the sources it was compiled from (the core's and `events/`, whose types
it was compiled against) and of the interpreter.  `services.scheduler.core` puts that folder
first on its module search path only while the stamp matches, so a checkout whose sources
changed since the build runs them as they are now, never a stale binary; set
QUOTASCHED_PURE_PYTHON=1 to run the interpreted core whatever was built.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "services" / "scheduler" / "core"
DIRECTORY = CORE / "_native"
STAMP = DIRECTORY / "SOURCES"
PURE_ENV = "QUOTASCHED_PURE_PYTHON"
# Every module of the core but the package's own __init__ (which chooses the build).
MODULES = sorted(path.name for path in CORE.glob("*.py") if path.name != "__init__.py")
# The runtime library mypyc's extensions share, named inside the core package so the search
# path that finds the modules finds it too.
GROUP = "quotasched.services.scheduler.core._native_runtime"


def source_digest() -> str:
    """What a build depends on: the core's and the message types' sources, the interpreter."""
    digest = hashlib.sha256()
    digest.update(f"{sys.implementation.cache_tag} {sysconfig.get_config_var('SOABI')}".encode())
    for path in [*(CORE / name for name in MODULES), *sorted((ROOT / "events").glob("*.py"))]:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def state() -> tuple[bool, str]:
    """(use the compiled core?, why), for this checkout and interpreter."""
    if os.environ.get(PURE_ENV, "").strip() not in ("", "0"):
        return False, f"{PURE_ENV} is set"
    problem = _build_problem()
    if problem is not None:
        return False, problem
    return True, f"compiled with mypyc ({DIRECTORY})"


def _build_problem() -> str | None:
    """Why the build in DIRECTORY does not fit these sources and this interpreter, if it
    does not: what `state` reports, and what `build` checks before compiling again."""
    try:
        built = STAMP.read_text().strip()
    except OSError:
        return "not built (python -m quotasched.services.native build)"
    if built != source_digest():
        return "built from other sources or for another interpreter: rebuild it"
    present = {path.name.split(".")[0] for path in _extensions(DIRECTORY)}
    missing = [name for name in MODULES if name.removesuffix(".py") not in present]
    if missing:
        return f"the build lacks {', '.join(missing)}: rebuild it"
    return None


def _extensions(directory: Path) -> list[Path]:
    return sorted(path for path in directory.iterdir() if path.name.endswith(tuple(EXTENSION_SUFFIXES)))


def build(quiet: bool = False) -> int:
    """Compile every core module; 0 when built, or when nothing can be built here (no C
    compiler, no Python headers, no mypyc), after saying why: the interpreted core is always
    there.  1 when compiling fails (a type error in the core, say): that is a bug to fix."""
    import subprocess
    import tempfile

    say = (lambda text: None) if quiet else (lambda text: print(text, file=sys.stderr))
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        say(f"quotasched: no C compiler ({compiler}); the decision core runs interpreted")
        return 0
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        say(f"quotasched: no Python headers ({headers}; e.g. the python3.11-dev package); "
            "the decision core runs interpreted")  # fmt: skip
        return 0
    try:
        import mypyc  # noqa: F401  (shipped with mypy: pip install -e '.[native]')
    except ImportError:
        say("quotasched: mypyc is not installed (pip install -e '.[native]'); "
            "the decision core runs interpreted")  # fmt: skip
        return 0
    if _build_problem() is None:
        say("quotasched: the compiled decision core is up to date")
        return 0
    digest = source_digest()
    with tempfile.TemporaryDirectory(prefix="quotasched-native-") as work:
        source = _stage(Path(work) / "src")
        script = (
            "import sys\n"
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            "setup(name='quotasched-native', script_args=sys.argv[1:], ext_modules=mypycify(\n"
            f"    {['--ignore-missing-imports', *(f'quotasched/services/scheduler/core/{m}' for m in MODULES)]!r},\n"
            f"    opt_level='3', group_name={GROUP!r}))\n"
        )  # fmt: skip
        command = [sys.executable, "-c", script, "build_ext", "--build-lib", f"{work}/lib",
                   "--build-temp", f"{work}/temp"]  # fmt: skip
        say(f"quotasched: compiling the decision core with mypyc ({len(MODULES)} modules)...")
        done = subprocess.run(command, cwd=source, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-4000:] + done.stderr[-4000:], file=sys.stderr)
            print("quotasched: compiling the decision core failed (above)", file=sys.stderr)
            return 1
        built = _extensions(Path(work) / "lib" / "quotasched" / "services" / "scheduler" / "core")
        staging = DIRECTORY.with_name("_native.new")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for path in built:
            shutil.copy2(path, staging / path.name)
        (staging / "SOURCES").write_text(digest + "\n")
        clean()
        staging.rename(DIRECTORY)
    say(f"quotasched: compiled decision core in {DIRECTORY.relative_to(ROOT)} "
        f"({len(built)} extensions)")  # fmt: skip
    return 0


def _stage(source: Path) -> Path:
    """A copy of the core and the message types under their installed names
    (quotasched/services/scheduler/core, quotasched/events), for mypyc, which names a module
    after the folders it sits in: the source tree keeps them at services/ and events/."""
    package = source / "quotasched"
    for folder, parts in ((package / "events", ROOT / "events"),
                          (package / "services" / "scheduler" / "core", CORE)):  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        for path in parts.glob("*.py"):
            shutil.copy2(path, folder / path.name)
    for folder in (package, package / "services", package / "services" / "scheduler"):
        (folder / "__init__.py").touch()
    shutil.copy2(Path(__file__), package / "services" / "native.py")  # the core's __init__ asks it
    return source


def clean() -> None:
    shutil.rmtree(DIRECTORY, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m quotasched.services.native", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["build", "status", "clean"])
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.action == "build":
        return build(args.quiet)
    if args.action == "clean":
        clean()
        return 0
    compiled, why = state()
    print(f"{'compiled' if compiled else 'interpreted'}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
