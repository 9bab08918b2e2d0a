"""The base of every object that owns a C handle: close() once (also at
interpreter exit, before the library's threads could call into a finalising
Python), use after close raises ClosedError, `with` closes."""
import atexit
import threading
import weakref

from . import errors

_open = weakref.WeakSet()
_open_lock = threading.Lock()
_callback = threading.local()  # depth of library callbacks running on this thread
_deferred = []  # (closer, ptr) of handles finalised on a library thread


class callback_scope:
    """Marks the current thread as running a library callback (bus messages and
    events): a handle must not be closed from there (its owner would wait for
    this very thread), so finalisers defer and explicit closes refuse or defer."""

    def __enter__(self):
        _callback.depth = getattr(_callback, "depth", 0) + 1

    def __exit__(self, *exc):
        _callback.depth -= 1


def in_callback():
    return getattr(_callback, "depth", 0) > 0


def drain_deferred():
    """Closes the handles whose finaliser ran on a library thread (called from
    ordinary threads, on the next use of any handle, and at exit)."""
    while _deferred and not in_callback():
        with _open_lock:
            if not _deferred:
                return
            closer, ptr = _deferred.pop()
        try:
            closer(ptr)
        except Exception:  # noqa: BLE001
            pass


class Handle:
    _what = "handle"

    def __init__(self, ptr, closer):
        self._ptr = ptr
        self._closer = closer
        with _open_lock:
            _open.add(self)

    @property
    def closed(self):
        return self._ptr is None

    def _p(self):
        """The raw handle; ClosedError once closed."""
        if _deferred:
            drain_deferred()
        if self._ptr is None:
            raise errors.ClosedError(self._what)
        return self._ptr

    def close(self):
        """Releases the handle (idempotent)."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._before_close()
            self._closer(ptr)

    def _before_close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if in_callback():  # the garbage collector ran on a library thread
                ptr, self._ptr = self._ptr, None
                if ptr is not None:
                    with _open_lock:
                        _deferred.append((self._closer, ptr))
                return
            self.close()
        except Exception:  # noqa: BLE001 (never raise from a finaliser)
            pass


@atexit.register
def _close_all():
    # Newest first: a borrowed handle (a runtime's bus) closes before its owner.
    with _open_lock:
        handles = list(_open)
    for h in reversed(handles):
        try:
            h.close()
        except Exception:  # noqa: BLE001
            pass
    drain_deferred()


class Memory:
    """C memory shared by NumPy views: freed (with `closer`) when the last
    view and the object that made it are gone, never while a view could
    still read it."""

    def __init__(self, ptr, closer):
        self._ptr = ptr
        self._closer = closer

    def __del__(self):
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            try:
                self._closer(ptr)
            except Exception:  # noqa: BLE001
                pass
