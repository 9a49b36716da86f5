# SPDX-License-Identifier: BSD-2-Clause
"""ngx_hermes kernel runner: one persistent Python kernel in one directory.

The nginx module makes the kernel dir D, copies this file, its bytecode
(kernel_runner.pyc), hermes_tools.py and kernel_start.py into it and starts
`python3 -I kernel_start.py` with cwd=D, which runs this file's code as
__main__ (see docs/internals.md, "Spawn"): isolated, so neither D nor
PYTHON* variables reach sys.path.
Everything between the module and this process goes through files in D;
the FIFO D/wake only says "look at cells/ now".

    D/ready                      {"pid":N}, written once we can take cells
    D/wake                       FIFO, held open O_RDWR by us
    D/cells/cell_req_N.json      {"id","code","reset","max_output","max_stream"}
    D/cells/cell_out_N           NDJSON events, appended while the cell runs
    D/cells/cell_res_N.json      the result, written last (tmp + rename);
                                 its last line, after the event lines that
                                 came once the code was over and no
                                 cell_out_N was made (see _Sink.ending)
    D/cells/reserve.tmp          disk space kept for the next result
    D/rpc/req_N, res_N           tool calls (hermes_tools.py); swept before
                                 each cell: a call's authority is its cell's
    D/site-packages/             made at start, on sys.path: `pip install
                                 --target` from a cell (see SITE)

Files we write are 0600 and renamed into place; N is %06d (more digits past
999999).  Python 3 stdlib only, 3.8 or later (t/lib/check-py38.py): this
runs on any kernel host, and in any image's python.
"""

import _ast
import builtins
import codecs
import collections
import errno
import fcntl
import functools
import io
import itertools
import json
import operator
import os
import re
import select
import signal
import _signal
import stat
import sys
import threading
import time

D = os.path.dirname(os.path.abspath(__file__))
CELLS = os.path.join(D, "cells")
_CELL_PATH = {k: CELLS + "/cell_" + k + "_%06d" + sfx   # a cell's files
              for k, sfx in (("req", ".json"), ("out", ""), ("res", ".json"))}
RESERVE = os.path.join(CELLS, "reserve.tmp")
# The next result's file, made ahead (_make_spare) or an old result
# reused (_recycle): outside cells/, whose watches wake on a rename into
# it; a name the files API refuses, so no upload is taken for it.
SPARE = os.path.join(D, ".hermes_result.tmp")

# Make `import hermes_tools` work in cells, and share its module object.
# We run as `python3 -I`, so D is not on sys.path by itself; it goes last,
# so a file a cell leaves in D (ast.py, ...) never shadows the stdlib.
# No __pycache__ in D: it would be made outside our file-mode rules.
if D not in sys.path:
    sys.path.append(D)
_dwb, sys.dont_write_bytecode = sys.dont_write_bytecode, True
import hermes_tools  # noqa: E402
sys.dont_write_bytecode = _dwb

# Packages installed at run time: with -I there is no user site, so
# `pip install --user` would not be importable.  `pip install --target
# D/site-packages` is: the runner makes that directory and puts it on
# sys.path (after the stdlib, before the system's packages: an installed
# version wins over the image's), at start and again before each cell.
SITE = os.path.join(D, "site-packages")
# Our own reference: a cell may replace attributes of the shared module.
_write_atomic = hermes_tools._write_atomic
_read_regular = hermes_tools._read_regular

STDERR_MARK = "\n--- stderr ---\n"
TRUNC_MARK = "\n... [output truncated: {} bytes omitted] ...\n"
DEFAULT_MAX_OUTPUT = 50000
DEFAULT_MAX_STREAM = 5 * 1024 * 1024
CHUNK = 64 * 1024        # chars: flush threshold and largest text per event
PARTIAL_DELAY = 0.005    # a line without "\n" reaches the file within this
COALESCE = 0.001         # complete lines closer than this share one write
FLUSH_LATE = 0.001       # at most this late while the cell writes on: _flusher
FAST_MAX = 4096          # chars: a longer write takes the lock (_writer)
WITH_RESULT_MAX = 16 * 1024  # bytes of event lines the result file may carry

# A full disk must not cost a cell its result (the module would wait for it
# until the cell's timeout): before a cell runs we take the space for its
# result, enough for the largest one (6 bytes of JSON a byte of output at
# worst) up to RESERVE_MAX; a result that does not fit is cut to fit.
RESERVE_MAX = 1 << 20
RESERVE_KEEP = 64 * 1024     # kept between cells, for a disk already full
RESERVE_RETRY = 0.5          # seconds between tries to keep it, while idle
RESULT_SLACK = 32 * 1024     # the result's fields and error, escaped
ERROR_MAX = 2000             # chars of the error line kept in the result
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's (glibc's malloc.h)
MALLOC_MMAP = 8 << 20        # bytes: a larger block is mmap'd (see _use_libc)
MALLOC_KEEP = 32 << 20       # bytes of free heap kept between cells


def ESCAPED_MAX(limit):
    """The module's bound on a result (limit: max_output) or an output
    file (max_stream): JSON escapes a byte into six at most, 64 KiB more
    for the rest; NGX_HTTP_HERMES_ESCAPED_MAX in C, docs/protocol.md."""
    return 6 * limit + 65536
KICK_EVERY = 0.1             # a cell that outlives a full disk is re-interrupted
DISK_FULL = "the kernel host's disk is full"
_FULL = (errno.ENOSPC, errno.EDQUOT)

_REQ = re.compile(r"cell_req_(\d{6,})\.json")
_CELL_FILE = re.compile(r"cell_(?:req|out|res)_(\d{6,})(?:\.json)?(?:\.tmp)?")
_SURROGATES = re.compile("[\ud800-\udfff]")


# runner.log: what fds 1 and 2 were when we started (see _capture_fds),
# for our own lines and for what arrives on 1 and 2 between cells.
_LOG_FDS = {"stdout": 1, "stderr": 2}


def _to_log(name, data):
    try:
        while data:
            data = data[os.write(_LOG_FDS[name], data):]
    except OSError:
        pass


def _log(msg):
    # Never log the token or cell code.
    _to_log("stderr", ("hermes runner: %s\n" % msg).encode("utf-8", "replace"))


def _utf8(text):
    """(text, its UTF-8 bytes); lone surrogates become U+FFFD instead of
    making the encode (and so the cell's print) fail."""
    try:
        return text, text.encode("utf-8")
    except UnicodeEncodeError:
        text = _SURROGATES.sub("\ufffd", text)
        return text, text.encode("utf-8")


def _text_to_log(name, text):
    _, data = _utf8(text)
    _to_log(name, data)


class HostDiskFull(BaseException):
    """Interrupts a cell whose output can no longer be written.  Not an
    Exception, so `except Exception` in the cell does not keep it going."""


def _full_text(e):
    return "%s (%s)" % (DISK_FULL, os.strerror(e.errno))


# JSON escapes these as \uXXXX (or \t, \r, ...): such a text takes json's way
_JSON_CTRL = bytes(c for c in range(32) if c != 10)


