"""A venv of pinned PyPI packages under provm's cache, made on first use.

The scripts that need Python packages Debian does not ship
(scripts/check-ro-crate, scripts/duckdb) install them here, pinned, into a
venv under provm's cache ($PROVM_CACHE, else $XDG_CACHE_HOME/provm, else
~/.cache/provm), never into the repository: the first run needs PyPI,
later ones nothing.
"""

import fcntl
import os
import subprocess
import sys
import venv
from pathlib import Path


def cache_dir() -> Path:
    if os.environ.get("PROVM_CACHE"):
        return Path(os.environ["PROVM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "provm"


def ensure(name: str, packages: list) -> Path:
    """The python of the venv `name` with `packages` installed (once).

    One venv per pinned set: a new pin gets a fresh venv."""
    directory = cache_dir() / (f"{name}-venv-" + "-".join(p.replace("==", "_") for p in packages))
    python = directory / "bin" / "python"
    installed = directory / "installed"
    directory.parent.mkdir(parents=True, exist_ok=True)
    # Two runs at once (tests side by side) must not make it over each
    # other: the second's clear=True broke the first's pip mid-install.
    with open(directory.parent / f"{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not installed.exists():
            print(f"{name}: installing {' '.join(packages)} into {directory}", file=sys.stderr)
            venv.create(directory, with_pip=True, clear=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *packages],
                check=True,
            )
            installed.write_text("\n".join(packages) + "\n")
    return python


def run_inside(name: str, packages: list, script: str) -> None:
    """Runs `script` again with the venv's python unless it already runs
    there: what follows the call has the packages."""
    python = ensure(name, packages)
    if Path(sys.prefix).resolve() != python.parent.parent.resolve():
        os.execv(str(python), [str(python), script, *sys.argv[1:]])
