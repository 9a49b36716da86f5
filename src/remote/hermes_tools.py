# SPDX-License-Identifier: BSD-2-Clause
"""Tool calls from cell code, over the kernel's file RPC channel.

    import hermes_tools
    hermes_tools.call("web_search", {"query": "nginx"})
    hermes_tools.web_search(query="nginx")          # the same call
    hermes_tools.get_sum(a=1, b=2)                  # the tool "get-sum"

A tool whose name is not a Python identifier is there under one: "-" and
"." become "_", a name starting with a digit gets "tool_" before it, a
keyword "_" after it ("class_"), as docs/protocol.md says; two names that
meet in one identifier are reachable through call() only.

Only the tools the gateway enables (hermes_tools) are there: the runner
sets them before each cell; any other name raises at once, naming the
enabled ones.

A call writes D/rpc/req_NNNNNN (tmp + rename, 0600)
    {"tool": ..., "args": {...}, "seq": N, "token": ...}
and waits for the module's D/rpc/res_NNNNNN
    {"seq": N, "ok": bool, "result": ..., "error": str|null}
which it reads and deletes.  D is the directory holding this file.  The
token is set by kernel_runner.py (it is not in the environment).  The wait
sleeps on an inotify watch of D/rpc (no polling), each thread's kept from
call to call; only where inotify is not available does it fall back to
polling.

An answer too large for the gateway's hermes_max_output comes as
    {"seq": N, "ok": true, "result": null, "error": null,
     "archived": {"path": "tool_results/...", "bytes": B, "head": str,
                  "tail": str}}
and the call returns a LargeResult: the file's absolute path, its size and
a head/tail preview; .load() reads the whole answer.

seq counts per process from 1.  A forked child continues its parent's
count, so make tool calls from one process of a fork family at a time.
"""

import errno
import json
import keyword
import os
import select
import stat
import threading
import time

_BASE_ALL = ["call", "ToolError", "ToolNotEnabled", "LargeResult"]
__all__ = list(_BASE_ALL)

_DIR = os.path.dirname(os.path.abspath(__file__))
_RPC = os.path.join(_DIR, "rpc")
# globals().get: importlib.reload() keeps the token and the count.
_token = globals().get("_token")
_seq = globals().get("_seq", 0)
# The enabled tool names (a tuple), set by the runner for each cell; None
# outside a hermes kernel (no check here: the gateway checks anyway).
_allowed = globals().get("_allowed")
_lock = threading.Lock()

POLL_FIRST, POLL_MAX = 0.0005, 0.02     # only without inotify

_IN_CLOSE_WRITE, _IN_MOVED_TO = 0x8, 0x80
_libc = None


class ToolError(Exception):
    """The tool failed, was refused, or did not answer in time."""


class ToolNotEnabled(ToolError, AttributeError):
    """The name is not one of the tools the gateway enables."""


class LargeResult(dict):
    """A tool answer over the gateway's hermes_max_output, archived in the
    kernel dir: path, bytes, head, tail.  load() gives the answer."""

    path = property(lambda self: self["path"])

    def load(self):
        data = _read_regular(self["path"])
        if data is None:
            raise ToolError("the archived tool answer is not a regular file")
        return json.loads(data)


def _not_enabled(name):
    names = ", ".join(_allowed) if _allowed else "none"
    return ToolNotEnabled("tool %r is not enabled here; enabled tools: %s"
                          % (name, names))


class _Watch:
    """A thread's inotify fd, kept from call to call: closing one that
    holds a watch waits for the kernel to free the mark (34 us a call
    here, at times milliseconds).  Its thread's alone (a read takes every
    event: another thread's wait would miss its answer), and its
    process's: a forked child makes its own (_forget_watches)."""

    def __init__(self, fd):
        self.fd, self.pid = fd, os.getpid()

    def __del__(self):                # the thread ended
        try:
            if self.pid == os.getpid():
                os.close(self.fd)
        except Exception:             # closed already; interpreter exit
            pass


_watches = threading.local()


def _forget_watches():
    # The parent's inotify fds stay the parent's: the forking thread's
    # copy is closed (the parent still holds the watch: no wait), other
    # threads' copies close on exec.
    global _watches
    w = getattr(_watches, "w", None)
    _watches = threading.local()
    if w is not None:
        w.pid = -1
        try:
            os.close(w.fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_forget_watches)