def _text_line(name, text):
    """The NDJSON line of a stdout/stderr event.  text has no lone
    surrogates (see _utf8).  Where it has no control character but "\n",
    its escapes are three bytes.replace: a third faster than json's
    encoder for a print loop's 64 KiB (1.2 ms a MB of output)."""
    data = text.encode("utf-8")
    if len(data.translate(None, _JSON_CTRL)) != len(data):
        return _dumps({"type": name, "text": text}) + b"\n"
    return b"".join((b'{"type":"', name.encode(), b'","text":"', data.replace(
        b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\n", b"\\n"), b'"}\n'))


# ensure_ascii=False keeps the files compact.  One encoder: json.dumps with
# these arguments makes a new one each call (a few us, several a cell).
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _dumps(obj):
    # "replace" is a last resort for a lone surrogate that reached us some
    # other way (an error message).
    return _ENCODE(obj).encode("utf-8", "replace")


# -- output capture ---------------------------------------------------------

class _Capture:
    """One stream's bytes for the final output, in bounded memory: the first
    `cap` bytes and a rolling tail of at least min(total, cap) bytes."""

    def __init__(self, cap, data=b""):
        self.cap, self.total = cap, 0
        self.head, self.tail = bytearray(), bytearray()
        self.add(data)

    def add(self, data):
        self.total += len(data)
        if len(self.head) < self.cap:
            self.head += data[:self.cap - len(self.head)]
        self.tail += data[len(data) - self.cap:] if len(data) > self.cap else data
        if len(self.tail) > 2 * self.cap:          # amortised trim
            del self.tail[:len(self.tail) - self.cap]


def _take(segs, n, front):
    """The first (front) or last n bytes of the concatenated segments.
    A segment gives at most min(n, total) <= cap bytes: its head/tail hold them."""
    parts = []
    for s in (segs if front else reversed(segs)):
        k = min(n, s.total)
        parts.append(s.head[:k] if front else s.tail[len(s.tail) - k:])
        n -= k
        if n == 0:
            break
    return b"".join(parts if front else reversed(parts))


def _final_output(out, err, max_output):
    """stdout [+ STDERR_MARK + stderr], cut to 40% head + 60% tail of
    max_output around TRUNC_MARK.  Measured in UTF-8 bytes; a character is
    never split (a partial one at a cut is dropped and counted as omitted).
    The marker itself comes on top of max_output.  -> (text, truncated)"""
    segs = [out]
    if err.total:
        mark = STDERR_MARK.encode()
        segs += [_Capture(len(mark), mark), err]
    total = sum(s.total for s in segs)
    if total <= max_output:     # then every segment is whole in its head
        return b"".join(bytes(s.head) for s in segs).decode("utf-8", "replace"), False
    h = max_output * 2 // 5
    head = _take(segs, h, True).decode("utf-8", "ignore")
    tail = _take(segs, max_output - h, False).decode("utf-8", "ignore")
    omitted = total - len(head.encode()) - len(tail.encode())
    return head + TRUNC_MARK.format(omitted) + tail, True


# -- streaming to cell_out_N ------------------------------------------------

def _no_fds():
    return ()


class _State:
    """What changes while the runner lives, in one place: the functions
    and threads below share it, and a forked child resets it (see
    _after_fork).  Its attributes are read where used, never kept in a
    variable: a forked child gets a new lock."""

    __slots__ = ("lock", "cond", "current", "flusher_at", "fd_ready",
                 "interruptible", "deferred", "loop", "fflush", "globals",
                 "count", "site", "made", "spare", "spare_size",
                 "reserve_st")

    def __init__(self):
        # One lock for the running cell's sink, shared with the flusher
        # and the fd reader threads.  Most writes of a busy stream do not
        # take it (see _CellStream.write).
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.current = None       # the running cell's _Sink, or None between cells
        self.flusher_at = None    # when the flusher looks next; None: when notified
        # fd_ready(): whether fds 1 and 2's pipes hold bytes (_capture_fds)
        self.fd_ready = _no_fds
        self.interruptible = False  # SIGINT raises KeyboardInterrupt only in a cell
        self.deferred = False     # an interrupt came in a _CRITICAL section
        self.loop = None          # the runner's event loop, for top-level await
        self.fflush = None        # C stdio's fflush, False: none (_use_libc)
        self.globals = None       # the cells' namespace
        self.count = 0            # cells run: the result's execution_count
        self.site = None          # SITE's (inode, mtime) as last put on sys.path
        self.made = []            # (id, its files' paths) of cells not tidied
        self.spare = None         # SPARE's fd, made ahead (_make_spare)
        self.spare_size = 0       # its size: a longer old result is cut
        self.reserve_st = None    # RESERVE's lstat, taken between cells


_state = _State()
_monotonic = time.monotonic


class _ErrText(tuple):
    """stderr's text in a sink's parts (see _item), made as
    _ErrText((text,)): a tuple's constructor, in C, so a write to stderr
    runs no __init__ of ours; and not a str, so "".join fails on parts
    that hold one (see _Sink._flush)."""

    __slots__ = ()
    text = property(operator.itemgetter(0))


_text_of = _ErrText.text.fget


def _is_err(item):
    return item.__class__ is _ErrText


def _item(name, text):
    # What parts holds: stdout's text as is (so that "".join takes a
    # stdout-only buffer at once), stderr's as an _ErrText.
    return text if name == "stdout" else _ErrText((text,))


def _wake_flusher(due):
    # The flusher sleeps until flusher_at: wake it if that is too late
    # for due.  While the cell writes, the writes themselves flush when
    # due, and the flusher (whose wake-up costs the writer a hand-over of
    # the GIL) backs off up to FLUSH_LATE: see _flusher.
    at = _state.flusher_at
    if at is None or at > due + FLUSH_LATE:
        _state.cond.notify()


class _Sink:
    """Collects one cell's stdout/stderr: streams NDJSON events to cell_out_N
    and keeps the head/tail for the final output.

    Every write, Python's and what the fd pipes hold alike, is appended to
    `parts` in the order written (see _item); a flush turns what parts
    holds into events, one a run of one stream (split at CHUNK
    characters), and adds it to the head/tail of the output.

    When text goes out: complete lines at once, unless the last flush was
    less than COALESCE ago (a tight print loop), then within COALESCE, many
    lines in one event.  Text after the last "\n" (print's text before its
    "\n" arrives, or a progress bar) waits up to PARTIAL_DELAY, so a print
    is never split and a partial line still shows promptly.

    While parts holds a complete line whose flush is scheduled, at
    `deadline`, a write only appends to parts, without the lock, until
    the deadline passes: then the writer takes the lock and flushes
    itself (see _CellStream.write), so a cell that holds the GIL still
    streams on time.  Everything else changes under the lock, and a flush
    sets `deadline` to 0 *before* it takes parts: a write that appends
    after the take sees its deadline passed and takes the lock, so no
    text is ever left in parts unscheduled or unwritten."""

    n = 0                 # the cell's id, for interrupts and cell_out_N
    children_hit = False  # an interrupt reached processes the cell started

    def __init__(self, fd, max_output, max_stream):
        # fd: cell_out_N's; None: made at the first event line, so a cell
        # that prints nothing makes none (a file made and later removed
        # was a sixth of a trivial cell's path); -1: not streamed
        self.fd, self.max_stream = fd, max_stream
        self.caps = {"stdout": _Capture(max_output), "stderr": _Capture(max_output)}
        self.streamed, self.cut, self.closed = 0, False, False
        self.parts, self.chars = [], 0   # not written yet (see _item)
        self.deadline = 0.0         # see the class doc; 0: writes take the lock
        self.due = None             # when the flusher writes what waits
        self.lines = False          # parts holds a "\n" (as far as known)
        self.partial = None         # the item where the text after the last
        self.partial_since = 0.0    # "\n" began, and since when it waits
        self.last_flush = 0.0
        self.full = None            # the OSError of a full disk: cell doomed
        self.kick = None            # when the flusher next interrupts it
        self.max_output = max_output
        self.shown, self.shown_bytes = [], 0    # display bundles, for the result
        self.shown_omitted = 0                  # ... past max_output
        self.figures = set()        # ids of figures shown by this cell
        self.held = None            # lines _write gathers, not written yet
        self.with_result = None     # lines for the result file: see ending
        self.with_result_size = 0

    def add(self, item, text, appended=False):
        """A write: item (see _item) of text.  appended: _CellStream.write
        appended it to parts already, and its deadline has passed.  False
        once the cell is over and the text was not taken: the caller
        writes it elsewhere."""
        try:
            with _state.lock:
                if self.closed:
                    if appended:
                        self._leftover()
                    return appended
                now = _monotonic()
                if not appended:
                    if not text:
                        return True
                    self._raise_if_full()
                    _drain_fds()  # what went to fds 1 and 2 before comes first
                    self.parts.append(item)
                self.chars += len(text)
                self._note(item, text, now)
                self._settle(now)
                self._raise_if_full()
            return True
        finally:
            _raise_deferred()

    def _push(self, item, text, now):
        self.parts.append(item)
        self.chars += len(text)
        self._note(item, text, now)

    def _note(self, item, text, now):
        if "\n" in text:
            self.lines = True
            if text.endswith("\n"):
                self.partial = None
            else:
                self.partial, self.partial_since = item, now
        elif text and self.partial is None:
            self.partial, self.partial_since = item, now

    def _settle(self, now):
        """After writes: flush what is due, schedule the rest."""
        due = self.last_flush + COALESCE if self.lines else None
        if self.partial is not None:
            p = self.partial_since + PARTIAL_DELAY
            due = p if due is None or p < due else due
        if self.chars >= CHUNK or (due is not None and due <= now):
            self._due(now)
            return
        self.due = due
        if due is not None:
            if self.lines and self.full is None:
                self.deadline = due
            _wake_flusher(due)

    def _leftover(self):
        # Appended by a write racing with close(): the text is the log's.
        items = self.parts[:]
        del self.parts[:len(items)]
        for it in items:
            if _is_err(it):
                _text_to_log("stderr", it.text)
            else:
                _text_to_log("stdout", it)

    def display(self, bundle, text=""):
        """A display event after the text so far and text (its text/plain,
        for the output, as print would), and the bundle kept for the
        result, each within its bound.  False once the cell is over."""
        try:
            return self._display(bundle, text)
        finally:
            _raise_deferred()

    def _display(self, bundle, text):
        with _state.lock:
            if self.closed:
                return False
            self._raise_if_full()
            _drain_fds()
            if text:                  # stdout's, flushed below with the rest
                self.parts.append(text)
                self.chars += len(text)
            data = _dumps(bundle)     # once: most bundles fit whole
            room = self.max_output - self.shown_bytes
            kept, size = _fit(bundle, room, "hermes_max_output",
                              self.max_output, data)
            if kept is None:
                self.shown_omitted += 1
            else:
                self.shown.append(kept)
                self.shown_bytes += size
            self.held = []            # the text before it and it: one write
            try:
                self._flush()
                if not self.cut and self.fd != -1:
                    # counted in JSON bytes: with text's UTF-8 bytes (at most
                    # 6 bytes of JSON each) the file stays in the module's bound
                    room = self.max_stream - self.streamed
                    ev, size = _fit(bundle, room, "hermes_max_stream",
                                    self.max_stream, data)
                    if ev is None:
                        self.cut = True
                        self._line({"type": "stream_truncated",
                                    "max_stream": self.max_stream})
                    else:
                        self.streamed += size
                        self.held.append(b'{"type":"display","data":%s}\n' % (
                            data if ev is bundle else _dumps(ev)))
            finally:
                held, self.held = self.held, None
                if held:
                    self._write(b"".join(held))
            self._raise_if_full()
        return True

    def _raise_if_full(self):
        # While the cell runs, each write after a full disk fails, so the
        # cell ends (or at least learns of it).  The runner's own writes
        # (the traceback) just go into the final output.
        if self.full is not None and _state.interruptible:
            raise OSError(self.full.errno, "%s: the cell's output cannot be "
                          "written" % _full_text(self.full))

    def _due(self, now):
        # What is due goes out; a young partial tail stays for its "\n".
        self._flush(keep_tail=True, now=now)

    def flush(self):
        try:
            with _state.cond:
                if not self.closed:
                    self._flush()
                    self._raise_if_full()
        finally:
            _raise_deferred()

    def _flush(self, keep_tail=False, now=None):
        self.deadline = 0.0                   # first: see the class doc
        parts = self.parts
        items = parts[:]
        del parts[:len(items)]
        self.chars, self.lines, self.due = 0, False, None
        if now is None:
            now = _monotonic()
        if keep_tail and items:
            items = self._keep_tail(items, now)
        else:
            self.partial = None
        if not items:
            return
        self.last_flush = now
        try:
            text = "".join(items)             # stdout only: the common case
        except TypeError:
            for err, run in itertools.groupby(items, _is_err):
                if err:
                    self._emit("stderr", "".join(map(_text_of, run)))
                else:
                    self._emit("stdout", "".join(run))
        else:
            self._emit("stdout", text)

    def _keep_tail(self, items, now):
        """items without the text after their last "\n" where that is
        young (first seen less than PARTIAL_DELAY ago) and shorter than
        CHUNK: it goes back to parts, to wait for its "\n"."""
        err = _is_err(items[-1])
        i = len(items)
        while i > 0 and _is_err(items[i - 1]) == err and "\n" not in (
                items[i - 1].text if err else items[i - 1]):
            i -= 1
        head = None
        if i > 0 and _is_err(items[i - 1]) == err:  # it holds the last "\n"
            text = items[i - 1].text if err else items[i - 1]
            j = text.rfind("\n") + 1
            if j < len(text):
                i -= 1
                head, rest = text[:j], text[j:]
        run = items[i + 1:] if head is not None else items[i:]
        tail = "".join(map(_text_of, run)) if err else "".join(run)
        if head is not None:
            tail = rest + tail
        if not tail:
            self.partial = None
            return items
        if items[i] is not self.partial:            # first seen now
            self.partial_since = now
        if now >= self.partial_since + PARTIAL_DELAY or len(tail) >= CHUNK:
            self.partial = None                     # out with it
            return items
        kept = _ErrText((tail,)) if err else tail
        self.parts.insert(0, kept)      # before what was appended meanwhile
        self.chars = len(tail)
        self.partial = kept
        self.due = self.partial_since + PARTIAL_DELAY
        _wake_flusher(self.due)
        items = items[:i]
        if head is not None:
            items.append(_ErrText((head,)) if err else head)
        return items

    def _emit(self, name, text):
        """text of one stream: into the output's head/tail, and streamed
        within max_stream, CHUNK characters an event at most."""
        if not text:
            return
        text, data = _utf8(text)
        self.caps[name].add(data)
        if self.cut or self.fd == -1:
            return
        nbytes = len(data)
        room = self.max_stream - self.streamed
        if nbytes > room:
            # Stream exactly up to max_stream, cut at a character boundary.
            text = data[:max(room, 0)].decode("utf-8", "ignore")
            nbytes = len(text.encode("utf-8"))
            self.cut = True
        self.streamed += nbytes
        for i in range(0, len(text), CHUNK):
            if self.fd == -1:
                return
            self._write(_text_line(name, text[i:i + CHUNK]))
        if self.cut and self.fd != -1:
            self._line({"type": "stream_truncated", "max_stream": self.max_stream})

    def _line(self, event):
        self._write(_dumps(event) + b"\n")

    def _write(self, line):
        # One os.write per line (or per lines held, see _display); O_APPEND,
        # so the reader (and a forked child writing the same file) never
        # sees lines interleaved mid-way.
        if self.held is not None:
            self.held.append(line)
            return
        if self.fd is None and self.with_result is not None:
            self.with_result.append(line)
            self.with_result_size += len(line)
            if self.with_result_size <= WITH_RESULT_MAX:
                return
            line = b"".join(self.with_result)
            self.with_result = None
        self.open_out()
        if self.fd == -1:
            return
        data = memoryview(line)
        done = 0
        try:
            while done < len(data):
                done += os.write(self.fd, data[done:])
        except OSError as e:      # disk full, ...: stop streaming
            _log("cell_out write failed: %s" % e)
            if done:
                # Readers take every line for an event: drop the half one.
                try:
                    os.ftruncate(self.fd, os.lseek(self.fd, 0, os.SEEK_CUR) - done)
                except OSError:
                    pass
            if e.errno in _FULL and self.full is None:
                # The cell is doomed: its writes fail from now on and the
                # flusher interrupts it until it ends (see _flusher).
                self.full = e
                self.kick = time.monotonic()
                self.deadline = 0.0     # writes take the lock: _raise_if_full
                _state.cond.notify()
            os.close(self.fd)
            self.fd = -1

    def close(self):
        with _state.cond:
            _drain_fds(final=True)
            self._flush()
            self.closed = True
            if _state.current is self:
                _state.current = None
        if self.fd is not None and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def ending(self):
        """The cell's code is over (its last value may still be shown):
        if no cell_out_N is made yet, the event lines from now on go into
        the result file, before the result, and none is made at all.  A
        file made and removed a cell was a third of a cell's cost
        (bench/wrk-sessions.lua's 1 + 1: 0.21 against 0.15 ms for x = 1);
        what comes now reaches the reader with the result anyway."""
        with _state.lock:
            if self.fd is None and self.with_result is None:
                self.with_result = []

    def take_with_result(self):
        """The lines for the result file (b"" for none), once closed."""
        lines, self.with_result = self.with_result, None
        return b"".join(lines) if lines else b""

    def open_out(self):
        """cell_out_N now, if it is to be made: at the first line, and
        before a fork, so that the child appends to the parent's file
        (O_APPEND) and makes none of its own (two would race to replace
        each other's)."""
        if self.fd is None:
            self.fd = _open_out(self.n)
            lines, self.with_result = self.with_result, None
            if lines:
                self._write(b"".join(lines))


# -- fds 1 and 2: output from anywhere in the cell --------------------------

# fds 1 and 2 are pipes we read (a subprocess, os.system, a C extension,
# os.write(1, ...) write there): bytes that come while a cell runs are its
# stdout/stderr, in order with its prints (each Python-level write first
# takes what the pipes hold), bytes between cells go to runner.log.
FD_READ = 1 << 20
# One pipe we read: its read end, "stdout"|"stderr", a UTF-8 decoder.
_Pipe = collections.namedtuple("_Pipe", "fd name decoder")
_FDS = []                # the _Pipes of fds 1 and 2
_FD_WRITE = {}           # our copies of the write ends, to restore 1 and 2


# _state.fd_ready(): whether the pipes hold bytes, one epoll_wait (each
# write asks): an epoll of both pipes, for at most two events, costs
# about two thirds of a poll() of them (no pollfd array copied in, no
# pipe asked: the epoll keeps its ready list), a third of a print's cost
# in a print loop.  Its fd is closed on exec, and a forked child drops it
# with fd_ready.  The reader thread has a poll of its own.
def _capture_fds():
    ready, mine = select.epoll(2), select.poll()
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            _LOG_FDS[name] = os.dup(fd)
        except OSError:               # started without it
            _LOG_FDS[name] = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        r, w = os.pipe()
        os.set_blocking(r, False)
        try:                          # fewer, larger reads of a flood
            fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), FD_READ)
        except OSError:
            pass
        os.dup2(w, fd)                # inheritable: a subprocess's 1 and 2
        _FD_WRITE[name] = w
        # "replace", as sys.stdout.buffer: invalid UTF-8 becomes U+FFFD
        _FDS.append(_Pipe(r, name, codecs.getincrementaldecoder("utf-8")("replace")))
        ready.register(r, select.EPOLLIN)
        mine.register(r, select.POLLIN)
    _state.fd_ready = functools.partial(ready.poll, 0, 2)
    threading.Thread(target=_fd_reader, args=(mine,), name="hermes-fds",
                     daemon=True).start()


