"""A bearer token kept in a file (a mounted Secret, a projected ServiceAccount token), re-read when
the file changes: one reader for the store (its own token), the store's clients, the collector's
token towards agents and the agent's push token."""

from __future__ import annotations

import logging
import os

__all__ = ["MAX_TOKEN_BYTES", "TokenFile"]

log = logging.getLogger(__name__)

MAX_TOKEN_BYTES = 16 << 10  # a token file larger than this is not a token


class TokenFile:
    """A bearer token kept in a file, re-read when the file changes (its inode, size or times).

    A rotation that is not atomic (the file truncated, then written) or a Secret whose links are
    being swapped can leave the file missing, empty, or holding something that is not a token for a
    moment. Then the last good token stays in force, as client-go's cached token source keeps the
    previous token when re-reading its file fails; the file is read again as soon as it changes. A
    half-written token cannot be told from a short token: it is used until the write completes,
    which changes the file's size and so makes it read again (callers holding the new token get 401
    meanwhile, never a 500).

    ``read()`` never raises; it returns ``""`` while no usable token was ever loaded (a store then
    answers 503 on its protected paths, a client refuses to send a request).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int, int] | None = None
        self._token = ""
        self.problem = ""  # why the file's current content is not used ("" when it is)
        self.read()

    def __call__(self) -> str:
        """:meth:`read`: a ``TokenFile`` is a token source (``Callable[[], str | None]``)."""
        return self.read()

    def read(self) -> str:
        try:
            st = os.stat(self.path)
        except OSError as e:
            self._unusable(None, f"cannot read it: {e.strerror or e}")
            return self._token
        seen = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if seen != self._seen:
            token, problem = _read_token(self.path)
            if problem:
                self._unusable(seen, problem)
            else:
                if self._token and token != self._token:
                    log.info("token file %s: a new token is in force", self.path)
                self._token, self._seen, self.problem = token, seen, ""
        return self._token

    def _unusable(self, seen: tuple[int, int, int, int] | None, problem: str) -> None:
        if problem != self.problem:  # one line per change, not one per request
            keeping = "keeping the previous token" if self._token else "no token loaded yet"
            log.warning("token file %s: %s; %s", self.path, problem, keeping)
        self.problem = problem
        self._seen = seen


def _read_token(path: str) -> tuple[str, str]:
    """``(token, "")`` or ``("", what is wrong)``: one word of visible ASCII, as a Bearer token is."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as e:
        return "", f"cannot read it: {e.strerror or e}"
    if len(raw) > MAX_TOKEN_BYTES:
        return "", f"it is larger than {MAX_TOKEN_BYTES} bytes"
    token = raw.strip()
    if not token:
        return "", "it is empty"
    if any(b < 0x21 or b > 0x7E for b in token):
        return "", "it holds characters a bearer token cannot have (spaces, control or non-ASCII)"
    return token.decode("ascii"), ""
