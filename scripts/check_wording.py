"""Fail when the repository dates its content by numbered work periods instead of dates.

Figures and decisions are dated (2026-12-01) or named by commit; a phrase that counts the
periods in which the work was done means nothing to a reader of the product. A "session" in
the sense of a Colab, kernel, JupyterLab, HTTP or pytest session is fine: those words on the
line, or on the two lines before it, let a demonstrative "session" phrase stand.

    python scripts/check_wording.py            # every tracked or new file in the repository
    python scripts/check_wording.py FILE ...   # only these

Prints ``file:line: text`` for each phrase found and exits 1 if there is one.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".ipynb", ".json", ".txt", ".toml", ".sh", ".cfg", ".yaml", ".yml"}
SUFFIXES |= {".js", ".css", ".cpp", ".h", ".html"}
NAMES = {"Makefile"}
SKIP = ("steer_widgets/widgets/static/",)  # vendored third-party JavaScript

_ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
    r"\d+(?:st|nd|rd|th)"
)
_LATE_ORDINALS = _ORDINALS.split("|", 2)[2]  # "since the second" may well mean a second run
_NOUN = r"(?:session|wave|work[- ]period)s?"
# an ordinal or a number, then the noun (with a space or a hyphen between)
NUMBERED = re.compile(rf"\b(?:{_ORDINALS}|\d+)[- ]{_NOUN}\b", re.IGNORECASE)
# "since the" and an ordinal from the third on, with no noun after it
BARE = re.compile(
    rf"\b(?:since|until|through) the (?:{_LATE_ORDINALS})\b(?=\s*(?:[,.;:)]|$))", re.IGNORECASE
)
# a period named relative to now (this, the previous, an earlier one, the project's)
RELATIVE = re.compile(
    r"\b(?:this|that|previous|prior|earlier|later|next|last|current|past|same|our|these|"
    rf"those|many|several|project's)\s+{_NOUN}\b",
    re.IGNORECASE,
)
# words that make "session" a notebook, kernel or network session
ALLOWED = re.compile(
    r"colab|kernel|jupyter|notebook|ipython|http|requests|browser|pytest|scope|ssh|tmux|login",
    re.IGNORECASE,
)


def scan_text(text: str) -> list[tuple[int, str]]:
    """(line number, line) for each line of ``text`` that holds a numbered work period."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        if NUMBERED.search(line) or BARE.search(line):
            found.append((i + 1, line.strip()))
        elif RELATIVE.search(line) and not ALLOWED.search("\n".join(lines[max(0, i - 2) : i + 1])):
            found.append((i + 1, line.strip()))
    return found


def repository_files(root: Path = REPO) -> list[Path]:
    """Tracked files and new files git does not ignore; every file when there is no git."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        names = sorted(set(out.splitlines()))
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
    return [root / n for n in names if _checked(n) and (root / n).is_file()]


def _checked(name: str) -> bool:
    path = Path(name)
    if name.startswith(SKIP) or any(part.startswith(".") for part in path.parts):
        return False
    return path.suffix in SUFFIXES or path.name in NAMES


def scan_files(paths: Iterable[Path], root: Path = REPO) -> list[str]:
    """``file:line: text`` for every phrase found in ``paths``."""
    report = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        report += [f"{shown}:{n}: {line}" for n, line in scan_text(text)]
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    paths = [Path(a).resolve() for a in args] if args else repository_files()
    report = scan_files(paths)
    for line in report:
        print(line)
    if report:
        print(
            f"{len(report)} line(s) date content by numbered work periods: "
            "write a date (2026-12-01) or a commit hash instead",
            file=sys.stderr,
        )
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())
