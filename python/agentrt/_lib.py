"""Loads libagentrt_c.so and declares the C API's signatures (capi/agentrt_c.h).

Where the library is found, first match wins:
  1. $AGENTRT_C_LIBRARY (agentctl sets it for the agents it starts);
  2. next to this package: <build>/lib (build tree: <build>/python/agentrt) or
     <prefix>/lib (installed: <prefix>/lib/agentrt/python/agentrt);
  3. the dynamic linker's search path (libagentrt_c.so.1).

ctypes releases the GIL around every call, so a blocking call (a publish, a
checkpoint save, an env step) lets other Python threads run; callbacks from
the library's threads take the GIL themselves.
"""
import ctypes
import os
import threading

from . import errors

API_VERSION = 1

_lock = threading.Lock()
_lib = None

c_char_pp = ctypes.POINTER(ctypes.c_char_p)
MESSAGE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
EVENT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int64,
                            ctypes.c_int64, ctypes.c_int, ctypes.c_char_p)

# name: (restype, argtypes). Every call returning int returns an agentrt_code.
_I, _P, _S, _Z, _D = ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_double
_I64, _U64 = ctypes.c_int64, ctypes.c_uint64
_PP = ctypes.POINTER(ctypes.c_void_p)
_SIGNATURES = {
    "agentrt_api_version": (_I, []),
    "agentrt_last_error": (_S, []),
    "agentrt_code_name": (_S, [_I]),
    "agentrt_free": (None, [_P]),
    "agentrt_runtime_open": (_I, [_I, _I, _PP]),
    "agentrt_runtime_close": (None, [_P]),
    "agentrt_runtime_assignment": (_I, [_P, _PP]),
    "agentrt_runtime_report": (_I, [_P, _I64, _S]),
    "agentrt_runtime_set_step": (_I, [_P, _I64]),
    "agentrt_runtime_set_flops_per_sample": (_I, [_P, _D]),
    "agentrt_runtime_should_stop": (_I, [_P, ctypes.POINTER(_I), _PP]),
    "agentrt_runtime_request_stop": (_I, [_P, _S]),
    "agentrt_runtime_counters": (_I, [_P, _PP]),
    "agentrt_runtime_checkpointer": (_I, [_P, _PP]),
    "agentrt_runtime_bus": (_I, [_P, _PP]),
    "agentrt_checkpointer_create": (_I, [_S, _S, _I, _I, _D, _I, _PP]),
    "agentrt_checkpointer_close": (None, [_P]),
    "agentrt_checkpointer_save_due": (_I, [_P, ctypes.POINTER(_I)]),
    "agentrt_checkpointer_request_save": (_I, [_P]),
    "agentrt_checkpointer_save": (_I, [_P, _I64, _P, _I]),
    "agentrt_checkpointer_wait": (_I, [_P]),
    "agentrt_checkpointer_info": (_I, [_P, _PP]),
    "agentrt_checkpointer_set_snapshot": (_I, [_P, _S]),
    "agentrt_checkpointer_restore": (_I, [_P, _PP]),
    "agentrt_checkpointer_restore_lazy": (_I, [_P, ctypes.c_int64, _S, _S, _PP]),
    "agentrt_state_create": (_I, [_PP]),
    "agentrt_state_free": (None, [_P]),
    "agentrt_state_add": (_I, [_P, _S, _P, _Z, _S, ctypes.POINTER(_I64), _I]),
    "agentrt_state_add_slice": (_I, [_P, _S, _P, _S, ctypes.POINTER(_I64), _I, ctypes.c_uint64,
                                     ctypes.c_uint64]),
    "agentrt_state_set_metadata": (_I, [_P, _S]),
    "agentrt_restore_info": (_I, [_P, _PP]),
    "agentrt_restore_entry": (_I, [_P, _S, _PP, ctypes.POINTER(_Z)]),
    "agentrt_restore_read": (_I, [_P, _S, ctypes.c_uint64, ctypes.c_uint64, _P, _Z]),
    "agentrt_restore_free": (None, [_P]),
    "agentrt_bus_from_environment": (_I, [_PP]),
    "agentrt_bus_connect": (_I, [_S, _S, _S, _PP]),
    "agentrt_bus_close": (None, [_P]),
    "agentrt_bus_wait_ready": (_I, [_P, _I]),
    "agentrt_bus_publish": (_I, [_P, _S, _P, _Z, _S, ctypes.POINTER(_I64)]),
    "agentrt_weights_publish": (_I, [_P, _S, _S, _P, _P, _Z, _I64, _I64, ctypes.POINTER(_I64)]),
    "agentrt_weights_publish_async": (_I, [_P, _S, _S, _P, _P, _Z, _I64, _I64]),
    "agentrt_weights_publish_device": (_I, [_P, _S, _S, _P, _P, _Z, _I64, _I64, _I, _P,
                                            ctypes.POINTER(_I64)]),
    "agentrt_weights_read_device": (_I, [_P, _S, _I64, _S, _P, _P, _Z, _I, _P, _I,
                                         ctypes.POINTER(_I64)]),
    "agentrt_weights_flush": (_I, [_P, _S, _I64, _I, ctypes.POINTER(_I64)]),
    "agentrt_weights_close": (_I, [_P, _S, _I64, _I, ctypes.POINTER(_I64)]),
    "agentrt_weights_open": (_I, [_P, _S, _I64, _I]),
    "agentrt_weights_stats": (_I, [_P, _S, _PP]),
    "agentrt_weights_get": (_I, [_P, _S, _I, _I64, _I, _PP]),
    "agentrt_weights_info": (_I, [_P, _PP]),
    "agentrt_weights_data": (_I, [_P, _PP, ctypes.POINTER(_Z)]),
    "agentrt_weights_free": (None, [_P]),
    "agentrt_bus_publish_async": (_I, [_P, _S, _P, _Z, _S]),
    "agentrt_bus_flush": (_I, [_P, _I]),
    "agentrt_bus_send": (_I, [_P, _S, _P, _Z, ctypes.POINTER(_I64)]),
    "agentrt_bus_request": (_I, [_P, _S, _P, _Z, _I, _PP]),
    "agentrt_bus_reply": (_I, [_P, _U64, _P, _Z]),
    "agentrt_bus_subscribe": (_I, [_P, _S, _I, _I64, _U64, _I, MESSAGE_FN, EVENT_FN, _P,
                                   ctypes.POINTER(_U64)]),
    "agentrt_bus_subscribe_queue": (_I, [_P, _S, _I, _I64, _U64, _I, _Z, ctypes.POINTER(_U64)]),
    "agentrt_bus_next": (_I, [_P, _U64, _I, _PP]),
    "agentrt_bus_events": (_I, [_P, _U64, _PP]),
    "agentrt_bus_unsubscribe": (_I, [_P, _U64]),
    "agentrt_bus_positions": (_I, [_P, _PP]),
    "agentrt_bus_stats": (_I, [_P, _PP]),
    "agentrt_message_topic": (_S, [_P]),
    "agentrt_message_offset": (_I64, [_P]),
    "agentrt_message_payload": (_P, [_P, ctypes.POINTER(_Z)]),
    "agentrt_message_content_type": (_S, [_P]),
    "agentrt_message_publisher": (_S, [_P]),
    "agentrt_message_request_id": (_U64, [_P]),
    "agentrt_message_publish_time_ns": (_I64, [_P]),
    "agentrt_message_free": (None, [_P]),
    "agentrt_envpool_create": (_I, [_S, _S, _I, _I, _U64, _PP]),
    "agentrt_envpool_close": (None, [_P]),
    "agentrt_envpool_spec": (_I, [_P, _PP]),
    "agentrt_envpool_reset": (_I, [_P, _I, _U64]),
    "agentrt_envpool_step": (_I, [_P]),
    "agentrt_envpool_buffer": (_I, [_P, _I, _PP, ctypes.POINTER(_Z)]),
}


