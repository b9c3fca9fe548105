"""Notice soon that files may have changed, without waking up every few seconds to look.

:class:`FileWatch` calls an async callback when any of some files may have changed: at once (after
a short settling delay) when Linux's inotify reports a change in one of their directories, and
every ``resync`` seconds regardless, as Kubernetes' dynamic certificate files do (fsnotify and a
one-minute resync). Where inotify cannot watch every directory (another OS, a watch limit reached,
a directory deleted) it polls every ``interval`` seconds instead, as before it existed.

Why: the serving certificate and the CA files were polled every 3 s by two timers. In an idle
50-node ``kcms standalone`` each wake-up cost 330-500 us of CPU (a cold path through the loop,
measured here with the process CPU clock every 5 ms), ~2 ms every 15 s cycle of ~14 ms: an eighth
of the process's CPU in a small cluster.

The directories, not the files, are watched: a Kubernetes Secret volume swaps a ``..data`` symlink
(a rename in the directory) and the file paths never change. A path that is a symlink elsewhere
has its target's directory watched too. Only events about the files' own names (the path's and its
target's) or a name starting with ``..`` (the Secret volume's) mean "look again"; the callback
compares what it reads. Other files in those directories are ignored: a log file written beside
the certificates would otherwise make every logged failure of a look trigger the next one. A
flood of events (a hostile or busy writer of those files) still gives at most one callback per
``settle`` seconds.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import struct
from collections.abc import Awaitable, Callable, Iterable

from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

RESYNC_SECONDS = 60.0  # a look regardless, as Kubernetes' dynamic certificate content
SETTLE_SECONDS = 0.2  # after an event, wait this long for the rest of a write (cert then key)

# inotify(7)
_IN_MODIFY = 0x2
_IN_ATTRIB = 0x4
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x1000000
_WATCH_MASK = (
    _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
    | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)
_READ_SIZE = 64 * 1024
_READS_PER_CALLBACK = 4  # a flood is drained over several loop turns, never in one


def _locations(paths: Iterable[str]) -> list[str]:
    """Each path as given (absolute) and its symlink target: where its events can come from."""
    return [q for p in paths if p for q in (os.path.abspath(p), os.path.realpath(p))]


def directories(paths: Iterable[str]) -> list[str]:
    """The directories to watch for ``paths``: each one's own, and its symlink target's."""
    return list(dict.fromkeys(os.path.dirname(q) for q in _locations(paths)))


def names(paths: Iterable[str]) -> frozenset[bytes]:
    """The file names whose events matter for ``paths``: each one's, and its symlink target's."""
    return frozenset(os.fsencode(os.path.basename(q)) for q in _locations(paths))


def _libc() -> ctypes.CDLL | None:
    try:  # the process's own symbols (libc's among them): find_library would run ldconfig
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1  # noqa: B018 - only Linux has it
    except (OSError, AttributeError):
        return None
    return libc


class FileWatch:
    """Calls ``on_change()`` when files in ``paths``' directories may have changed (see the module
    docstring). ``watching`` is True while inotify covers every directory; then the callback also
    runs every ``resync`` seconds, else every ``interval``. An exception from ``on_change`` is
    logged and the watch goes on. ``inotify=False`` polls only."""

    def __init__(
        self,
        paths: Iterable[str],
        on_change: Callable[[], Awaitable[object]],
        interval: float = 3.0,
        resync: float = RESYNC_SECONDS,
        settle: float = SETTLE_SECONDS,
        inotify: bool = True,
    ) -> None:
        paths = list(paths)
        self.dirs = directories(paths)
        self.names = names(paths)
        self.on_change = on_change
        self.interval = interval
        self.resync = max(resync, interval)
        self.settle = settle
        self.use_inotify = inotify
        self.watching = False
        self.events = 0  # inotify events read (for tests and debugging)
        self.relevant = 0  # of which about the files (or the directory itself)
        self.calls = 0  # callbacks run
        self._fd = -1
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- inotify ----------------------------------------------------------------------------------

    def _watch(self) -> bool:
        libc = _libc() if self.use_inotify and self.dirs else None
        if libc is None:
            return False
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            log.info("inotify unavailable (%s): polling every %g s", os.strerror(ctypes.get_errno()), self.interval)
            return False
        for d in self.dirs:
            if libc.inotify_add_watch(fd, os.fsencode(d), _WATCH_MASK) < 0:
                err = ctypes.get_errno()
                log.info("cannot watch %s (%s): polling every %g s", d, os.strerror(err), self.interval)
                os.close(fd)
                return False
        self._fd = fd
        asyncio.get_running_loop().add_reader(fd, self._readable)
        return True

    def _readable(self) -> None:
        lost = changed = False
        for _ in range(_READS_PER_CALLBACK):
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                lost = True
                break
            if not data:
                break
            at = 0
            while at + _EVENT.size <= len(data):
                _, mask, _, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + size].rstrip(b"\0")
                at += _EVENT.size + size
                self.events += 1
                if mask & (_IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF):
                    lost = True  # a watched directory went away or moved: poll from now on
                    self.relevant += 1
                elif mask & _IN_Q_OVERFLOW or name in self.names or name.startswith(b".."):
                    changed = True
                    self.relevant += 1
        if lost:
            self._unwatch()
            log.info("a watched directory went away: polling every %g s", self.interval)
        if lost or changed:
            self._changed.set()

    def _unwatch(self) -> None:
        if self._fd >= 0:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        self.watching = False

    # -- the loop ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            wait = self.resync if self.watching else self.interval
            try:
                async with asyncio.timeout(wait):
                    await self._changed.wait()
                await asyncio.sleep(self.settle)  # let the rest of a write arrive: one look for all
            except TimeoutError:
                pass
            self._changed.clear()
            self.calls += 1
            try:
                await self.on_change()
            except Exception:  # a broken look must not end the watch
                log.exception("reacting to a file change failed")

    def start(self) -> None:
        """Watch and call from the running loop."""
        if self._task is None:
            self.watching = self._watch()
            self._task = asyncio.create_task(self._run(), name="file-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self._unwatch()
