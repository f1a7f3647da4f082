"""The package as an application installs it: the built wheel, its metadata and files, and
dependency ranges that pip's resolver reconciles with an application's own pins.

Offline: the wheel is built without build isolation (hatchling is a dev dependency), and
the resolutions run with ``--no-index`` against stand-in wheels carrying only metadata, so
what is checked is the ranges the wheel declares, not what an index holds today.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements() -> list[Requirement]:
    """Every requirement of the package and of its extras, the package's own extras aside."""
    texts = [*PYPROJECT["dependencies"]]
    for extra in PYPROJECT["optional-dependencies"].values():
        texts.extend(extra)
    return [req for req in map(Requirement, texts) if req.name != PYPROJECT["name"]]


def _pins(path: Path) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[_canonical(name)] = Version(version.strip())
    return pins


def _canonical(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def _bounds(req: Requirement) -> tuple[Version, Version]:
    lower = [Version(s.version) for s in req.specifier if s.operator == ">="]
    upper = [Version(s.version) for s in req.specifier if s.operator == "<"]
    assert len(lower) == 1 and len(upper) == 1 and len(req.specifier) == 2, (
        f"{req}: a range, >= a tested lower bound and < the next major")
    return lower[0], upper[0]


def test_every_requirement_is_a_range_up_to_the_next_major() -> None:
    """From the tested lower bound to the major after the version of our runs."""
    ours = _pins(ROOT / "constraints" / "test.txt")
    for req in _requirements():
        upper = _bounds(req)[1]
        tested = ours[_canonical(req.name)]
        assert upper == Version(f"{tested.major + 1}"), f"{req}: upper bound not the next major"


def test_the_lowest_constraints_are_the_lower_bounds() -> None:
    """constraints/lowest.txt (what `make test-lowest` installs) pins each requirement at
    its lower bound, and nothing else."""
    expected = {_canonical(req.name): _bounds(req)[0] for req in _requirements()}
    assert _pins(ROOT / "constraints" / "lowest.txt") == expected


def test_the_versions_of_our_runs_are_within_the_ranges() -> None:
    pins = _pins(ROOT / "constraints" / "test.txt")
    for req in _requirements():
        assert _canonical(req.name) in pins, f"{req.name} is not pinned in constraints/test.txt"
        assert pins[_canonical(req.name)] in req.specifier, req


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, env=_isolated_pip())
    (built,) = out.glob("dbos_async-*.whl")
    return built


def test_the_wheel_carries_its_files_and_metadata(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(metadata_name).decode()
    assert "dbos_async/py.typed" in names
    migrations = sorted(p.name for p in (ROOT / "sql").glob("*.sql"))
    assert migrations and all(f"dbos_async/_sql/{m}" in names for m in migrations)
    for folder in ("static", "templates"):
        files = [p.name for p in (ROOT / "dbos_async" / "console" / folder).iterdir()]
        assert all(f"dbos_async/console/{folder}/{f}" in names for f in files), folder
    assert "Project-URL: Repository, https://github.com/dbos-async/dbos_async" in metadata
    assert "Classifier: Typing :: Typed" in metadata
    assert "Requires-Dist: pydantic<3,>=2.10.0" in metadata


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_install_lines_name_the_wheel_the_build_makes(wheel: Path, page: str) -> None:
    """The README's and the install page's wheel lines: the file `pip wheel` writes, the
    same name in both lines, so the copied command installs what was just built."""
    text = (ROOT / page).read_text()
    assert "pip wheel --no-deps -w dist ./dbos_async" in text
    named = {line.split("dist/", 1)[1].split("[", 1)[0].split()[0]
             for line in text.splitlines() if "dist/dbos_async-" in line}
    assert named == {wheel.name}, named


# ---- Resolution beside an application's pins ----

# What the stand-in index offers for each dependency besides its lower bound and the
# version of our runs: releases inside and outside our ranges.
EXTRA_RELEASES = {"pydantic": ["1.10.13", "2.11.7", "2.13.4", "3.0.0"],
                  "asyncpg": ["0.29.0", "0.31.0"], "starlette": ["0.46.0", "1.5.0"]}


@pytest.fixture(scope="module")
def index(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder of wheels for ``--find-links``: ours, and stand-ins for every dependency."""
    folder = tmp_path_factory.mktemp("index")
    (folder / wheel.name).write_bytes(wheel.read_bytes())
    ours = _pins(ROOT / "constraints" / "test.txt")
    for req in _requirements():
        name = _canonical(req.name)
        for version in {str(_bounds(req)[0]), str(ours[name]), *EXTRA_RELEASES.get(name, [])}:
            _stand_in(folder, name, version)
    yield folder


def _stand_in(folder: Path, name: str, version: str) -> None:
    """A wheel with metadata and no code, and no dependencies of its own."""
    stem = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{stem}.dist-info/METADATA",
                         f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{stem}.dist-info/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n")
        archive.writestr(f"{stem}.dist-info/RECORD", "")


def _isolated_pip() -> dict[str, str]:
    """The environment of a pip that reads no configuration file of this machine."""
    return {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1"}


def _resolve(index: Path, *requirements: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--no-index",
         "--ignore-installed", "--find-links", str(index), "dbos_async[fastapi,console]",
         *requirements],
        capture_output=True, text=True, env=_isolated_pip(), timeout=120)


@pytest.mark.parametrize("pin", ["pydantic==2.11.7", "pydantic==2.13.4", "pydantic==2.10.0",
                                 "asyncpg==0.31.0", "starlette==1.5.0"])
def test_an_application_pinning_a_dependency_within_our_range_resolves(
        index: Path, pin: str) -> None:
    result = _resolve(index, pin)
    assert result.returncode == 0, result.stdout + result.stderr
    name, _, version = pin.partition("==")
    assert f"{name}-{version}" in result.stdout


@pytest.mark.parametrize("pin", ["pydantic==1.10.13", "pydantic==3.0.0", "asyncpg==0.29.0",
                                 "starlette==0.46.0"])
def test_an_application_pinning_outside_our_range_is_told_so(index: Path, pin: str) -> None:
    result = _resolve(index, pin)
    assert result.returncode != 0
    assert "ResolutionImpossible" in result.stderr or "conflict" in result.stderr