def _restore_fds():
    # A cell may have closed or redirected 1 or 2: the next one has them,
    # and no file we open takes their numbers.
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if name in _FD_WRITE:
            try:
                os.dup2(_FD_WRITE[name], fd)
            except OSError:
                pass


def _fd_reader(poll):
    # Reads the pipes whenever they have bytes, so a writer never blocks
    # for long: past max_stream the sink only counts them.
    while True:
        try:
            events = poll.poll()
        except OSError as e:
            _log("fd capture stopped: %s" % e)
            return
        if any(ev & select.POLLNVAL for _, ev in events):
            _log("fd capture stopped: a pipe was closed")
            return
        with _state.lock:
            _drain_fds(final=False, polled=True)


def _drain_fds(final=False, polled=False):
    """Under the lock: what the pipes hold now, to the running cell or to
    runner.log; final: the cell is ending, decoders give what they hold."""
    if not _FDS:
        return
    ready = None                      # None: read both, without asking
    if not polled:
        try:
            ready = [fd for fd, _ in _state.fd_ready()]
        except (OSError, RuntimeError, ValueError):
            ready = None if final else []
        if not ready and not final:
            return                    # the common case: one syscall
    s = _state.current
    if s is not None and s.closed:
        s = None
    now, pushed = _monotonic(), False
    for r, name, dec in _FDS:
        for _ in range(16 if ready is None or r in ready else 0):
            # (16 reads, then let others have the lock)
            try:
                data = os.read(r, FD_READ)
            except OSError:           # EAGAIN: empty
                break
            if s is None:
                _to_log(name, data)
            else:
                text = dec.decode(data)
                if text:
                    s._push(_item(name, text), text, now)
                    pushed = True
            if len(data) < FD_READ:
                break
        if final:
            text = dec.decode(b"", True)
            dec.reset()
            if text and s is not None:
                s._push(_item(name, text), text, now)
                pushed = True
    if pushed:
        s._settle(now)


def _flusher():
    # Writes buffered text once it is due (see _Sink), and interrupts a
    # cell doomed by a full disk every KICK_EVERY until it ends.
    #
    # Each wake-up takes the GIL from a cell that may be printing (and
    # that gives it up at every write: the check of the fd pipes is a
    # syscall), which cost such a cell 0.1 ms a wake-up.  So where the
    # writes flushed by themselves while we slept (the cell still writes,
    # and its writes flush when due), we sleep longer each time, up to
    # FLUSH_LATE past what is due; the first wake-up after a pause in the
    # output is on time.
    st = _state
    backoff = 0.0
    with st.cond:
        while True:
            s = st.current
            if s is None:
                st.flusher_at = None
                backoff = 0.0
                st.cond.wait()
                continue
            now = _monotonic()
            if s.kick is not None and s.kick <= now:
                s.kick = now + KICK_EVERY
                _kick()
            due = s.due
            if due is not None and due <= now:
                s._due(now)
                backoff = 0.0
                continue
            at = st.flusher_at
            if at is not None and at <= now and (due is None or due > at):
                # woken on time, and the writes had flushed: they go on
                backoff = min(max(2 * backoff, COALESCE), FLUSH_LATE)
            elif due is None:
                backoff = 0.0
            if due is not None:
                due = max(due, now + backoff)
            if s.kick is not None and (due is None or s.kick < due):
                due = s.kick
            st.flusher_at = due
            st.cond.wait(None if due is None else due - now)


