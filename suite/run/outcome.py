"""What a run gives its caller: the progress it reports as it goes (:class:`ProgressListener`), and
at the end its outcome (:class:`RunOutcome`: the run directory, the record, the exit code).

Both the supervisor (which produces them) and its callers (the CLI, scripts, tests) read these;
they live apart from :mod:`gpubench.run.supervisor` and :mod:`gpubench.run.runner` so neither side has to
import the other to name them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpubench.records.results import CaseRecord, RunRecord

if TYPE_CHECKING:  # (annotations only: reading a run's outcome needs no scenario parser)
    from gpubench.run.scenario import Case

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_TERMINATED = 143  # SIGTERM (128 + 15), as a shell reports a process it killed
EXIT_DISK_FULL = 74  # sysexits' EX_IOERR: a file of the run could not be written, the disk being full
# sysexits' EX_TEMPFAIL: every case that did not pass timed out on an overloaded machine (failure
# kind "overloaded"): nothing failed on its merits, but not everything was measured; try again
EXIT_OVERLOADED = 75


class ProgressListener(Protocol):
    """What a run tells its caller as it goes. ``note`` (optional: a listener without it has notices
    printed to stderr) is what a case says while it runs (:mod:`gpubench.records.notices`)."""

    def run_started(self, total: int) -> None: ...
    def case_started(self, index: int, case: Case) -> None: ...
    def case_finished(self, index: int, case: Case, record: CaseRecord) -> None: ...
    def run_finished(self) -> None: ...


class Silent:
    def run_started(self, total: int) -> None:
        pass

    def case_started(self, index: int, case: Case) -> None:
        pass

    def case_finished(self, index: int, case: Case, record: CaseRecord) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def run_finished(self) -> None:
        pass


@dataclass
class RunOutcome:
    run_dir: Path
    record: RunRecord

    @property
    def doc(self) -> dict[str, Any]:
        """The run as results.json holds it."""
        return self.record.to_dict()

    @property
    def exit_code(self) -> int:
        if self.record.disk_full:
            return EXIT_DISK_FULL
        if self.record.status == "interrupted":
            return EXIT_TERMINATED if self.record.signal == "SIGTERM" else EXIT_INTERRUPTED
        if self.record.status != "complete":  # aborted or crashed: not every case ran
            return EXIT_FAILED
        failed = [c for c in self.record.cases if c.status == "failed"]
        if not failed:
            return EXIT_OK
        overloaded = all(c.failure is not None and c.failure.kind == "overloaded" for c in failed)
        return EXIT_OVERLOADED if overloaded else EXIT_FAILED