def _watch():
    """An inotify fd watching D/rpc for files renamed or written into it,
    its queue emptied, or -1 (no ctypes, no inotify: the caller polls
    instead).  The watch is added each call, to the rpc/ at the path now
    (a cell may have made a new one); the same directory's is the same
    watch.  An fd that is not an inotify fd any more (a cell closed it)
    is replaced."""
    global _libc
    try:
        import ctypes
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        w = getattr(_watches, "w", None)
        if w is not None:
            if _libc.inotify_add_watch(w.fd, os.fsencode(_RPC),
                                       _IN_CLOSE_WRITE | _IN_MOVED_TO) >= 0:
                _drain(w.fd)
                return w.fd
            w.pid = -1                # not ours to close any more
            _watches.w = None
        fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return -1
        if _libc.inotify_add_watch(fd, os.fsencode(_RPC),
                                   _IN_CLOSE_WRITE | _IN_MOVED_TO) < 0:
            os.close(fd)
            return -1
        _watches.w = _Watch(fd)
        return fd
    except Exception:
        return -1


def _drain(fd):
    try:
        while os.read(fd, 65536):
            pass
    except BlockingIOError:
        pass


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


def _read_regular(path, take=False):
    """The bytes of a regular file; None for anything else (a FIFO must
    not hang us, a symlink is not followed).  With take, the name is
    removed once opened: removed while open, it leaves no negative dentry
    behind (every later inotify watch of the directory would walk it).
    Shared with kernel_runner.py."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            if take:
                _unlink_quiet(path)
            return None
        raise
    try:
        if take:
            _unlink_quiet(path)
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


def _unlink_quiet(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def call(tool, args=None, timeout=300):
    """Run `tool` with `args` (a JSON object) and return its result.
    Raises ToolError with the tool's error, or on timeout (seconds)."""
    if not isinstance(tool, str) or not tool:
        raise ValueError("tool must be a non-empty string")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise TypeError("args must be a dict")
    if _allowed is not None and tool not in _allowed:
        raise _not_enabled(tool)
    return _rpc(tool, args, timeout)


def _rpc(tool, args, timeout):
    """One request over the channel, its answer (the checks are done)."""
    global _seq
    if _token is None:
        raise ToolError("no RPC token: not running in a hermes kernel")
    body = {"tool": tool, "args": args, "seq": 0, "token": _token}
    with _lock:
        _seq += 1
        seq = body["seq"] = _seq
    data = json.dumps(body).encode()        # ASCII: no encoding trouble
    req = os.path.join(_RPC, "req_%06d" % seq)
    res = os.path.join(_RPC, "res_%06d" % seq)

    # The watch before the request: the answer cannot slip in between.
    fd = _watch()
    _write_atomic(req, data)
    data = _wait(req, res, fd, time.monotonic() + timeout)
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
        a = msg.get("archived")
        if isinstance(a, dict) and isinstance(a.get("path"), str):
            return LargeResult(a, path=os.path.join(_DIR, a["path"]))
        return msg.get("result")
    raise ToolError(msg.get("error") or "tool call failed")


def _wait(req, res, fd, deadline):
    """The answer's bytes (None: not a regular file), woken by inotify."""
    delay = POLL_FIRST
    while True:
        try:
            return _read_regular(res, take=True)
        except FileNotFoundError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            try:
                os.unlink(req)     # not picked up yet: withdraw it
            except OSError:
                pass
            raise ToolError("tool call timed out")
        if fd < 0:
            time.sleep(min(delay, left))
            delay = min(delay * 2, POLL_MAX)
            continue
        if select.select([fd], [], [], left)[0]:
            _drain(fd)


def _identifier(name):
    """A tool's name as a Python identifier: get-sum -> get_sum, 3d ->
    tool_3d, class -> class_ (the gateway's hermes_schema names it so)."""
    ident = name.replace("-", "_").replace(".", "_")
    if ident[:1].isdigit():
        ident = "tool_" + ident
    if keyword.iskeyword(ident):
        ident += "_"
    return ident


