"""Tool calls from cell code, over the kernel's file RPC channel.

    import hermes_tools
    hermes_tools.call("web_search", {"query": "nginx"})
    hermes_tools.web_search(query="nginx")          # the same call

A call writes D/rpc/req_NNNNNN (tmp + rename, 0600)
    {"tool": ..., "args": {...}, "seq": N, "token": ...}
and waits for the module's D/rpc/res_NNNNNN
    {"seq": N, "ok": bool, "result": ..., "error": str|null}
which it reads and deletes.  D is the directory holding this file.  The
token is set by kernel_runner.py (it is not in the environment).

seq counts per process from 1.  A forked child continues its parent's
count, so make tool calls from one process of a fork family at a time.
"""

import errno
import json
import os
import stat
import threading
import time

__all__ = ["call", "ToolError"]

_DIR = os.path.dirname(os.path.abspath(__file__))
_RPC = os.path.join(_DIR, "rpc")
# globals().get: importlib.reload() keeps the token and the count.
_token = globals().get("_token")
_seq = globals().get("_seq", 0)
_lock = threading.Lock()

POLL_FIRST, POLL_MAX = 0.0005, 0.02


class ToolError(Exception):
    """The tool failed, was refused, or did not answer in time."""


def _write_atomic(path, data):
    """path.tmp (0600 whatever the umask), then rename: readers never see
    half a file.  Shared with kernel_runner.py."""
    tmp = path + ".tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    os.rename(tmp, path)


def _read_regular(path):
    """The bytes of a regular file; None for anything else (a FIFO must
    not hang us, a symlink is not followed).  Shared with kernel_runner.py."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        parts = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return b"".join(parts)
            parts.append(b)
    finally:
        os.close(fd)


def call(tool, args=None, timeout=300):
    """Run `tool` with `args` (a JSON object) and return its result.
    Raises ToolError with the tool's error, or on timeout (seconds)."""
    global _seq
    if not isinstance(tool, str) or not tool:
        raise ValueError("tool must be a non-empty string")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise TypeError("args must be a dict")
    if _token is None:
        raise ToolError("no RPC token: not running in a hermes kernel")
    body = {"tool": tool, "args": args, "seq": 0, "token": _token}
    with _lock:
        _seq += 1
        seq = body["seq"] = _seq
    req = os.path.join(_RPC, "req_%06d" % seq)
    res = os.path.join(_RPC, "res_%06d" % seq)
    _write_atomic(req, json.dumps(body).encode())   # ASCII: no encoding trouble

    deadline = time.monotonic() + timeout
    delay = POLL_FIRST
    while True:
        try:
            data = _read_regular(res)
            break
        except FileNotFoundError:
            left = deadline - time.monotonic()
            if left <= 0:
                try:
                    os.unlink(req)     # not picked up yet: withdraw it
                except OSError:
                    pass
                raise ToolError("tool call timed out") from None
            time.sleep(min(delay, left))
            delay = min(delay * 2, POLL_MAX)
    try:
        os.unlink(res)
    except OSError:
        pass

    try:
        if data is None:
            raise ValueError("not a regular file")
        msg = json.loads(data)
    except ValueError:
        raise ToolError("malformed tool response") from None
    # Strict: seq is this call's integer (True == 1 in Python, 1.0 == 1),
    # ok a JSON boolean, error a string or null.
    if (not isinstance(msg, dict) or type(msg.get("seq")) is not int
            or msg["seq"] != seq or type(msg.get("ok")) is not bool
            or not isinstance(msg.get("error"), (str, type(None)))):
        raise ToolError("malformed tool response")
    if msg["ok"]:
        return msg.get("result")
    raise ToolError(msg.get("error") or "tool call failed")


def __getattr__(name):
    """hermes_tools.NAME(**args) calls tool NAME; NAME(args_dict) also works.
    Use call() to pass a timeout."""
    if name.startswith("_"):   # __path__, __wrapped__, ...: not tools
        raise AttributeError("module 'hermes_tools' has no attribute %r" % name)

    def tool(args=None, /, **kwargs):
        if args is not None and kwargs:
            raise TypeError("pass a dict or keyword arguments, not both")
        return call(name, args if args is not None else kwargs)

    tool.__name__ = tool.__qualname__ = name
    return tool
