"""agentrt.Bus: the agent's authenticated connection to the run's message bus
(comms/bus_client.h): publish, subscribe from an offset (with a callback, or
pulled as an iterator), direct messages, request/reply, and the positions to
store in a checkpoint."""
import contextlib
import ctypes
import threading
import time

from . import _lib, errors
from ._handle import Handle, callback_scope, in_callback

EVENT_KINDS = ("connected", "reconnecting", "broker_restarted", "offset_expired", "failed")


def _payload(data, what="payload"):
    """(pointer, length, keep-alive) of a bytes-like payload, without a copy."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if isinstance(data, bytes):
        return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p), len(data), data
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError("%s must be bytes-like (bytes, bytearray, memoryview, a NumPy array), "
                        "not %s" % (what, type(data).__name__)) from None
    if not view.c_contiguous:
        raise ValueError("%s must be contiguous" % what)
    if view.nbytes == 0:
        return None, 0, view
    if view.readonly:
        raw = bytes(view)  # ctypes cannot point into a read-only buffer it did not make
        return ctypes.cast(ctypes.c_char_p(raw), ctypes.c_void_p), len(raw), raw
    buf = (ctypes.c_char * view.nbytes).from_buffer(view.cast("B"))
    return ctypes.cast(buf, ctypes.c_void_p), view.nbytes, (view, buf)


def _start(start):
    """(kind, offset) of start="earliest" | "latest" | an offset (int)."""
    if start == "earliest":
        return 0, 0
    if start == "latest":
        return 1, 0
    if isinstance(start, bool) or not isinstance(start, int):
        raise TypeError('start must be "earliest", "latest" or an offset (int), not %r' % (start,))
    if start < 0:
        raise ValueError("start offset must be >= 0, got %d" % start)
    return 2, start


class Message:
    """One message: topic, offset, payload (bytes), content_type, publisher (the
    authenticated agent), request_id (non-zero: a request to reply to),
    publish_time_ns."""

    __slots__ = ("topic", "offset", "payload", "content_type", "publisher", "request_id",
                 "publish_time_ns")

    def __init__(self, ptr):
        lib = _lib.lib()
        size = ctypes.c_size_t()
        data = lib.agentrt_message_payload(ptr, ctypes.byref(size))
        self.payload = ctypes.string_at(data, size.value) if size.value else b""
        self.topic = lib.agentrt_message_topic(ptr).decode("utf-8", "replace")
        self.offset = lib.agentrt_message_offset(ptr)
        self.content_type = lib.agentrt_message_content_type(ptr).decode("utf-8", "replace")
        self.publisher = lib.agentrt_message_publisher(ptr).decode("utf-8", "replace")
        self.request_id = lib.agentrt_message_request_id(ptr)
        self.publish_time_ns = lib.agentrt_message_publish_time_ns(ptr)

    def __repr__(self):
        return "<agentrt.Message %s@%d from %s, %d bytes>" % (self.topic, self.offset,
                                                              self.publisher, len(self.payload))


class Subscription:
    """A subscription (Bus.subscribe). With a callback, messages arrive on a
    thread of the library, one at a time in offset order. Without one, iterate
    it (``for m in sub``) or call ``next(timeout)``; the stream pauses while
    ``capacity`` messages wait, nothing is dropped. ``events()`` returns what
    happened to the stream (connected, broker_restarted, offset_expired, ...).
    ``close()`` ends it; no callback runs after close returns."""

    def __init__(self, bus, sid, pulled, keep):
        self._bus = bus
        self.id = sid
        self._pulled = pulled
        self._keep = keep  # the ctypes callbacks must live as long as the subscription
        self._events = []
        self._cancelled = False  # closed from a callback: delivery stopped, stream not ended yet
        self._ending = False  # being unsubscribed right now

    @property
    def closed(self):
        return self._keep is None or self._cancelled or self._ending

    def next(self, timeout=None):
        """The next message, or None after ``timeout`` seconds (None: wait)."""
        if not self._pulled:
            raise TypeError("this subscription delivers to its callback; it has no next()")
        if self.closed:
            raise errors.ClosedError("subscription")
        out = ctypes.c_void_p()
        deadline = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
        while True:
            # Wait in slices of at most 200 ms so that Ctrl-C reaches Python.
            ms = 200
            if deadline is not None:
                ms = max(0, min(ms, int((deadline - time.monotonic()) * 1000)))
            with self._bus._in_flight():  # Bus.close() waits for this call to return
                if self.closed:
                    raise errors.ClosedError("subscription")
                code = _lib.lib().agentrt_bus_next(self._bus._p(), self.id, ms, ctypes.byref(out))
                if code != 0 and self.closed:  # closed by another thread meanwhile
                    raise errors.ClosedError("subscription")
                _lib.check(code, errors.BusError)
            if out.value:
                try:
                    return Message(out)
                finally:
                    _lib.lib().agentrt_message_free(out)
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def __iter__(self):
        while True:
            m = self.next()
            if m is not None:
                yield m

    def events(self):
        """The stream's events since the last call: [{"kind", "topic", "offset",
        "earliest", "code", "message"}]."""
        if self._pulled and not self.closed:
            out = ctypes.c_void_p()
            _lib.check(_lib.lib().agentrt_bus_events(self._bus._p(), self.id, ctypes.byref(out)),
                       errors.BusError)
            self._events.extend(_lib.take_json(out))
        events, self._events = self._events, []
        return events

    def close(self):
        """Ends the subscription. From one of this bus's callbacks it only stops
        delivery at once (no callback of it runs after close returns); the
        stream itself ends at the next call on the bus from another thread, or
        when the bus closes."""
        if self.closed or self._cancelled:
            return
        if in_callback() and not self._pulled:
            self._cancelled = True  # the C side cannot end it from a callback thread
            self._bus._pending_unsubscribe.append(self)
            return
        self._unsubscribe()

    def _unsubscribe(self):
        if not self._bus.closed:
            self._ending = True  # a next() on another thread now ends with ClosedError
            try:
                _lib.check(_lib.lib().agentrt_bus_unsubscribe(self._bus._p(), self.id),
                           errors.BusError)  # on failure it goes on, and stays known
            except errors.Error:
                self._ending = False
                raise
        self._bus._subs.pop(self.id, None)
        self._keep = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Bus(Handle):
    """The agent's bus connection: ``rt.bus``, ``Bus.from_environment()``, or
    ``Bus.connect("host:port", agent, token)``. Failed calls raise BusError with
    the gRPC status code (``e.code``, ``e.code_name``)."""

    _what = "bus"

    def __init__(self, ptr, owner=None):
        super().__init__(ptr, _lib.lib().agentrt_bus_close)
        self._owner = owner
        self._subs = {}
        self._pending_unsubscribe = []  # closed from a callback; ended on the next call here
        self._calls = 0  # blocking calls (Subscription.next) in progress on other threads
        self._calls_done = threading.Condition()

    @contextlib.contextmanager
    def _in_flight(self):
        with self._calls_done:
            self._calls += 1
        try:
            yield
        finally:
            with self._calls_done:
                self._calls -= 1
                self._calls_done.notify_all()

    def _p(self):
        ptr = super()._p()
        while self._pending_unsubscribe and not in_callback():
            sub = self._pending_unsubscribe.pop()
            try:
                sub._unsubscribe()
            except errors.Error:
                pass  # it stays cancelled: nothing more is delivered to Python
        return ptr

    @classmethod
    def _borrowed(cls, ptr, owner):
        return cls(ptr, owner)

    @classmethod
    def from_environment(cls):
        """The agent's own connection (AGENTRT_BUS and AGENTRT_TOKEN_FILE)."""
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().agentrt_bus_from_environment(ctypes.byref(out)), errors.BusError)
        return cls(out)

    @classmethod
    def connect(cls, address, agent, token):
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().agentrt_bus_connect(_lib.encode(address, "address"),
                                                  _lib.encode(agent, "agent"),
                                                  _lib.encode(token, "token"), ctypes.byref(out)),
                   errors.BusError)
        return cls(out)

    def wait_ready(self, timeout=10.0):
        _lib.check(_lib.lib().agentrt_bus_wait_ready(self._p(), _lib.timeout_ms(timeout)),
                   errors.BusError)

    def publish(self, topic, payload, content_type=None):
        """Stores one message; returns its offset."""
        ptr, size, keep = _payload(payload)
        offset = ctypes.c_int64()
        _lib.check(_lib.lib().agentrt_bus_publish(self._p(), _lib.encode(topic, "topic"), ptr,
                                                  size, _lib.encode(content_type, "content_type"),
                                                  ctypes.byref(offset)), errors.BusError)
        del keep
        return offset.value

    def publish_async(self, topic, payload, content_type=None):
        """Queues one message (stored in order in the background; blocks while
        too many are unacknowledged, or, for up to the call timeout each,
        while 64 payloads written into the broker's spool, or 128 MiB of
        them, wait for their answers). Failures come out of flush()."""
        ptr, size, keep = _payload(payload)
        _lib.check(_lib.lib().agentrt_bus_publish_async(self._p(), _lib.encode(topic, "topic"),
                                                        ptr, size,
                                                        _lib.encode(content_type, "content_type")),
                   errors.BusError)
        del keep

    def flush(self, timeout=10.0):
        """Waits until every async publish is stored; the first failure since the
        last flush raises BusError."""
        _lib.check(_lib.lib().agentrt_bus_flush(self._p(), _lib.timeout_ms(timeout)),
                   errors.BusError)

    def send(self, to, payload):
        """A direct message to agent ``to``'s inbox; returns its offset there."""
        ptr, size, keep = _payload(payload)
        offset = ctypes.c_int64()
        _lib.check(_lib.lib().agentrt_bus_send(self._p(), _lib.encode(to, "to"), ptr, size,
                                               ctypes.byref(offset)), errors.BusError)
        del keep
        return offset.value

    def request(self, to, payload, timeout=10.0):
        """Sends a request to ``to`` and waits for its reply (a Message whose
        publisher is the replier). BusError DEADLINE_EXCEEDED after ``timeout``."""
        ptr, size, keep = _payload(payload)
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().agentrt_bus_request(self._p(), _lib.encode(to, "to"), ptr, size,
                                                  _lib.timeout_ms(timeout), ctypes.byref(out)),
                   errors.BusError)
        del keep
        try:
            return Message(out)
        finally:
            _lib.lib().agentrt_message_free(out)

    def reply(self, request_id, payload):
        ptr, size, keep = _payload(payload)
        _lib.check(_lib.lib().agentrt_bus_reply(self._p(), int(request_id), ptr, size),
                   errors.BusError)
        del keep

    def subscribe(self, topic, callback=None, start="earliest", incarnation=0,
                  skip_expired=False, on_event=None, capacity=1024):
        """Subscribes to ``topic`` (None: this agent's own inbox) from ``start``:
        "earliest", "latest" or an offset (restore one with the ``incarnation``
        it was read from, see positions()). ``callback(message)`` runs on a
        thread of the library; without a callback the Subscription is pulled
        (iterate it). skip_expired: go on from the earliest held message when
        ``start`` fell out of retention (else the subscription fails)."""
        kind, offset = _start(start)
        sid = ctypes.c_uint64()
        t = None if topic is None else _lib.encode(topic, "topic")
        if callback is None:
            if on_event is not None:
                raise TypeError("on_event goes with a callback; a pulled subscription has events()")
            if int(capacity) < 1:
                raise ValueError("capacity must be >= 1")
            _lib.check(_lib.lib().agentrt_bus_subscribe_queue(
                self._p(), t, kind, offset, int(incarnation), 1 if skip_expired else 0,
                int(capacity), ctypes.byref(sid)), errors.BusError)
            sub = Subscription(self, sid.value, True, ())
        else:
            if not callable(callback):
                raise TypeError("callback must be callable")
            holder = {}

            def on_message(_user, ptr):
                with callback_scope():
                    sub = holder.get("sub")
                    if sub is not None and sub._cancelled:
                        return
                    callback(Message(ptr))

            def on_ev(_user, kind_, topic_, offset_, earliest, code, message):
                event = {"kind": EVENT_KINDS[kind_], "topic": topic_.decode("utf-8", "replace"),
                         "offset": offset_, "earliest": earliest, "code": code,
                         "message": message.decode("utf-8", "replace")}
                with callback_scope():
                    if on_event is not None:
                        on_event(event)
                    elif "sub" in holder:
                        holder["sub"]._events.append(event)

            keep = (_lib.MESSAGE_FN(on_message), _lib.EVENT_FN(on_ev))
            _lib.check(_lib.lib().agentrt_bus_subscribe(
                self._p(), t, kind, offset, int(incarnation), 1 if skip_expired else 0, keep[0],
                keep[1], None, ctypes.byref(sid)), errors.BusError)
            sub = Subscription(self, sid.value, False, keep)
            holder["sub"] = sub
        self._subs[sub.id] = sub
        return sub

    def receive(self, callback=None, start="earliest", **kwargs):
        """subscribe() to this agent's own inbox (direct messages and requests)."""
        return self.subscribe(None, callback, start, **kwargs)

    def positions(self):
        """(offsets, incarnation): the next offset of every subscribed topic and
        the broker incarnation they belong to; store both in a checkpoint and
        pass them back to subscribe(start=offset, incarnation=...)."""
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().agentrt_bus_positions(self._p(), ctypes.byref(out)), errors.BusError)
        p = _lib.take_json(out)
        return p["offsets"], p["incarnation"]

    def stats(self):
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().agentrt_bus_stats(self._p(), ctypes.byref(out)), errors.BusError)
        return _lib.take_json(out)

    def _before_close(self):
        # The C side ends the subscriptions; their callbacks may go after that.
        for sub in list(self._subs.values()):
            sub._keep = None
        self._subs.clear()

    def close(self):
        if self._ptr is not None and in_callback():
            raise errors.error_for(9, "a bus cannot be closed from one of its own callbacks "
                                      "(close it from another thread)", errors.BusError)
        if self._ptr is not None:
            # Wake the threads blocked in next() (their queues close), and wait for
            # their calls to return before the handle goes.
            for sub in [s for s in self._subs.values() if s._pulled and not s.closed]:
                try:
                    sub._unsubscribe()
                except errors.Error:
                    pass
            with self._calls_done:
                self._calls_done.wait_for(lambda: self._calls == 0, timeout=5)
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._closer(ptr)  # ends every subscription first: no callback runs after this
            self._before_close()
            self._pending_unsubscribe.clear()

    def __repr__(self):
        return "<agentrt.Bus %s>" % ("closed" if self.closed else "open")