def _kick():
    # A real signal, so a cell blocked in sleep() or a read wakes up too;
    # sent only while our handler is in place: with SIG_DFL it would kill.
    try:
        if signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    except (OSError, ValueError):
        pass


def _start_flusher():
    threading.Thread(target=_flusher, name="hermes-flusher", daemon=True).start()


_ProcStat = collections.namedtuple("_ProcStat", "state pgrp")


class _Group:
    """The processes a cell started in the kernel's process group, as
    Jupyter's SIGINT to that group reaches them: a cell blocked in
    os.system() (which ignores SIGINT in the caller) or waiting on a child
    stops when the child does."""

    WAIT = 1.0          # for the children to go, before the second kick
    POLL = 0.02

    def __init__(self):
        self.me = os.getpid()

    def members(self):
        """Pids of our process group but ours and a sandbox's init."""
        grp = os.getpgrp()
        found = []
        try:
            names = os.listdir("/proc")
        except OSError:
            return found
        for name in names:
            if not name.isdigit():
                continue
            pid = int(name)
            if pid in (self.me, 1):
                continue
            ps = self._stat(pid)
            if ps is not None and ps.state != b"Z" and ps.pgrp == grp:
                found.append(pid)
        return found

    @staticmethod
    def _stat(pid):
        """/proc/PID/stat's state and process group, or None."""
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                st = f.read()
            # the fields after the command name: state ppid pgrp ...
            state, _, pgrp = st[st.rindex(b")") + 2:].split()[:3]
            return _ProcStat(state, int(pgrp))
        except (OSError, ValueError):
            return None

    def interrupt(self):
        """SIGINT to every member; True when there was one."""
        hit = False
        for pid in self.members():
            try:
                os.kill(pid, signal.SIGINT)
                hit = True
            except OSError:
                pass
        return hit

    def wait_gone(self):
        """Until no member is left (or WAIT): the cell's wait returns."""
        end = time.monotonic() + self.WAIT
        while time.monotonic() < end and self.members():
            time.sleep(self.POLL)


def _interrupter(fd):
    # D/intr: the module writes "N\n" to interrupt cell N (its timeout, or
    # an agent's interrupt).  An id that is not the running cell's came
    # late, for a cell that is over: ignored.  The cell's children get
    # SIGINT too; once they are gone the cell is kicked again, for a
    # SIGINT its own wait ignored.
    group = _Group()
    pending = b""
    while True:
        try:
            select.select([fd], [], [])
            data = os.read(fd, 4096)
        except BlockingIOError:
            continue
        except OSError:
            return
        pending = (pending + data)[-64:]
        *ids, pending = pending.split(b"\n")
        with _state.cond:
            s = _state.current
            if s is None or not any(i.strip() == str(s.n).encode() for i in ids):
                continue
            _log("cell %d: interrupted" % s.n)
            _kick()
        if not group.interrupt():
            continue
        with _state.cond:
            s.children_hit = True
        group.wait_gone()
        with _state.cond:
            if _state.current is s:
                _kick()


def _open_fifo(name):
    """A new FIFO D/name, open O_RDWR: we are a writer too, so reads never
    see EOF and the module's O_WRONLY|O_NONBLOCK open never fails with
    ENXIO while we live."""
    path = os.path.join(D, name)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.mkfifo(path, 0o600)
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        raise RuntimeError("%s is not our FIFO" % path)
    return fd


def _start_interrupter():
    threading.Thread(target=_interrupter, args=(_open_fifo("intr"),),
                     name="hermes-interrupt", daemon=True).start()


def _before_fork():
    # What the cell printed before it forked comes before what the child
    # prints (os.fork, multiprocessing; not subprocess: it runs no hooks).
    s = _state.current
    if s is not None:
        with _state.lock:
            if not s.closed:
                s._flush()
                s.open_out()
    _quiet_fork()


# Python >= 3.12 warns at every fork of a process with threads; the
# runner's own (hermes-*) are fork-safe (_after_fork), and a cell that
# started none must not be told otherwise.  So each fork decides: the
# warning is filtered when only ours run, until the next fork or the
# cell's end (it comes after the fork's hooks, so no hook can end it).
_FORK_WARNING = r"This process .* is multi-threaded"
_FORK_QUIET = [False]        # whether it may be filtered: cells pay nothing else


def _quiet_fork():
    if sys.version_info < (3, 12):
        return
    main = threading.main_thread()
    if all(t is main or t.name.startswith("hermes-")
           for t in threading.enumerate()):
        _FORK_QUIET[0] = True
        if _fork_filter() is None:
            import warnings
            warnings.filterwarnings("ignore", message=_FORK_WARNING,
                                    category=DeprecationWarning)
    else:
        _forked()


def _fork_filter():
    w = sys.modules.get("warnings")
    for f in (w.filters if w is not None else ()):
        if (f[0] == "ignore" and f[2] is DeprecationWarning
                and getattr(f[1], "pattern", None) == _FORK_WARNING):
            return f
    return None


def _forked():
    if not _FORK_QUIET[0]:
        return
    _FORK_QUIET[0] = False
    f = _fork_filter()
    if f is not None:
        w = sys.modules["warnings"]
        w.filters.remove(f)
        getattr(w, "_filters_mutated", lambda: None)()


def _after_fork():
    # A forked child (multiprocessing, ...) may have been forked while the
    # flusher held the lock, and has no flusher thread: give it both.
    # Nor does it read fds 1 and 2: its writes there reach the parent's
    # reader like any subprocess's.
    _state.lock = threading.Lock()
    _state.cond = threading.Condition(_state.lock)
    _state.fd_ready, _state.flusher_at = _no_fds, None
    s = _state.current
    if s is not None:
        # What the parent had not written yet is the parent's to write.
        del s.parts[:]
        s.chars, s.lines, s.partial, s.due, s.deadline = 0, False, None, None, 0.0
    for pipe in _FDS:
        try:
            os.close(pipe.fd)
        except OSError:
            pass
    del _FDS[:]
    _start_flusher()


def _writer(name):
    """The write() of sys.stdout or sys.stderr (name) while a cell runs.

    Where the fd pipes are empty and a flush of the buffer is scheduled
    (see _Sink), a write appends to the buffer and checks the deadline:
    a print of str costs one of these (see _print), and the check of
    the pipes, one syscall, is most of its cost.  It cannot
    be saved: bytes that reached fds 1 and 2 since the last write (a
    subprocess, os.write, a C extension) go before this write's."""
    err = name == "stderr"
    st = _state                        # a closure's cell: no global lookup

    def write(s):
        if s.__class__ is not str:
            if not isinstance(s, str):
                raise TypeError("write() argument must be str, not %s"
                                % type(s).__name__)
            s = str.__str__(s)         # a subclass's methods are not ours
        n = len(s)
        sink = st.current
        if sink is None:
            _text_to_log(name, s)
            return n
        item = _ErrText((s,)) if err else s
        if n <= FAST_MAX:
            try:
                ready = st.fd_ready()
            except (OSError, ValueError, RuntimeError):
                ready = True           # the lock's way finds out
            # Empty pipes, and the lock free after that: bytes the reader
            # thread took from them (under the lock) are in parts already,
            # not still on their way there behind this write.
            if not ready and not st.lock.locked():
                sink.parts.append(item)
                if _monotonic() >= sink.deadline:
                    sink.add(item, s, True)
                return n
        if not sink.add(item, s):
            _text_to_log(name, s)
        return n

    return write


class _CellStream(io.TextIOBase):
    """sys.stdout / sys.stderr while a cell runs.  The two objects live as
    long as the runner, so a logging handler made in one cell still writes
    into the next cell's output; between cells (a cell's leftover threads)
    their text goes to runner.log.

    File descriptors 1 and 2 are captured as well (see _capture_fds), so
    fileno() gives them: what is written there joins the same stream."""

    def __init__(self, name):
        super().__init__()
        self._name = name
        self.buffer = _CellBytes(self)   # for code that writes bytes
        # print() looks write up on the object: a plain function there
        # saves making a bound method twice a print
        self._write = self.__dict__["write"] = _writer(name)

    encoding = property(lambda self: "utf-8")
    errors = property(lambda self: "replace")

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        if self._name not in _FD_WRITE:
            raise io.UnsupportedOperation("fileno")
        self.flush()
        return 1 if self._name == "stdout" else 2

    def write(self, s):
        return self._write(s)

    def flush(self):
        sink = _state.current
        if sink is not None:
            sink.flush()


class _CellBytes(io.RawIOBase):
    """sys.stdout.buffer: bytes decoded as UTF-8 (invalid -> U+FFFD)."""

    def __init__(self, text):
        super().__init__()
        self._text = text
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def writable(self):
        return True

    def write(self, b):
        b = bytes(b)
        self._text.write(self._dec.decode(b))
        return len(b)

    def flush(self):
        self._text.flush()


STDOUT, STDERR = _CellStream("stdout"), _CellStream("stderr")

_builtin_print = builtins.print


# str() of these runs nothing of the cell's (an int past
# sys.get_int_max_str_digits() raises ValueError: the built-in's then)
_PLAIN = frozenset((int, float, bool, type(None)))


def _print(*args, sep=" ", end="\n", file=None, flush=False):
    # builtins.print while the runner lives.  Into a cell's stream, with
    # str, int, float, bool or None arguments only (nothing of the cell's
    # runs), the line goes in one write(), not one a piece: each write
    # looks at the fd pipes (see _writer), and a print loop spent a fifth
    # of its time there; and a piece without "\n" (print(42)'s "42")
    # woke the flusher thread for a partial line, a GIL hand-over in a
    # trivial cell.  Anything else is the built-in's, as given: its
    # pieces go out in the order an argument's __str__ may print in.
    f = sys.stdout if file is None else file
    if ((f is STDOUT or f is STDERR) and sep.__class__ is str
            and end.__class__ is str and _write_plain(f, args, sep, end)):
        if flush:
            f.flush()
        return None
    return _builtin_print(*args, sep=sep, end=end, file=file, flush=flush)