def _identifiers():
    """{identifier: tool} of the enabled tools (with hermes_tools auto: of
    the MCP server's, as listed); one two tools share is neither's (call()
    reaches them)."""
    found, shared = {}, set()
    names = _allowed if _allowed is not None else (
        _tool_schemas() if _token is not None else ())
    for name in names:
        ident = _identifier(name)
        if ident in found and found[ident] != name:
            shared.add(ident)
        found[ident] = name
    for ident in shared:
        del found[ident]
    return found


# -- stubs: a Python function a tool, its signature from its schema ------

# The tools' schemas for this cell, {name: {"description", "parameters"}},
# asked of the gateway once, at the first stub (None: not yet); and the
# stubs made from them.  _begin() forgets both before each cell.
_schemas = None
_stubs = {}

_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool,
          "array": list, "object": dict}


def _begin(allowed, schemas=True):
    """A new cell: its enabled tools (None: the MCP server's); the schemas
    are asked again (a reload may have changed them), when the gateway
    has any (schemas: a hermes_tools_schema file, or an MCP server)."""
    global _allowed, _schemas
    _allowed = allowed
    _schemas = None if schemas else {}
    _stubs.clear()
    __all__[:] = _BASE_ALL


def _tool_schemas():
    """{tool: schema} of the tools the gateway knows a schema of: the
    hermes_tools_schema file's, or the MCP server's tools/list.  Asked
    over the RPC channel ("tools/list", which is no tool's name); an
    error leaves the stubs without signatures for this cell."""
    global _schemas
    if _schemas is not None:
        return _schemas
    found = {}
    if _token is not None:
        try:
            got = _rpc("tools/list", {}, 60)
            if isinstance(got, LargeResult):
                got = got.load()
        except (ToolError, ValueError, OSError):
            got = None
        for t in got if isinstance(got, list) else ():
            if (isinstance(t, dict) and isinstance(t.get("name"), str)
                    and (_allowed is None or t["name"] in _allowed)):
                found[t["name"]] = t
    _schemas = found
    return found


def _param_name(name, taken):
    """A parameter's name as an identifier: each byte (UTF-8) not of
    A-Z a-z 0-9 _ becomes "_", a leading digit gets "p_", a keyword "_"
    (the gateway's hermes_schema names them so); None when it is taken."""
    ident = "".join(chr(b) if chr(b).isalnum() and b < 128 or b == 95
                    else "_" for b in name.encode()) or "_"
    if ident[:1].isdigit():
        ident = "p_" + ident
    if keyword.iskeyword(ident):
        ident += "_"
    return None if ident in taken else ident


def _signature(schema):
    """(inspect.Signature, {parameter: its name in the schema}): the
    required parameters positional-or-keyword in the schema's order, the
    others keyword-only with the schema's default (None without one).
    inspect is imported here, at a cell's first stub, not at a new
    kernel's start, where it is 4 of this module's 10 ms."""
    import inspect
    empty = inspect.Parameter.empty
    params = schema.get("parameters")
    if not isinstance(params, dict):
        params = {}
    props = params.get("properties")
    props = props if isinstance(props, dict) else {}
    required = params.get("required")
    required = [r for r in required if isinstance(r, str)] \
        if isinstance(required, list) else []
    order = list(props) + [r for r in required if r not in props]
    taken = set()
    names = {}
    positional, keyword_only = [], []
    for name in order:
        if name.isascii() and name.isidentifier() \
                and not keyword.iskeyword(name) and name not in taken:
            ident = name
        else:
            ident = _param_name(name, taken | set(order))
        if ident is None:
            continue                # reached by its own name, as **{name: v}
        taken.add(ident)
        names[ident] = name
        prop = props.get(name)
        prop = prop if isinstance(prop, dict) else {}
        ann = _TYPES.get(prop.get("type"), empty) \
            if isinstance(prop.get("type"), str) else empty
        if name in required:
            positional.append(inspect.Parameter(
                ident, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=ann))
        else:
            keyword_only.append(inspect.Parameter(
                ident, inspect.Parameter.KEYWORD_ONLY,
                default=prop.get("default"), annotation=ann))
    return inspect.Signature(positional + keyword_only), names


