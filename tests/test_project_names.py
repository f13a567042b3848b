"""The project speaks of itself by dates, commits and versions: no tracked file names a numbered work
period (the word session and a number), and no figure file carries one in its name (the old `-sNN`
suffix; figures are named `…-YYYY-MM-DD-<commit>…`, the date and commit of the journal entry that recorded them)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK_PERIOD = re.compile(r"\bsession[ -]?\d+", re.IGNORECASE)
PERIOD_IN_NAME = re.compile(r"-s\d{2}(?:drafter)?(?=[-.])")


def _tracked() -> list[Path]:
    """The repository's files: git's list in a checkout, else every file but the virtual environment's."""
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return [ROOT / name for name in out.decode().split("\0") if name]
    skip = {".git", ".venv", "__pycache__", ".pytest_cache"}
    return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def test_no_tracked_file_names_a_numbered_work_period():
    found = []
    for path in _tracked():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files (figures as PNG) and files deleted in the work tree
        for lineno, line in enumerate(text.splitlines(), 1):
            if WORK_PERIOD.search(line):
                found.append(f"{path.relative_to(ROOT)}:{lineno}: {WORK_PERIOD.search(line).group(0)}")
    assert found == [], "name the date and commit instead:\n" + "\n".join(found[:20])


def test_no_file_name_carries_a_work_period_number():
    names = [str(p.relative_to(ROOT)) for p in _tracked() if PERIOD_IN_NAME.search(p.name)]
    assert names == [], names[:20]

