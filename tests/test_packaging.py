"""What a non-editable install (``pip install .``) ships: every package folder, and the data files read at run
time. pyproject.toml lists the packages explicitly (package-dir maps ``lib/llmarch``), so a new subpackage that is
not listed would be missing from the wheel while every test here, run from the tree, still passes."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_folders() -> set[str]:
    found = set()
    for top, folder in CONFIG["package-dir"].items():
        base = ROOT / folder
        found |= {".".join((top, *init.parent.relative_to(base).parts)) for init in base.rglob("__init__.py")
                  if "__pycache__" not in init.parts}
    return found


def test_every_package_folder_is_listed():
    assert set(CONFIG["packages"]) == package_folders()


def test_data_files_read_at_run_time_are_package_data():
    data = CONFIG["package-data"]
    assert "checkpoints/*.pt" in data["llmarch"] and any((ROOT / "lib/llmarch/checkpoints").glob("*.pt"))
    assert "*.csv" in data["autograder.assignments"] and (ROOT / "autograder/assignments/ps11_loss_target.csv").exists()