def _docstring(tool, schema, names):
    desc = schema.get("description")
    lines = [desc.strip() if isinstance(desc, str) and desc.strip()
             else "The gateway's tool %r." % tool]
    params = schema.get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    if isinstance(props, dict) and props:
        lines.append("")
        lines.append("Arguments:")
        shown = {v: k for k, v in names.items()}
        for name, prop in props.items():
            prop = prop if isinstance(prop, dict) else {}
            notes = [prop["type"]] if isinstance(prop.get("type"), str) else []
            if shown.get(name, name) != name:
                notes.append("sent as %r" % name)
            text = "    %s" % shown.get(name, "**{%r: ...}" % name)
            if notes:
                text += " (%s)" % ", ".join(notes)
            if isinstance(prop.get("description"), str):
                text += ": " + " ".join(prop["description"].split())
            lines.append(text)
    lines.append("")
    lines.append("Calls the gateway's tool %r; raises hermes_tools.ToolError "
                 "when it fails." % tool)
    return "\n".join(lines)


def _stub(ident, tool):
    """The function hermes_tools.IDENT is: with the tool's schema, one of
    its signature (wrong arguments raise TypeError before any call);
    without one, NAME(**args) or NAME(args_dict)."""
    schema = _tool_schemas().get(tool)
    params = schema.get("parameters") if schema else None
    if not isinstance(params, dict) or \
            not isinstance(params.get("properties"), dict):
        # no schema, or one that names no parameters: any arguments
        def stub(args=None, /, **kwargs):
            if args is not None and kwargs:
                raise TypeError("pass a dict or keyword arguments, not both")
            return call(tool, args if args is not None else kwargs)

        desc = schema.get("description") if schema else None
        stub.__doc__ = ((desc.strip() + "\n\n" if isinstance(desc, str)
                         and desc.strip() else "")
                        + "Calls the gateway's tool %r with these arguments "
                        "(a dict, or keyword arguments)." % tool)
    else:
        sig, names = _signature(schema)
        by_name = {v: k for k, v in names.items()}
        first = next(iter(sig.parameters.values()), None)

        def stub(*args, **kwargs):
            # the older form: one dict of the arguments as they are named
            if (len(args) == 1 and not kwargs and isinstance(args[0], dict)
                    and (first is None or first.annotation is not dict)):
                return call(tool, args[0])
            # a name that is no identifier, as the schema has it
            extra = {k: kwargs.pop(k) for k in list(kwargs)
                     if k not in names and k in by_name}
            for k, v in extra.items():
                if by_name[k] in kwargs:
                    raise TypeError("%s() got multiple values for argument %r"
                                    % (ident, by_name[k]))
                kwargs[by_name[k]] = v
            unnamed = {k: kwargs.pop(k) for k in list(kwargs)
                       if k not in names and k in _unreachable}
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError("%s(): %s" % (ident, e)) from None
            # only what the code passed: the tool applies its own defaults
            sent = {names[k]: v for k, v in bound.arguments.items()}
            sent.update(unnamed)
            return call(tool, sent)

        _unreachable = {n for n in params["properties"] if n not in by_name}
        stub.__signature__ = sig
        stub.__doc__ = _docstring(tool, schema, names)
    stub.__name__ = stub.__qualname__ = ident
    stub.__module__ = __name__
    return stub


def __getattr__(name):
    """hermes_tools.NAME(...) calls tool NAME, with the signature of its
    schema when the gateway has one, else NAME(**args) or NAME(args_dict).
    Use call() to pass a timeout."""
    if name.startswith("_"):   # __path__, __wrapped__, ...: not tools
        raise AttributeError("module 'hermes_tools' has no attribute %r" % name)
    stub = _stubs.get(name)
    if stub is not None:
        return stub
    tool = name
    if _allowed is not None and name not in _allowed:
        tool = _identifiers().get(name)
        if tool is None:
            raise _not_enabled(name)
    elif _allowed is None and _token is not None:
        # auto: the listed tool this identifier names, else the name as it is
        tool = _identifiers().get(name, name)
    stub = _stubs[name] = _stub(name, tool)
    return stub


def __dir__():
    idents = sorted(_identifiers())
    # help(hermes_tools) lists what __all__ names: the tools too
    __all__[:] = _BASE_ALL + [i for i in idents if i not in _BASE_ALL]
    return sorted(set(_BASE_ALL) | set(idents))