def _write_plain(f, args, sep, end):
    """print's line of args written to f, or False where making it may run
    code of the cell's.  The line is a temporary, freed as the write
    returns, before args: held in a name to the end of print, a 1 MB
    line left one more megabyte for malloc to give back to the system
    and fault in again, 240 page faults a cell (bench/runner_alone.py)."""
    for a in args:
        if a.__class__ is not str:
            break
    else:                               # a print loop's case: no list made
        f.write(args[0] + end if len(args) == 1 else sep.join(args) + end)
        return True
    try:
        texts = [a if a.__class__ is str else str(a) for a in args
                 if a.__class__ is str or a.__class__ in _PLAIN]
    except ValueError:
        return False
    if len(texts) != len(args):
        return False
    f.write(sep.join(texts) + end)
    return True


_print.__name__ = _print.__qualname__ = "print"
_print.__module__ = "builtins"
_print.__doc__ = _builtin_print.__doc__


# -- rich results: display events ------------------------------------------

# _repr_*_ methods (IPython's protocol) -> MIME types; text/plain is repr().
_REPRS = (("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"),
          ("_repr_svg_", "image/svg+xml"), ("_repr_png_", "image/png"),
          ("_repr_jpeg_", "image/jpeg"), ("_repr_latex_", "text/latex"),
          ("_repr_json_", "application/json"))
_BINARY = ("image/png", "image/jpeg")
NOTE = "[{} of {} bytes not shown: over {} ({} bytes)]"
OMITTED = "[{} more display(s) not shown: over hermes_max_output ({} bytes)]"
MPL_BACKEND = "module://hermes_display"


def _mime(obj, meth, mime):
    """obj's own rendering as mime, or None.  A failing method is skipped,
    as IPython does: the cell goes on."""
    f = getattr(type(obj), meth, None)
    if f is None or isinstance(obj, type):
        return None
    try:
        v = getattr(obj, meth)()
        if isinstance(v, tuple) and len(v) == 2:     # (data, metadata)
            v = v[0]
        if v is None:
            return None
        if mime in _BINARY:
            if isinstance(v, str):                   # already base64
                return v
            import base64
            return base64.b64encode(bytes(v)).decode("ascii")
        if mime == "application/json":
            json.dumps(v)                            # must be JSON
            return v
        return v if isinstance(v, str) else None
    except Exception:
        return None


def _figure_png(fig):
    import base64
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _bundle(obj):
    """The MIME bundle of obj: text/plain always (repr, whose errors are
    the cell's), the rest where obj provides it."""
    data = {"text/plain": repr(obj)}
    for meth, mime in _REPRS:
        v = _mime(obj, meth, mime)
        if v is not None:
            data[mime] = v
    mb = _mime(obj, "_repr_mimebundle_", "application/json")
    if isinstance(mb, dict):
        for k, v in mb.items():
            if isinstance(k, str) and k not in data and (
                    isinstance(v, str) or k.endswith("json")):
                data[k] = v
    mf = sys.modules.get("matplotlib.figure")
    if mf is not None and isinstance(obj, mf.Figure) and "image/png" not in data:
        try:
            data["image/png"] = _figure_png(obj)
        except Exception as e:
            data["text/plain"] += "\n[image/png failed: %s]" % _error_line(e)
        sink = _state.current
        if sink is not None:
            sink.figures.add(id(obj))
    return data


def _fit(bundle, room, bound, size, data=None):
    """bundle in at most room bytes of JSON: its largest parts replaced by
    a note in text/plain, then text/plain cut; -> (what fits, its JSON's
    length), (None, None) if not even that fits.  data: bundle's JSON."""
    n = len(_dumps(bundle) if data is None else data)
    if n <= room:
        return bundle, n
    b = dict(bundle)
    text = b.get("text/plain", "")
    for k in sorted((k for k in b if k != "text/plain"),
                    key=lambda k: -len(_dumps(b[k]))):
        text += "\n" + NOTE.format(k, len(_dumps(b.pop(k))), bound, size)
        b["text/plain"] = text
        n = len(_dumps(b))
        if n <= room:
            return b, n
    # cut its end (an escaped byte costs up to 6: halve until it fits)
    raw = text.encode("utf-8")
    keep = len(raw) - (len(_dumps(b)) - room) - 16
    while keep > 0:
        b["text/plain"] = raw[:keep].decode("utf-8", "ignore") + "..."
        n = len(_dumps(b))
        if n <= room:
            return b, n
        keep //= 2
    return None, None


def _display(*objs):
    """display(obj, ...): each object's MIME bundle as a display event (and
    its text/plain in the output, as print would), kept for the result."""
    for obj in objs:
        _show(_bundle(obj))


def _show(data):
    """A bundle as display() shows it."""
    text = data["text/plain"] + "\n"
    sink = _state.current             # None between cells: text to the log
    if sink is None or not sink.display(data, text):
        STDOUT.write(text)


def _ending():
    sink = _state.current
    if sink is not None:
        sink.ending()


def _shown_for_result(sink, room):
    """The cell's bundles for the result in room bytes of JSON, and a note
    for those that did not fit: never silently dropped."""
    out, used, omitted = [], 0, sink.shown_omitted
    for b in sink.shown:
        kept, size = _fit(b, room - used, "hermes_max_output", sink.max_output)
        if kept is None:
            omitted += 1
            continue
        out.append(kept)
        used += size + 1
    if omitted:
        out.append({"text/plain": OMITTED.format(omitted, sink.max_output)})
    return out


# matplotlib, when a cell imports it: its backend is ours, Agg (never a
# GUI) whose show() displays the open figures; open figures left at the
# end of a cell are displayed then too (as Jupyter's inline backend).

def _mpl_show(*args, **kwargs):
    from matplotlib._pylab_helpers import Gcf
    import matplotlib.pyplot as plt
    for m in Gcf.get_all_fig_managers():
        _display(m.canvas.figure)
    plt.close("all")