def _candidates():
    explicit = os.environ.get("AGENTRT_C_LIBRARY")
    if explicit:
        yield explicit
    here = os.path.dirname(os.path.abspath(__file__))
    for up in (os.path.join(here, "..", "..", "lib"), os.path.join(here, "..", "..", "..")):
        for name in ("libagentrt_c.so", "libagentrt_c.so.1"):
            path = os.path.normpath(os.path.join(up, name))
            if os.path.exists(path):
                yield path
    yield "libagentrt_c.so.1"


def lib():
    """The loaded library (loaded and checked on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            try:
                handle = ctypes.CDLL(path)
                break
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
        else:
            raise errors.LibraryError(
                "cannot load libagentrt_c.so; tried: %s. Set AGENTRT_C_LIBRARY to its path, or run "
                "the agent with `agentctl run`, which sets it" % "; ".join(tried))
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(handle, name)
            fn.restype = restype
            fn.argtypes = argtypes
        version = handle.agentrt_api_version()
        if version != API_VERSION:
            raise errors.LibraryError("%s has C API version %d; this package needs %d"
                                      % (path, version, API_VERSION))
        handle.path = path
        _lib = handle
        return _lib


def check(code, error_class=None):
    """Raises the agentrt.Error for a non-zero agentrt_code (the message from the C side)."""
    if code != 0:
        message = lib().agentrt_last_error().decode("utf-8", "replace")
        raise errors.error_for(code, message, error_class)


def take_string(ptr):
    """The C string at `ptr` (a char* the library handed out), freed."""
    if not ptr:
        return ""
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        lib().agentrt_free(ptr)


def take_json(ptr):
    import json
    return json.loads(take_string(ptr))


def timeout_ms(timeout):
    """A timeout in seconds as the C API's int milliseconds (0 to 2**31 - 1)."""
    return max(0, min(int(timeout * 1000), 2**31 - 1))


def encode(s, what):
    """A str argument as the C side wants it (UTF-8, no NUL)."""
    if s is None:
        return None
    if isinstance(s, bytes):
        s = s.decode("utf-8")
    if not isinstance(s, str):
        raise TypeError("%s must be a str, not %s" % (what, type(s).__name__))
    if "\0" in s:
        raise ValueError("%s contains a NUL character" % what)
    return s.encode("utf-8")
