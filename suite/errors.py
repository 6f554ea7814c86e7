"""Errors the CLI turns into a one-paragraph message and exit code 2 (bad input)."""

from __future__ import annotations


class BadInput(Exception):
    """Input the user can fix: a malformed scenario, an unknown technique, a missing or corrupt
    results file, a device that is not there. The message names the file, the key and what is
    allowed."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or []

    def __str__(self) -> str:
        head = super().__str__()
        return head if not self.problems else head + "\n" + "\n".join(f"  {p}" for p in self.problems)
