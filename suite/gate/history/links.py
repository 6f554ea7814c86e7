"""A history's commits as links: the web page of a commit, derived from the repository's remote
(``git remote get-url origin``, or one given) in any of git's forms (``https://host/o/r.git``,
``git@host:o/r.git``, ``ssh://git@host:22/o/r.git``). GitHub (and GitHub Enterprise hosts named
github.*) and GitLab (gitlab.com and hosts named gitlab.*, subgroups included) are known; any
other host, a local path or a remote that is not a URL gives no link: the commit stays plain text.
Credentials in an https remote (``https://user:token@host/...``) never reach the link.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

_SCP_FORM = re.compile(r"^(?:[\w.-]+@)?(?P<host>[\w.-]+):(?P<path>(?!/)[^\s]+)$")  # git@github.com:o/r.git
_SEGMENT = re.compile(r"^[\w.-]+$")
_SHA = re.compile(r"^[0-9a-fA-F]{7,64}$")
COMMIT_PATHS = {"github": "commit", "gitlab": "-/commit"}


def _host_and_path(remote: str) -> tuple[str, str] | None:
    """(host, repository path) of a remote URL in URL or scp-like form; None for anything else."""
    remote = remote.strip()
    if "://" in remote:
        parts = urlsplit(remote)
        if parts.scheme not in ("https", "http", "ssh", "git", "git+ssh") or not parts.hostname:
            return None
        # https keeps its port (a web server's); ssh's and git's port is not the web page's
        port = f":{parts.port}" if parts.scheme in ("https", "http") and parts.port else ""
        return parts.hostname + port, parts.path
    found = _SCP_FORM.match(remote)
    return (found["host"], found["path"]) if found else None


def _forge(host: str) -> str | None:
    """Which forge's URL scheme ``host`` serves, by its name."""
    name = host.split(":")[0].lower()
    return next((forge for forge in COMMIT_PATHS if name == f"{forge}.com" or name.startswith(f"{forge}.")), None)


def commit_url_base(remote: str | None) -> str | None:
    """The URL a commit's hash is appended to (``https://github.com/o/r/commit/``), or None when
    the remote is not a GitHub or GitLab repository."""
    found = _host_and_path(remote) if remote else None
    forge = _forge(found[0]) if found is not None else None
    if found is None or forge is None:
        return None
    host, path = found
    path = path.strip("/")
    path = path[:-4] if path.endswith(".git") else path
    segments = path.split("/")
    if len(segments) < 2 or not all(_SEGMENT.match(s) and s not in (".", "..") for s in segments):
        return None
    return f"https://{host}/{'/'.join(segments)}/{COMMIT_PATHS[forge]}/"


def shown(remote: str) -> str:
    """``remote`` as a page may print it: the user and password of a URL form dropped (CI's origin
    often carries a token: ``https://gitlab-ci-token:...@host/o/r.git``)."""
    if "://" not in remote:
        return remote
    parts = urlsplit(remote.strip())
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return parts._replace(netloc=netloc).geturl()


def commit_url(base: str | None, commit: str | None) -> str | None:
    """``commit``'s page under ``base`` (:func:`commit_url_base`); None when either is missing or
    the commit is not a hash."""
    if not base or not commit or not _SHA.match(commit):
        return None
    return base + commit.lower()


def origin_remote(where: str | Path = ".") -> str | None:
    """``git remote get-url origin`` in ``where`` (None outside a checkout, without git or origin)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(where), "remote", "get-url", "origin"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None
