"""Where ``compare --history --since TEXT`` starts: a stored run's id, a stored commit (or its
prefix), else a git revision of the repository the command runs in (a release is usually a tag:
``v1.2``), resolved with ``git rev-parse --verify TEXT^{commit}``. From a git revision, the history
starts at the first run whose commit is that commit or descends from it (``git merge-base
--is-ancestor``), so a release whose own commit was never benchmarked still has a start.
Nothing matching is bad input (exit 2) saying what was tried. A run id or commit starts the
history at that run in run order (start time, then run id), in every case's history, including the
cases that run did not hold; that run itself is in it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpubench.errors import BadInput
from gpubench.gate.history.store import Point

GIT_TIMEOUT_S = 10


@dataclass
class Since:
    """A resolved ``--since``: ``how`` it matched, the git ``commit`` when it was a revision."""

    text: str
    how: str  # "run id", "commit", or "git revision"
    commit: str | None = None
    repo: Path | None = None
    _descends: dict[str, bool] = field(default_factory=dict, repr=False)
    start: tuple[str, str] | None = None  # a run id or commit: its first run's (start time, run id)

    def starts_at(self, point: Point) -> bool:
        """Is ``point`` at or after the start: in run order, the run named (a run id) or the first
        run of the commit named, whether or not that run holds ``point``'s case; from a git
        revision, a run of that commit or a descendant in git's history?"""
        if self.how in ("run id", "commit"):
            return self.start is not None and (point.started_at, point.run_id) >= self.start
        if not point.commit:
            return False
        if point.commit not in self._descends:
            self._descends[point.commit] = point.commit == self.commit or _is_ancestor(
                self.repo, self.commit, point.commit
            )
        return self._descends[point.commit]

    def describe(self) -> str:
        if self.how == "git revision":
            return f"{self.text} (git: commit {(self.commit or '')[:12]} and its descendants)"
        return f"{self.text} (a stored {self.how})"


_HEX = re.compile(r"[0-9a-f]{4,64}")
MIN_PREFIX = 7


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)


def _is_ancestor(repo: Path | None, ancestor: str | None, commit: str) -> bool:
    """0: an ancestor; 1: not; 128 (a commit this clone lacks) or git failing: not either. A
    stored commit that is not a hex hash (an imported file's free text) is never given to git."""
    if not _HEX.fullmatch(commit or "") or not _HEX.fullmatch(ancestor or ""):
        return False
    try:
        return _git(repo or Path.cwd(), "merge-base", "--is-ancestor", str(ancestor), commit).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def rev_parse(text: str, repo: Path) -> tuple[str | None, str]:
    """(the commit ``text`` names in ``repo``, or None; git's reason when it names none)."""
    if text.startswith("-"):  # never an option to git
        return None, "not a revision (it starts with '-')"
    try:
        out = _git(repo, "rev-parse", "--verify", "--quiet", f"{text}^{{commit}}")
    except FileNotFoundError:
        return None, "git is not installed"
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"git failed: {exc}"
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip(), ""
    return None, (out.stderr.strip() or f"no such revision there (exit {out.returncode})")


def resolve(text: str, points: Sequence[Point], repo: Path | None = None, *, where: str = "the history store") -> Since:
    """``text`` as a stored run id, else a stored commit prefix, else a git revision of ``repo``
    (default: the working directory); BadInput naming all three tries when none matches."""
    if any(p.run_id == text for p in points):
        return Since(text, "run id", start=min((p.started_at, p.run_id) for p in points if p.run_id == text))
    # A commit prefix must look like one (7+ hex digits, as git abbreviates), so a tag such as
    # "2024" or "abc" is not read as the prefix of whatever stored commit starts with it.
    if any(p.commit == text for p in points) or (
        _HEX.fullmatch(text) and len(text) >= MIN_PREFIX and any(p.commit and p.commit.startswith(text) for p in points)
    ):
        return Since(
            text,
            "commit",
            start=min((p.started_at, p.run_id) for p in points if p.commit and p.commit.startswith(text)),
        )
    repo = Path.cwd() if repo is None else repo
    commit, why = rev_parse(text, repo)
    if commit is not None:
        return Since(text, "git revision", commit, repo)
    raise BadInput(
        f"--since {text}: matches nothing. Tried: a run id, and a commit or commit prefix, of the "
        f"{len({p.run_id for p in points})} runs read from {where}; then a git revision of the "
        f"repository at {repo} (git rev-parse --verify '{text}^{{commit}}': {why}). Allowed: a stored "
        f"run's id or commit (or its prefix), or a tag or other revision of that repository (a CI "
        f"checkout needs the tags: actions/checkout with fetch-depth: 0)."
    )