def _mpl_attr(name):
    if name in ("FigureCanvas", "FigureManager"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.backend_bases import FigureManagerBase
        _mpl_backend.FigureCanvas = FigureCanvasAgg
        _mpl_backend.FigureManager = FigureManagerBase
        return getattr(_mpl_backend, name)
    raise AttributeError(name)


_mpl_backend = type(sys)("hermes_display")
_mpl_backend.__getattr__ = _mpl_attr
_mpl_backend.show = _mpl_show


class _MplHook:
    """A meta path finder: matplotlib, once loaded, gets our backend."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib":
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        real = loader.exec_module

        def exec_module(module):
            real(module)
            try:
                module.rcParams["backend"] = MPL_BACKEND
            except Exception as e:
                _log("cannot set the matplotlib backend: %r" % e)

        loader.exec_module = exec_module
        return spec


def _mpl_flush(sink):
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        if plt.get_backend() != MPL_BACKEND:
            return
        from matplotlib._pylab_helpers import Gcf
        for m in Gcf.get_all_fig_managers():
            if id(m.canvas.figure) not in sink.figures:
                _display(m.canvas.figure)
        plt.close("all")
    except Exception as e:
        STDERR.write("matplotlib figures: %s\n" % _error_line(e))


# -- running code -----------------------------------------------------------

_SIGINT = int(signal.SIGINT)


def _site_index():
    """Where SITE goes on sys.path: before the first site-packages or
    dist-packages directory (the system's, a venv's), else before D."""
    for i, p in enumerate(sys.path):
        if p != SITE and os.path.basename(p.rstrip("/")) in (
                "site-packages", "dist-packages"):
            return i
    return sys.path.index(D) if D in sys.path else len(sys.path)


def _site_packages():
    """SITE on sys.path while it is a directory of D's own (not a link out
    of it, which a cell could make), off it otherwise; the import system's
    caches dropped when it changed, so what a cell installed is found."""
    try:
        st = os.lstat(SITE)
        seen = (st.st_ino, st.st_mtime_ns) if stat.S_ISDIR(st.st_mode) else None
    except OSError:
        seen = None
    if seen is None:
        while SITE in sys.path:
            sys.path.remove(SITE)
    elif SITE not in sys.path:
        sys.path.insert(_site_index(), SITE)
    if seen != _state.site:
        import importlib
        importlib.invalidate_caches()
        _state.site = seen


def _fresh_globals():
    return {"__name__": "__main__", "__builtins__": builtins,
            "hermes_tools": hermes_tools}


def _on_sigint(signum, frame):
    # The module interrupts a cell with SIGINT.  Outside a cell a stray one
    # must not kill the runner.  (A background job started by a
    # non-interactive shell inherits SIGINT ignored, and Python then keeps
    # it ignored: so the handler is always installed explicitly.)
    if _state.interruptible:
        f = frame
        while f is not None:
            if f.f_code in _CRITICAL:
                # in the sink's bookkeeping (text taken from the buffer,
                # not written yet): raised once that is done
                _state.deferred = True
                return
            f = f.f_back
        _state.deferred = False
        s = _state.current
        if s is not None and s.full is not None:
            raise HostDiskFull("%s: the cell is stopped" % _full_text(s.full))
        raise KeyboardInterrupt


_CRITICAL = frozenset(f.__code__ for f in (
    _Sink.add, _Sink.flush, _Sink.display, _Sink._display, _Sink.close,
    _Sink._flush, _drain_fds))


def _raise_deferred():
    if _state.deferred:
        _on_sigint(_SIGINT, None)


# _ast, not ast (and traceback on a first error, not at the start): the
# 5-10 ms of a new session's start their imports took (-X importtime)
_AWAIT = getattr(_ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
_CO_COROUTINE = 0x80


async def _cell_coroutine(body, last):
    # The whole cell in the loop, as the body of an async function would be.
    r = eval(body, _state.globals)
    if body.co_flags & _CO_COROUTINE:
        await r
    if last is None:
        return None
    r = eval(last, _state.globals)
    if last.co_flags & _CO_COROUTINE:
        r = await r
    return r


def _run_code(body, last):
    """Run the compiled cell -> the last expression's value.  With a
    top-level await, the cell runs to its end on our loop (not the
    thread's current one): asyncio.run in it fails as in an async
    function, and works in a cell without await."""
    flags = body.co_flags | (last.co_flags if last is not None else 0)
    if not flags & _CO_COROUTINE:
        exec(body, _state.globals)
        return None if last is None else eval(last, _state.globals)
    import asyncio
    if _state.loop is None or _state.loop.is_closed():
        _state.loop = asyncio.new_event_loop()
    task = _state.loop.create_task(_cell_coroutine(body, last))
    try:
        return _state.loop.run_until_complete(task)
    except BaseException:
        if not task.cancel():         # an interrupt: it must not run on
            task.exception()          # retrieved: asyncio logs no warning
        raise


def _exec(body, last):
    """Run the compiled cell; the exception it ended with, or None."""
    try:
        try:
            _state.interruptible = True
            value = _run_code(body, last)
            if value is not None:            # like IPython's Out[]
                data = _bundle(value)        # its reprs: the cell's last code
                _ending()
                _show(data)
        finally:
            _state.interruptible = False
    except BaseException as e:   # noqa: B036 -- everything ends up in the result
        return e
    return None


_traceback = None


def _tb():
    """traceback, imported at its first use (kept: a cell that replaces
    sys.modules["traceback"] changes nothing here)."""
    global _traceback
    if _traceback is None:
        import traceback
        _traceback = traceback
    return _traceback


def _error_line(e):
    try:
        lines = _tb().format_exception_only(type(e), e)
    except Exception:   # not even the import (no memory left)
        return "%s: %s" % (type(e).__name__, e)
    notes = getattr(e, "__notes__", None)    # 3.11 prints notes after it
    if isinstance(notes, (list, tuple)) and 0 < len(notes) < len(lines):
        lines = lines[:len(lines) - len(notes)]
    return lines[-1].strip() if lines else type(e).__name__


def _format_tb(e):
    # Drop the runner's own frames: the traceback shows the cell's code,
    # not _exec above it nor our print() or SIGINT handler below it.
    try:
        traceback = _tb()
        te = traceback.TracebackException(type(e), e, e.__traceback__)
        todo, seen = [te], set()
        while todo:
            t = todo.pop()
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            t.stack = traceback.StackSummary.from_list(
                [f for f in t.stack if f.filename != _exec.__code__.co_filename])
            todo += [t.__cause__, t.__context__]
        return "".join(te.format())
    except Exception:
        return "%s\n" % _error_line(e)


def _run(code):
    """-> (status, error, ended)"""
    try:
        tree = compile(code, "<cell>", "exec", _ast.PyCF_ONLY_AST)
        last = None
        if tree.body and isinstance(tree.body[-1], _ast.Expr):
            last = compile(_ast.Expression(tree.body.pop().value), "<cell>",
                           "eval", _AWAIT)
        body = compile(tree, "<cell>", "exec", _AWAIT)
    except Exception as e:   # SyntaxError, ValueError (NUL bytes), ...
        _ending()
        STDERR.write("".join(_tb().format_exception_only(type(e), e)))
        return "error", _error_line(e), False

    e = _exec(body, last)
    _ending()
    if e is None:
        return "success", None, False
    if isinstance(e, SystemExit):
        if e.code is None or (isinstance(e.code, int) and e.code == 0):
            return "success", None, True
        if not isinstance(e.code, int):      # like the interpreter: show it
            STDERR.write("%s\n" % (e.code,))
        return "error", "SystemExit: %s" % (e.code,), True
    STDERR.write(_format_tb(e))
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", "KeyboardInterrupt", False
    return "error", _error_line(e), False


def _use_libc():
    """C stdio's fflush for _flush_std, and malloc's thresholds fixed.

    glibc sets them from the largest block freed so far: mmap for blocks
    over it, and the heap's free top given back to the system past twice
    that.  A cell's output passes through a few copies of itself at once
    (the string, print's line, its UTF-8, the event lines), so after each
    cell the heap's top went back to the system and the next cell took
    it again, page by page: 456 page faults and 8 ms of a 1 MB print's
    9, 5088 and 90 of a 5 MB one's 100 (bench/runner_alone.py).  Fixed,
    a kernel keeps up to MALLOC_KEEP of free heap between cells; blocks
    over MALLOC_MMAP (a cell's large arrays) are the system's at once.
    Before `ready`: importing ctypes takes about 2 ms, which a new
    session's first cell would pay (a warm pool's too)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        _state.fflush = libc.fflush
    except Exception:
        _state.fflush = False
        return
    try:
        libc.mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP)
        libc.mallopt(M_TRIM_THRESHOLD, MALLOC_KEEP)
    except AttributeError:                 # not glibc: its own ways
        pass


def _flush_std():
    # What the cell left in buffers: Python's own on fds 1 and 2, and C
    # stdio's (a C extension's printf to a pipe is fully buffered).
    for f in (sys.__stdout__, sys.__stderr__):
        try:
            f.flush()
        except Exception:
            pass
    if _state.fflush:            # found by main() before `ready`
        try:
            _state.fflush(None)
        except Exception:
            pass


def _cell_path(kind, n):
    return _CELL_PATH[kind] % n


_O_PATH = getattr(os, "O_PATH", 0)


def _remove(path):
    """unlink(path), leaving no negative dentry behind: the name is held
    open (O_PATH: no I/O, no inotify event) across the unlink, so the
    kernel drops its dentry instead of keeping it as a negative one.
    Negative dentries pile up in cells/ (three a cell) and every
    inotify_add_watch on it, the module's and the agent's once a cell,
    walks all of them: a cell cost 0.1 ms more per 1000 cells before."""
    fd = -1
    if _O_PATH:
        try:
            fd = os.open(path, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            pass
    try:
        os.unlink(path)
    finally:
        if fd >= 0:
            os.close(fd)


def _remove_older(n, names):
    """The files in cells/ (names: what it held) of every cell before n,
    which the module is done with once it ships cell n; those of ours
    that _tidy knows are left to it, after the result, off the cell's
    path (and the last result reused)."""
    known = {p for m in _state.made for p in m[1]}
    for name in names:
        m = _CELL_FILE.fullmatch(name)
        if m and int(m.group(1)) < n:
            path = os.path.join(CELLS, name)
            if path in known:
                continue
            try:
                _remove(path)
            except OSError:
                pass


def _tidy(n):
    """After cell n's result: the files of the cells before it, by name.
    The module was done with them when it shipped cell n; removed now,
    while the module reads n's result and answers, they cost the next
    cell nothing (at the start of that cell they were a fifth of the
    runner's time a trivial cell).  So cells/ holds two cells' files.
    An old result becomes the next result's file (_recycle)."""
    keep = []
    for m in _state.made:
        if m[0] >= n:
            keep.append(m)
            continue
        for path in m[1]:
            if _state.spare is None and path == _cell_path("res", m[0]):
                _state.spare = _recycle(path)
                if _state.spare is not None:
                    continue
            try:
                _remove(path)
            except OSError:
                pass
    _state.made = keep


def _recycle(path):
    """An old result's file (path) as SPARE, open: no inode freed and none
    made a cell (a create cost 23-30 us on ext4, which searches for a
    free inode).  Only our regular file with one link is reused: the cell
    may have put anything at path.  -> its fd, or None."""
    try:
        os.rename(path, SPARE)
        fd = os.open(SPARE, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (stat.S_ISREG(st.st_mode) and st.st_nlink == 1
                and st.st_uid == os.geteuid()):
            if stat.S_IMODE(st.st_mode) != 0o600:
                os.fchmod(fd, 0o600)
            _state.spare_size = st.st_size
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _tools(req):
    """The tool names the gateway enables for this cell (None: not said)."""
    tools = req.get("tools")
    if not isinstance(tools, list):
        return None
    return tuple(t for t in tools if isinstance(t, str))


def _create(path, flags=os.O_WRONLY):
    """A new file of ours at path, 0600 whatever the umask (a cell may
    have changed it).  O_EXCL, so a link put there is never followed; a
    leftover there is removed first."""
    flags |= os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        os.unlink(path)
        fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_out(n):
    path = _cell_path("out", n)
    try:
        fd = _create(path, os.O_WRONLY | os.O_APPEND)
    except OSError as e:
        _log("cannot create %s: %s" % (path, e))
        return -1
    _state.made.append((n, [path]))     # for _tidy
    return fd


def _read_req(path):
    # The kernel dir is the cell's too (same uid): a FIFO put there must
    # not hang us, nor a symlink (to /dev/zero, ...) be followed.
    data = _read_regular(path)
    if data is None:
        raise ValueError("not a regular file")
    return _check_req(json.loads(data))


def _check_req(req):
    if not isinstance(req, dict) or not isinstance(req.get("code"), str):
        raise ValueError("no code")
    return req


def _int(v, default):
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else default


def _process(n, path, names=None, req=None):
    """Cell n, from its request: req (inline), else the file at path;
    names: what cells/ held just before, if it is known."""
    t0 = time.monotonic()
    if names is not None:                 # cells/ was listed: all before n
        _remove_older(n, names)
    try:
        req, bad = _check_req(req) if path is None else _read_req(path), None
    except (OSError, ValueError) as e:
        req, bad = {}, "bad cell request: %s" % e
    _state.made.append((n, [p for p in (path, _cell_path("res", n))
                            if p is not None]))
    hermes_tools._begin(_tools(req), req.get("schemas", True) is not False)
    max_output = _int(req.get("max_output"), DEFAULT_MAX_OUTPUT)
    resv = _reserve(n, min(7 * max_output + RESULT_SLACK + WITH_RESULT_MAX,
                           RESERVE_MAX))
    sink = _Sink(None, max_output,
                 _int(req.get("max_stream"), DEFAULT_MAX_STREAM))
    sink.n = n
    _state.count += 1
    reset = req.get("reset") is True
    if reset:
        _state.globals = _fresh_globals()
    with _state.cond:
        # bytes from between cells went to runner.log: the fd reader took
        # them as they came (the last cell's sink drained the rest)
        _state.current = sink
    if bad:
        status, error, ended = "error", bad, False
    else:
        sys.stdout, sys.stderr = STDOUT, STDERR
        try:
            status, error, ended = _run(req["code"])
            if status == "success" and not ended and sink.children_hit:
                # its wait ignored the SIGINT its children died of (as
                # system() does): it was interrupted all the same
                status, error = "interrupted", "KeyboardInterrupt"
            _mpl_flush(sink)
        finally:
            _restore_fds()
            _flush_std()
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
            _forked()
    sink.close()                          # cell_out_N complete before the result
    events = sink.take_with_result()
    output, cut = _final_output(sink.caps["stdout"], sink.caps["stderr"],
                                max_output)
    if sink.full is not None:
        status, error = "error", ("%s: the cell was stopped when its output "
                                  "could not be written" % _full_text(sink.full))
    elif error is not None and len(error) > ERROR_MAX:
        error = error[:ERROR_MAX] + "..."    # the result's size stays bounded
    res = {"id": n, "status": status, "output": output, "error": error,
           "execution_count": _state.count, "stdout_truncated": cut or sink.cut,
           "stdout_bytes_total": sink.caps["stdout"].total,
           "stream_truncated": sink.cut, "state_reset": reset, "ended": ended,
           "duration_seconds": round(time.monotonic() - t0, 6), "displays": []}
    if sink.shown or sink.shown_omitted:
        # within max_output, and the result within the module's bound
        room = min(max_output, ESCAPED_MAX(max_output) - 4096
                   - len(_dumps(res)) - len(events))
        res["displays"] = _shown_for_result(sink, room)
    _write_result(n, res, resv, events)
    if ended:
        # SystemExit: the module removes D.  os._exit: a cell's non-daemon
        # threads must not keep us alive.
        os._exit(0)
    # a reserve the result took is made again by the main loop


# -- the result, on a full disk too -----------------------------------------

def _reserve_path():
    return RESERVE


def _allocate(fd, size):
    """Grow fd's file to size bytes of allocated disk, or as far as the
    disk allows."""
    st = os.fstat(fd)
    have = st.st_size
    if have >= size and st.st_blocks * 512 >= size:
        return
    try:
        # from 0: a file made sparse (truncated longer) gets its holes
        os.posix_fallocate(fd, 0, size)
        return
    except AttributeError:
        pass
    except OSError as e:
        if e.errno in _FULL:
            return
        if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
    if have >= size:
        return
    zeros = bytes(min(size - have, 64 * 1024))    # no fallocate here
    try:
        while have < size:
            have += os.pwrite(fd, zeros[:size - have], have)
    except OSError as e:
        if e.errno not in _FULL:
            raise


# The space taken for a result: the file, its (st_dev, st_ino), its size.
_Reserved = collections.namedtuple("_Reserved", "path ident size")


def _reserve(n, size):
    """Take the space for cell n's result before the cell runs: the kept
    reserve, grown towards size.  Where a cell put something else in its
    place, a new one; where even that fails (a directory there), a file
    of cell n's own.  -> a _Reserved or None.

    The reserve is used only on a full disk (see _write_result): on any
    other, the result is a new file and the reserve stays for the next
    cell, at the largest size a cell took.  Shrinking it, or truncating a
    result written into it, frees blocks: that cost 0.3 ms a cell on ext4
    (the truncate, then the unlink of the truncated file)."""
    path = _reserve_path()
    try:
        # the common case: ours, as we left it (no open: the checks are
        # the same, and _write_reserved checks the file it opens again).
        # Its lstat from between cells (_reserve_kept), if there is one.
        st, _state.reserve_st = _state.reserve_st, None
        if st is None:
            st = os.stat(path, follow_symlinks=False)
        if (stat.S_ISREG(st.st_mode) and st.st_nlink == 1
                and stat.S_IMODE(st.st_mode) == 0o600
                and st.st_size >= size and st.st_blocks * 512 >= size):
            return _Reserved(path, (st.st_dev, st.st_ino), st.st_size)
    except OSError:
        pass
    fd = -1
    try:
        st = None
        try:
            # Only our own regular file: a cell may have put anything there.
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise OSError(errno.EINVAL, "not our reserve")
        except OSError:
            st = None
            if fd >= 0:
                os.close(fd)
                fd = -1
            try:
                os.unlink(path)
            except OSError:
                pass
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            try:
                fd = os.open(path, flags, 0o600)
            except OSError:
                path = _cell_path("res", n) + ".tmp"
                try:
                    os.unlink(path)
                except OSError:
                    pass
                fd = os.open(path, flags, 0o600)
        if st is None or stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
        if st is None or st.st_size < size or st.st_blocks * 512 < size:
            _allocate(fd, size)
            st = os.fstat(fd)
        return _Reserved(path, (st.st_dev, st.st_ino), st.st_size)
    except OSError as e:
        _log("cannot reserve space for the result of cell %d: %s" % (n, e))
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def _reserve_kept():
    try:
        st = os.stat(_reserve_path(), follow_symlinks=False)
    except OSError:
        _state.reserve_st = None
        return False
    _state.reserve_st = st          # for the next cell's _reserve
    return stat.S_ISREG(st.st_mode) and st.st_blocks * 512 >= RESERVE_KEEP


def _keep_reserve():
    # For the next cell, which may start on a disk that is full already.
    path = _reserve_path()
    try:
        os.unlink(path)
    except OSError:
        pass
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return
    try:
        os.fchmod(fd, 0o600)             # a cell may have changed the umask
        _allocate(fd, RESERVE_KEEP)
    except OSError:
        pass
    finally:
        os.close(fd)


def _cut_to_fit(res, size, e):
    """res as at most size bytes of JSON: an error, its output cut."""
    if not (res["error"] or "").startswith(DISK_FULL):
        res = dict(res, status="error", error="%s: the cell's result was cut "
                   "to fit" % _full_text(e))
    res = dict(res, stdout_truncated=True)
    if res.get("displays"):
        res["displays"] = [{"text/plain": "[%d display(s) not shown: %s]" % (
            len(res["displays"]), DISK_FULL)}]
    out = res["output"].encode("utf-8")
    room = max((size - len(_dumps(dict(res, output=""))) - 256) // 6, 0)
    while True:
        if len(out) <= room:
            text = out.decode("utf-8", "replace")
        else:
            h = room * 2 // 5
            head = out[:h].decode("utf-8", "ignore")
            tail = out[len(out) - (room - h):].decode("utf-8", "ignore")
            omitted = len(out) - len(head.encode()) - len(tail.encode())
            text = head + TRUNC_MARK.format(omitted) + tail
        data = _dumps(dict(res, output=text))
        if len(data) <= size or room == 0:
            return data
        room //= 2


def _write_reserved(path, res, resv, data):
    """The result into the reserved file (its space is taken already), cut
    to fit where it is larger, then renamed into place."""
    fd = os.open(resv.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                 | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != resv.ident:
            raise OSError(errno.ESTALE, "the reserved result file was replaced")
        try:
            _pwrite_all(fd, data)
        except OSError as e:
            if e.errno not in _FULL:
                raise
            data = _cut_to_fit(res, resv.size, e)
            _pwrite_all(fd, data)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    os.rename(resv.path, path)


def _pwrite_all(fd, data):
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], done)


def _make_spare():
    """The next result's file, made after a result, while the module reads
    that result and no cell waits on us: creating it on the cell's path
    cost more than writing it (ext4 looks for a free inode)."""
    if _state.spare is None:
        try:
            _state.spare = _create(SPARE)
            _state.spare_size = 0
        except OSError:
            pass                         # the result makes its own file


def _spare_is(fd):
    """Whether SPARE still names fd's file: the cell can replace or remove
    it, or close fd and open a file of its own in its place."""
    a, b = os.fstat(fd), os.stat(SPARE, follow_symlinks=False)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _write_new(path, data):
    """data as path: a file of ours (SPARE, else path.tmp: 0600 whatever
    the umask), then renamed, so readers never see half a file; on a
    failure no .tmp is left."""
    fd, _state.spare = _state.spare, None
    tmp = SPARE
    if fd is None:
        tmp = path + ".tmp"
        fd = _create(tmp)
    try:
        try:
            _pwrite_all(fd, data)
            if tmp == SPARE and _state.spare_size > len(data):
                os.ftruncate(fd, len(data))      # a longer old result's
            mine = tmp != SPARE or _spare_is(fd)
        finally:
            os.close(fd)                 # may report a write's failure too
        if mine:
            os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)               # what it took of a full disk
        except OSError:
            pass
        raise
    if not mine:
        _write_new(path, data)           # a new file then


def _write_result(n, res, resv=None, events=b""):
    """A new file, on a disk with room; the reserve takes it where that
    fails (a full disk), or where the reserve is this cell's own.  events:
    lines that go before the result (_Sink.ending); the result is the
    file's last line.  A result with them is small: what they say is most
    of its output (what came before made cell_out_N), so it stays one
    frame over ssh."""
    path = _cell_path("res", n)
    data = events + _dumps(res)
    if resv is not None and resv.path != _reserve_path():
        try:
            _write_reserved(path, res, resv, data)
            return
        except OSError as e:
            _log("cannot write the reserved result of cell %d: %s" % (n, e))
    try:
        _write_new(path, data)
        return
    except FileNotFoundError:            # the cell removed cells/: recreate it
        os.makedirs(CELLS, 0o700, exist_ok=True)
        os.chmod(CELLS, 0o700)
        _write_new(path, data)
        return
    except OSError as e:
        if resv is None or resv.path != _reserve_path():
            raise
        err = e
    try:
        _write_reserved(path, res, resv, data)
    except OSError as e:
        _log("cannot write the reserved result of cell %d: %s" % (n, e))
        raise err from None


def _fail(n, e):
    """The runner itself failed on cell n: answer anyway, so the module
    does not wait for a result that never comes."""
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    with _state.cond:
        _state.current = None
    _log("cell %d failed in the runner: %r" % (n, e))
    if os.path.exists(_cell_path("res", n)):
        return
    try:
        _write_result(n, {"id": n, "status": "error", "output": "",
                          "error": "kernel runner failure: %s" % type(e).__name__,
                          "execution_count": _state.count,
                          "stdout_truncated": False,
                          "stdout_bytes_total": 0, "stream_truncated": False,
                          "state_reset": False, "ended": False,
                          "duration_seconds": 0.0, "displays": []})
    except BaseException as e2:
        _log("cannot write the result of cell %d: %r" % (n, e2))


# -- main loop --------------------------------------------------------------

class _Inbox:
    """The cells the module ships, by two ways into one order of ids: a
    request file in cells/ (the ssh agent's way, and a large request's),
    announced by a NUL byte in the wake FIFO; or a small request inline,
    one line of JSON in the FIFO itself, written at once (a FIFO write of
    at most PIPE_BUF bytes is atomic), which spares a file made, renamed,
    listed, read and removed a cell."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = b""         # a line not whole yet (a read cut it)
        self.inline = {}       # id -> the request (a dict)
        self.look = True       # cells/ may hold requests: list it

    def drain(self):
        """Take what the FIFO holds, without waiting."""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            if not data:
                return
            more = len(data) == 65536     # else the FIFO is empty now
            if b"\0" in data:
                self.look = True
                data = data.replace(b"\0", b"")
            lines = (self.buf + data).split(b"\n")
            self.buf = lines.pop()
            for line in lines:
                try:
                    req = json.loads(line) if line else None
                    n = req["id"] if isinstance(req, dict) else None
                except ValueError:
                    n = None
                if _int(n, 0) > 0:
                    self.inline[n] = req
                elif line:
                    _log("wake: not a request: %r" % line[:80])
            if len(self.buf) > 65536:      # no module writes that: a cell's
                self.buf = b""
            if not more:
                return

    def pending(self, last):
        """-> ([(id, request file name or None, inline request or None) of
        each request after last, in order], the names in cells/ if it was
        listed, else None)"""
        names, todo = None, {}
        if self.look:
            self.look = False
            try:
                names = os.listdir(CELLS)
            except OSError:
                names = None
            for name in names or ():
                m = _REQ.fullmatch(name)
                if m and int(m.group(1)) > last:
                    todo[int(m.group(1))] = (name, None)
        for n in [n for n in self.inline if n <= last]:
            del self.inline[n]
        for n, req in self.inline.items():
            todo[n] = (None, req)
        self.inline = {}
        return [(n,) + todo[n] for n in sorted(todo)], names

    def waiting(self, last):
        """Whether a request after last has come (the idle timeout waits
        for it): what the FIFO holds, and cells/."""
        self.drain()
        self.look = True
        if any(n > last for n in self.inline):
            return True
        try:
            return any(m and int(m.group(1)) > last for m in
                       map(_REQ.fullmatch, os.listdir(CELLS)))
        except OSError:
            return False

def _read_env_fd():
    """The spawn hands kernel.env over as an open file (HERMES_ENV_FD),
    already unlinked, so the token is in no process's environment at all:
    not ours, not the sandbox's.  Its other settings go to os.environ, the
    environment's HERMES_ENV_NAME as NAME."""
    fd = os.environ.pop("HERMES_ENV_FD", None)
    if fd is None:
        return None
    try:
        fd = int(fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.pread(fd, 65536, 0).decode("utf-8", "replace")
    except (ValueError, OSError):
        return None
    finally:
        try:
            os.close(fd)
        except (TypeError, OSError):
            pass
    token = None
    for line in data.splitlines():
        key, sep, value = line.partition("=")
        if not sep or not key.startswith("HERMES_"):
            continue
        value = value.strip("'")
        if key == "HERMES_RPC_TOKEN":
            token = value
        elif key.startswith("HERMES_ENV_") and len(key) > 11:
            # the environment's env=NAME=VALUE: for the code and its children
            os.environ[key[11:]] = value
        else:
            os.environ[key] = value
    return token


def _take_token():
    """Move HERMES_RPC_TOKEN from the environment into hermes_tools, so a
    cell's subprocesses do not inherit it.  Also blank the copy in the
    process's initial environment block (/proc/PID/environ), best effort."""
    token = os.environ.get("HERMES_RPC_TOKEN")
    if token is None:
        return None
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_void_p
        p = libc.getenv(b"HERMES_RPC_TOKEN")
        if p:
            ctypes.memset(p, ord("0"), len(os.fsencode(token)))
    except Exception:
        pass
    del os.environ["HERMES_RPC_TOKEN"]         # unsetenv() too
    return token


def _between_cells():
    """What a cell may have changed in the process, put back for the next
    one after its result, while the module answers: 14 us a cell, off its
    path.  fds 1 and 2 (no file we open takes their numbers), the umask,
    the SIGINT handler (_signal's: signal's wrapper costs 6 us), SITE on
    sys.path.  A cell's thread that outlives it can undo them again, as
    it can anything of the runner's while the next cell runs."""
    _restore_fds()
    os.umask(0o077)
    _signal.signal(_SIGINT, _on_sigint)
    _site_packages()


def _idle_exit():
    import shutil
    _log("idle timeout: removing the kernel directory")
    shutil.rmtree(D, ignore_errors=True)
    os._exit(0)


def main():
    os.umask(0o077)
    for f in (sys.__stdout__, sys.__stderr__):   # runner.log, read by people
        if f is not None:
            f.reconfigure(line_buffering=True, errors="backslashreplace")
    try:
        _capture_fds()
    except OSError as e:
        _log("cannot capture fds 1 and 2: %s" % e)
    builtins.display = _display
    builtins.print = _print
    sys.modules[_mpl_backend.__name__] = _mpl_backend
    sys.meta_path.insert(0, _MplHook())
    if os.getsid(0) != os.getpid():
        try:
            os.setsid()
        except OSError:                  # EPERM: already a group leader
            pass
    hermes_tools._token = _read_env_fd() or _take_token()
    try:
        idle = max(float(os.environ.get("HERMES_IDLE_TIMEOUT", "0") or 0), 0.0)
    except ValueError:
        idle = 0.0
    signal.signal(signal.SIGINT, _on_sigint)
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork)
    _start_flusher()
    _state.globals = _fresh_globals()
    try:
        os.mkdir(SITE, 0o700)
    except OSError:                 # there already (a link: _site_packages)
        pass
    os.environ["HERMES_SITE_PACKAGES"] = SITE   # for `pip install --target`
    _site_packages()

    fifo = _open_fifo("wake")
    _start_interrupter()
    _keep_reserve()
    _use_libc()
    _write_atomic(os.path.join(D, "ready"), ('{"pid":%d}' % os.getpid()).encode())
    _make_spare()

    inbox = _Inbox(fifo)
    last = 0
    deadline = time.monotonic() + idle
    while True:
        pending, names = inbox.pending(last)
        for n, name, req in pending:
            last = n
            try:
                _process(n, name and os.path.join(CELLS, name), names, req)
            except BaseException as e:    # never let one cell end the loop
                _fail(n, e)
            _tidy(n)
            _make_spare()
            _between_cells()
            names = None     # the next cell knows its files by name
            deadline = time.monotonic() + idle   # the idle clock restarts
        if not idle:
            timeout = None
        else:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                if inbox.waiting(last):   # a cell whose wake-up is coming
                    continue
                _idle_exit()
        if not _reserve_kept():
            # the disk was full after the last cell: try again while idle
            _keep_reserve()
            if not _reserve_kept():
                timeout = RESERVE_RETRY if timeout is None else min(timeout, RESERVE_RETRY)
        if select.select([fifo], [], [], timeout)[0]:
            inbox.drain()

def _self_time(n, code):
    """The runner's own cost of a cell, and nothing else (`make bench`'s
    second floor, with the benchmark's trivial cell): its request parsed,
    the code compiled and run, its event lines written (to /dev/null), the
    result made.  No files, no wake-up, no other process.  Prints the
    median and the 90th percentile in ms as JSON."""
    _state.globals = _fresh_globals()
    builtins.display, builtins.print = _display, _print
    req = json.dumps({"id": 1, "code": code, "max_output": DEFAULT_MAX_OUTPUT,
                      "max_stream": DEFAULT_MAX_STREAM}).encode()
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    took = []
    for i in range(n):
        t0 = time.perf_counter()
        r = _check_req(json.loads(req))
        sink = _Sink(os.dup(null), DEFAULT_MAX_OUTPUT, DEFAULT_MAX_STREAM)
        with _state.cond:
            _state.current = sink
        sys.stdout, sys.stderr = STDOUT, STDERR
        try:
            status, error, ended = _run(r["code"])
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        sink.close()
        output, cut = _final_output(sink.caps["stdout"], sink.caps["stderr"],
                                    DEFAULT_MAX_OUTPUT)
        _dumps({"id": i, "status": status, "output": output, "error": error,
                "execution_count": i, "stdout_truncated": cut,
                "stdout_bytes_total": sink.caps["stdout"].total,
                "stream_truncated": sink.cut, "state_reset": False,
                "ended": ended, "duration_seconds": 0.0,
                "displays": _shown_for_result(sink, DEFAULT_MAX_OUTPUT)})
        took.append(time.perf_counter() - t0)
    took.sort()
    print(json.dumps({"n": n, "p50_ms": round(took[n // 2] * 1e3, 4),
                      "p90_ms": round(took[n * 9 // 10] * 1e3, 4)}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--self-time"]:
        _self_time(int(sys.argv[2]) if len(sys.argv) > 2 else 3000,
                   sys.argv[3] if len(sys.argv) > 3 else "1 + 1")
        sys.exit(0)
    try:
        main()
    except BaseException:
        # fd 2 is a pipe of ours by now: the traceback goes to runner.log
        _log("runner failed:\n%s" % _tb().format_exc())
        raise
