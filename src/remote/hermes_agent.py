# SPDX-License-Identifier: BSD-2-Clause
"""The kernel-host agent: one per connection, many cells and commands.

The module runs it once per (worker, kernel host) connection, from its own
copy, never from a kernel directory (a cell, with the kernel's uid, may
rewrite anything there):

    exec python3 -I -c 'LOADER'

with on stdin the length of this text, a newline, this text, then frames.
LOADER reads the text (through sys.stdin.buffer, which may already hold
the first frames: they are taken from its buffer) and runs it.  The first
bytes on stdout are the magic line "\\0HERMES-AGENT-1\\n" (the login
shell's rc may print junk before it), then a HELLO frame, then frames
both ways until stdin ends or stdout breaks; then the agent exits at once
(its EXEC children's process groups killed; kernels run on: the files are
the truth, and a new agent resumes every cell from the offset reached).

A frame is u32 BE length (at most 1 MiB + 64), u32 BE stream, one type
letter, the payload (docs/internals.md, "The kernel-host agent"):

    P PING -> p PONG                    X EXEC {"cmd","args","timeout","out_max"}
    W READY {"dir","pid","timeout"}  (answered by x, as an EXEC)
    K KERNEL {"args"} + stdin bytes  (answered by x, as an EXEC)
    C CELL {"dir","cell","pid","start","ino","uid","offset","out_limit",
            "res_limit","window"} (+ the request when offset is -1)
    A ACK u64 offset                    Q CANCEL
    a RPC_ANSWER {"name","offset","more"} + bytes of the answer
    H HELLO  x EXIT  S SHIPPED  O OUT  R RESULT  r RPC_REQ (agent -> module)

A READY waits for a new kernel's runner to say it is up: DIR/ready (a
regular file, not followed if a link, at most 4 KiB), woken by inotify
on DIR and by PID's pidfd.  Its x is status 0 with the file's bytes, a
newline and PID's /proc/PID/stat once the file holds something and PID
is alive; status 1 when PID is gone or DIR cannot be opened; -1 past the
timeout (ms): what the spawn's shell loop said before, without its 10 ms
sleeps.

A KERNEL is hermes_kernel.sh's "dir" or "ship" step (ARGS its argv, the
files' bytes after the JSON) done by the agent itself, as the script
would do it and with its output and exit status: a new session then
waits on no process for its directory and files.

A CELL follows cell N of a kernel for the module on the agent's one
channel, and checks the kernel before anything else.  The kernel
must still be the one the module started: PID's start time (field 22 of
/proc/PID/stat) is START, DIR (not followed if a link) has inode INO, and
DIR and DIR/cells are UID's and 0700.  Everything after is opened relative
to those directories, without following links, without blocking on a
FIFO, regular files only, reads bounded.  Offset -1 ships the request
(cells/cell_req_N.json.tmp O_EXCL|O_NOFOLLOW 0600, renamed into place,
one byte into the wake FIFO) and answers S; then, from the offset, OUT
frames carry cell_out_N's whole lines as the runner appends them (a
complete line longer than the window in pieces), never more than
OUT_LIMIT + 1 bytes in all and never past the module's last ACK + WINDOW;
once cell_res_N.json is there, the rest of cell_out (a tail without
newline too), then R with the result, refused when larger than RES_LIMIT
(or than a frame).  The agent's words, objects keyed "relay", as R:

    {"relay":"dead"}     not shipped: the kernel is gone, or is not ours
    {"relay":"full"}     not shipped: the disk is full, the kernel is fine
    {"relay":"failed","error":...}   not shipped, for another reason
    {"relay":"died"}     the kernel died during the cell
    {"relay":"unreadable","status":"error","error":...}   a file of the
                         cell is not a regular file, or too big

Before a CELL ships a new cell, the requests and answers an earlier
cell left in rpc/ are removed: its authority ended with it.  While a
CELL stream of a kernel is open, complete tool call requests rpc/req_N
(renamed into place) are read (regular files, at most 1 MiB), removed
and sent as r frames {"name":"req_N"} + the request on that stream (or
{"name":"req_N","unreadable":1} for one that is not a regular file or is
too big); the module checks and counts them.  a frames write its answers: NAME is rpc's res_N or
tool_results/cell_N_N.json (an answer too big for the code, archived;
tool_results/ made 0700 if missing, else it must be the kernel's, 0700,
not a link), written as NAME.tmp (O_EXCL|O_NOFOLLOW 0600) from offset 0
on, in order, renamed into place with the frame whose "more" is false.

The agent never polls.  It sleeps in one poll() over stdin, stdout (when
frames wait to be written), one inotify instance (ctypes on libc: watches
on the cells/ and rpc/ directories of the kernels it streams), a pidfd per
streamed runner (readable when it exits: a final read, then "died") and
its EXEC children's pidfds and pipes.  Fallbacks, used only where the host
lacks the mechanism: without os.pidfd_open (Python < 3.9, Linux < 5.3) an
EXEC child's exit is seen through SIGCHLD (signal.set_wakeup_fd) and a
runner's liveness is checked every 0.1 s while its cell streams; without
inotify (no ctypes, no libc symbol, or the watch limit reached) a stream
looks at its files every 10 ms.  HELLO says which of the two it has.
Python 3.7 or later (test_agent.py runs it with HERMES_AGENT_PYTHON).
"""

import errno
import json
import os
import re
import select
import signal
import stat
import struct
import subprocess
import sys
import time

MAGIC = b"\0HERMES-AGENT-1\n"
MAX_PAYLOAD = (1 << 20) + 64
FRAME_DATA = 1 << 20              # cell_out bytes in one OUT frame at most
CHUNK = 65536
RPC_MAX = 1 << 20
RPC_BACKLOG = 8 << 20             # frames waiting on stdout: requests wait
EXEC_OUT_MAX = 1 << 20
READY_MAX = 4096
DEFAULT_WINDOW = 1 << 20
TICK_NO_INOTIFY = 0.01
TICK_NO_PIDFD = 0.1
# names of a directory one stream looks at in one turn of the loop: a
# kernel that fills its rpc/ with junk costs its neighbours that, no more
LIST_TURN = 256
# inotify reads in one turn of the loop: a flood waits for the next turn
INOTIFY_TURN = 16

READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
DIRS = (os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK
        | os.O_CLOEXEC)
CREATE = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK
          | os.O_CLOEXEC)

UNREADABLE_OUT = "reading the cell's output failed"
UNREADABLE_RES = "the kernel wrote an unreadable result"

IN_MODIFY = 0x2
IN_MOVED_TO = 0x80
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
IN_DELETE_SELF = 0x400
# what a stream needs: cell_out's writes, the result's (and a tool call
# request's, a ready file's) rename into place.  Not its creation or
# close: each event wakes the agent, and a trivial cell made four more
WATCH = IN_MODIFY | IN_MOVED_TO | IN_ONLYDIR
# a kept kernel's watches: cells/ asks for nothing but its end while no
# stream of the kernel is on it (its cells streamed by another agent wake
# nobody here); rpc/ for every name that comes (a request renamed in,
# and what else a cell may make there: Agent.rpc_clean)
IN_CREATE = 0x100
WATCH_IDLE = IN_DELETE_SELF | IN_ONLYDIR
WATCH_RPC = IN_MOVED_TO | IN_CREATE | IN_ONLYDIR
KERNELS_KEPT = 64                 # kernels an agent keeps verified (LRU)
EVENT = struct.Struct("iIII")

RPC_REQ = re.compile(r"req_[0-9]{1,12}\Z")
RPC_RES = re.compile(r"res_[0-9]{1,12}\Z")
RPC_ARCHIVE = re.compile(r"tool_results/(cell_[0-9]{1,12}_[0-9]{1,12}\.json)\Z")

HEADER = struct.Struct(">IIB")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")


class Quit(Exception):
    """stdin ended, stdout broke, or the module spoke nonsense."""


class Unreadable(Exception):
    pass


def log(msg):
    try:
        os.write(2, b"hermes_agent: " + msg.encode("utf-8", "replace") + b"\n")
    except OSError:
        pass


def dumps(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def jb(obj, data=b""):
    j = dumps(obj)
    return U32.pack(len(j)) + j + data


def parse_jb(payload):
    """The JSON object and the bytes after it; ValueError if malformed."""
    if len(payload) < 4:
        raise ValueError("short payload")
    n = U32.unpack_from(payload)[0]
    if n > len(payload) - 4:
        raise ValueError("JSON length past the payload")
    obj = json.loads(bytes(payload[4:4 + n]))
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj, bytes(payload[4 + n:])


def want_int(obj, key, lo, hi=(1 << 62), default=None):
    v = obj.get(key, default)
    if type(v) is not int or not lo <= v <= hi:
        raise ValueError("%s must be an integer from %d to %d" % (key, lo, hi))
    return v


class Inotify:
    """inotify through ctypes on libc; ok is False where there is none."""

    def __init__(self):
        self.fd = -1
        self.drained = False
        try:
            import ctypes
            self.ctypes = ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            self.add = libc.inotify_add_watch
            self.add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            self.rm = libc.inotify_rm_watch
            self.rm.argtypes = [ctypes.c_int, ctypes.c_int]
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (ImportError, OSError, AttributeError) as e:
            log("no inotify (%s): streams look at their files every %g s"
                % (e, TICK_NO_INOTIFY))
            return
        if fd < 0:
            log("inotify_init1: %s" % os.strerror(ctypes.get_errno()))
            return
        self.fd = fd

    @property
    def ok(self):
        return self.fd >= 0

    def watch(self, dirfd, mask=WATCH):
        """A watch on the directory open as dirfd (its very inode, not a
        path that may have been replaced since), or its mask now mask
        where it has one; -1 if none."""
        if self.fd < 0:
            return -1
        wd = self.add(self.fd, b"/proc/self/fd/%d" % dirfd, mask)
        if wd < 0:
            log("inotify_add_watch: %s" % os.strerror(self.ctypes.get_errno()))
        return wd

    def unwatch(self, wd):
        self.rm(self.fd, wd)

    def events(self):
        """(wd, mask, name) of the events queued, INOTIFY_TURN reads at
        most: the rest come on the loop's next turn (drained is False
        until a read finds the queue empty)."""
        out = []
        self.drained = False
        for _ in range(INOTIFY_TURN):
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                self.drained = True
                break
            pos = 0
            while pos + EVENT.size <= len(buf):
                wd, mask, _, n = EVENT.unpack_from(buf, pos)
                pos += EVENT.size
                name = buf[pos:pos + n].rstrip(b"\0")
                pos += n
                out.append((wd, mask, name.decode("utf-8", "replace")))
        return out


def pidfd_open(pid):
    """A pidfd for pid; None where the host has none (ENOSYS, old Python);
    raises ProcessLookupError when it is gone."""
    f = getattr(os, "pidfd_open", None)
    if f is None:
        return None
    try:
        return f(pid)
    except ProcessLookupError:
        raise
    except OSError as e:
        if e.errno not in (errno.ENOSYS, errno.EPERM, errno.EMFILE,
                           errno.ENFILE, errno.ENOMEM):
            raise
        return None


def proc_stat(pid):
    """/proc/PID/stat, b"" if the pid is gone.  os-level: a file object
    costs six more syscalls, and this is read twice a cell."""
    try:
        fd = os.open("/proc/%d/stat" % pid, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 4096)
    except OSError:
        return b""
    finally:
        os.close(fd)


def proc_start(pid, st=None):
    """The pid's start time in clock ticks (from its stat line st when
    given); None if it is gone or a zombie."""
    try:
        fields = (proc_stat(pid) if st is None else st).rsplit(b")", 1)[1].split()
    except IndexError:
        return None
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def private(st, uid):
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == uid
            and stat.S_IMODE(st.st_mode) == 0o700)


def open_regular(name, dirfd):
    """A regular file of the directory, or None while there is none."""
    try:
        fd = os.open(name, READ, dir_fd=dirfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Unreadable("%s: %s" % (name, e.strerror))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unreadable("%s is not a regular file" % name)
    return fd


def read_bounded(fd, limit):
    size = os.fstat(fd).st_size
    if size > limit:
        raise Unreadable("%d bytes, more than %d" % (size, limit))
    parts, pos = [], 0
    while pos < size:
        data = os.pread(fd, size - pos, pos)
        if not data:
            break
        parts.append(data)
        pos += len(data)
    return b"".join(parts)


def unlink_quiet(name, dirfd):
    try:
        os.unlink(name, dir_fd=dirfd)
    except OSError:
        pass


class Listing:
    """A directory's names, LIST_TURN at a time: each() for every name, in
    turns of the agent's loop (a full listing of 40,000 names blocks the
    loop for tens of milliseconds)."""

    def __init__(self, dirfd, each):
        self.each = each
        self.it = os.scandir(dirfd)

    def turn(self):
        """One turn's share; True once every name was looked at."""
        for _ in range(LIST_TURN):
            try:
                e = next(self.it)
            except StopIteration:
                self.close()
                return True
            except OSError:
                self.close()
                return True
            if self.each(e.name) is False:
                self.close()
                return True
        return False

    def close(self):
        if self.it is not None:
            self.it.close()
            self.it = None


def close(fd):
    if fd is not None and fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


class Kernel:
    """The kernel's process and directories, verified once, and kept by
    the agent for the kernel's next cells (Agent.kernel): proving it anew
    each cell (the dirs opened by path, the start time read twice, a
    pidfd, two watches added and removed) was half of the agent's system
    calls a trivial cell.  A kept kernel's next cell checks what can
    change (check()).  Its runner's pidfd is in the agent's loop while it
    is kept; its streams (Cell) learn of the exit through it."""

    def __init__(self, path, pid, start, ino, uid):
        self.key = (path, pid, start, ino, uid)
        self.pid, self.start = pid, start
        self.dir = self.cells = self.rpc = None
        self.pidfd = None
        self.gone = False           # its runner exited (or never was ours)
        self.wd = self.rpc_wd = -1  # held by the agent (Agent.hold)
        self.streams = {}           # Cell -> True: its cells streamed here
        self.users = 0              # cells that hold it
        self.kept = False
        euid = os.geteuid()
        try:
            fd = os.open(path, DIRS)
        except OSError:
            return
        st = os.fstat(fd)
        # as root, the kernel is its directory's user (the spawn handed it
        # over); the inode says the directory is the kernel's
        if uid is None:
            uid = euid or st.st_uid
        self.uid = uid
        if (st.st_ino != ino or (euid and uid != euid)
                or not private(st, uid)):
            os.close(fd)
            return
        try:
            cells = os.open("cells", DIRS, dir_fd=fd)
        except OSError:
            os.close(fd)
            return
        cst = os.fstat(cells)
        if not private(cst, uid):
            os.close(cells)
            os.close(fd)
            return
        self.dir, self.cells = fd, cells
        self.ino, self.cells_ino, self.rpc_ino = ino, cst.st_ino, None
        # the pidfd first: then the start time says whose it is
        try:
            self.pidfd = pidfd_open(pid)
        except ProcessLookupError:
            self.gone = True
        except OSError as e:
            log("pidfd_open: %s: the runner is looked at every %g s"
                % (e.strerror, TICK_NO_PIDFD))
        if not self.gone and proc_start(pid) != start:
            self.gone = True        # gone, or the pid is another's now
        try:
            rpc = os.open("rpc", DIRS, dir_fd=fd)
        except OSError:
            return          # no tool calls; the cell itself goes on
        rst = os.fstat(rpc)
        if private(rst, uid):
            self.rpc, self.rpc_ino = rpc, rst.st_ino
        else:
            os.close(rpc)

    def ours(self):
        return self.dir is not None

    def tool_results(self):
        """tool_results/ of the kernel dir, made if missing: its fd."""
        try:
            os.mkdir("tool_results", 0o700, dir_fd=self.dir)
            made = True
        except FileExistsError:
            made = False
        fd = os.open("tool_results", DIRS, dir_fd=self.dir)
        st = os.fstat(fd)
        if made and st.st_uid != self.uid:
            os.fchown(fd, self.uid, -1)     # root made it for the kernel
            st = os.fstat(fd)
        if not private(st, self.uid):
            os.close(fd)
            raise OSError(errno.EPERM, "not an owner-only directory of the "
                          "kernel's user")
        return fd

    def alive(self):
        if self.gone:
            return False
        if self.pidfd is not None:      # readable once the runner exited
            self.gone = bool(select.select([self.pidfd], [], [], 0)[0])
        else:
            self.gone = proc_start(self.pid) != self.start
        return not self.gone

    def check(self):
        """A kept kernel, before its next cell: its runner alive, its
        path still its directory, that, cells/ and rpc/ still owner-only,
        cells/ and rpc/ still the ones verified (a cell, with the
        kernel's uid, may have opened them to others or made new ones)."""
        if not self.alive():
            return False
        try:
            # the path still the directory held: the runner writes by path
            st = os.stat(self.key[0], follow_symlinks=False)
            if st.st_ino != self.ino or not private(st, self.uid):
                return False
            for name, ino, fd in (("cells", self.cells_ino, self.cells),
                                  ("rpc", self.rpc_ino, self.rpc)):
                try:
                    st = os.stat(name, dir_fd=self.dir, follow_symlinks=False)
                except FileNotFoundError:
                    if fd is None:
                        continue        # no rpc/ still: no tool calls
                    raise
                if st.st_ino != ino or not private(st, self.uid):
                    return False        # (an rpc/ made since: anew)
        except OSError:
            return False
        return True

    def exists(self, name):
        try:
            os.stat(name, dir_fd=self.cells, follow_symlinks=False)
        except OSError:
            return False
        return True

    def close(self):
        for fd in (self.rpc, self.cells, self.dir, self.pidfd):
            close(fd)
        self.dir = self.cells = self.rpc = self.pidfd = None

    def write_new(self, dirfd, name, data, where):
        """name.tmp made anew (O_EXCL: a name already there, planted or a
        link, is not ours), written, renamed to name; None or the error."""
        tmp = name + ".tmp"
        try:
            fd = os.open(tmp, CREATE, 0o600, dir_fd=dirfd)
        except OSError as e:
            return e, "%s/%s: %s" % (where, tmp, e.strerror)
        try:
            if self.uid != os.geteuid():     # root writes for the kernel's user
                os.fchown(fd, self.uid, -1)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as e:
            os.close(fd)
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except OSError:
                pass
            return e, "%s/%s: %s" % (where, tmp, e.strerror)
        os.close(fd)
        try:
            os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        except OSError as e:
            return e, "%s/%s: %s" % (where, name, e.strerror)
        return None


def interrupt(path, ino, cell):
    """KeyboardInterrupt for cell: "N\\n" into the kernel's intr FIFO, as
    the module does on its own host: the directory still the kernel's
    inode, never through a link, never waiting."""
    try:
        d = os.open(path, DIRS)
        try:
            if os.fstat(d).st_ino != ino:
                raise OSError(errno.ESTALE, "not the kernel's directory")
            # a FIFO before it is opened: opening a node the kernel put
            # there (a device, hard-linked) has effects of its own
            if not stat.S_ISFIFO(os.stat("intr", dir_fd=d,
                                         follow_symlinks=False).st_mode):
                raise OSError(errno.EINVAL, "intr is not a FIFO")
            fd = os.open("intr", os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW
                         | os.O_CLOEXEC, dir_fd=d)
        finally:
            os.close(d)
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "intr is not a FIFO")
            os.write(fd, b"%d\n" % cell)
        finally:
            os.close(fd)
    except OSError as e:
        log("interrupting cell %d in %s: %s" % (cell, path,
                                               e.strerror or e))


def ship(k, cell, req):
    """Send the request inline through the runner's wake FIFO when it is
    small (its JSON and a newline, one write of at most PIPE_BUF, which a
    FIFO takes whole or not at all), else write it as a new file and wake
    the runner; the agent's word when the cell was not shipped, else
    None."""
    if not k.ours() or not k.alive():
        return {"relay": "dead"}
    if len(req) < select.PIPE_BUF and b"\n" not in req and b"\0" not in req:
        w = wake(k, req + b"\n")
        if w != "full":
            return w
    err = k.write_new(k.cells, "cell_req_%06d.json" % cell, req, "cells")
    if err is not None:
        if err[0].errno in (errno.ENOSPC, errno.EDQUOT):
            return {"relay": "full"}
        return {"relay": "failed", "error": err[1]}
    w = wake(k, b"\0")
    return None if w == "full" else w     # a full FIFO holds a wake-up


def wake(k, data):
    """data into the kernel's wake FIFO: None when written, "full" when
    the FIFO has no room for it, else the agent's word."""
    try:
        fd = os.open("wake", os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW
                     | os.O_CLOEXEC, dir_fd=k.dir)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.ENOENT):
            return {"relay": "dead"}
        return {"relay": "failed", "error": "wake: %s" % e.strerror}
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return {"relay": "failed", "error": "wake: not a FIFO"}
        os.write(fd, data)
    except BlockingIOError:
        return "full"
    except OSError as e:
        return {"relay": "failed", "error": "wake: %s" % e.strerror}
    finally:
        os.close(fd)
    return None


class Output:
    """cell_out from an offset: whole lines while the cell runs."""

    def __init__(self, offset, limit):
        self.offset = offset
        self.limit = limit + 1          # one past the module's bound
        self.fd = None
        self.clean = offset             # scanned for newlines up to here
        self.nl = offset                # just past the last newline seen

    def scan(self):
        """The end of what there is; finds the last newline before it."""
        end = min(os.fstat(self.fd).st_size, self.limit)
        if end < self.clean:
            self.clean = self.nl = self.offset   # cut back: look again
        pos = max(self.clean, self.offset)
        while pos < end:
            data = os.pread(self.fd, min(CHUNK, end - pos), pos)
            if not data:
                break
            i = data.rfind(b"\n")
            if i >= 0:
                self.nl = pos + i + 1
            pos += len(data)
        self.clean = pos
        return end

    def send(self, agent, sid, stop):
        """OUT frames for [offset, stop)."""
        self.frames(agent, sid, stop,
                    lambda off, n: os.pread(self.fd, n, off))

    def send_lines(self, agent, sid, lines, cap):
        """OUT frames for the event lines a result file holds before the
        result (the runner's _Sink.ending), as cell_out's from offset;
        False while the window holds them back."""
        end = min(len(lines), self.limit)
        self.frames(agent, sid, min(end, cap),
                    lambda off, n: lines[off:off + n])
        return self.offset >= end

    def frames(self, agent, sid, stop, read):
        while self.offset < stop:
            data = read(self.offset, min(FRAME_DATA, stop - self.offset))
            if not data:
                break
            agent.send(sid, b"O", U64.pack(self.offset) + data)
            self.offset += len(data)


class Answer:
    """A tool call's answer on its way into BASE.tmp of dirfd (rpc/, or
    tool_results/ for an archived one), renamed to BASE when whole."""

    __slots__ = ("dirfd", "base", "fd", "offset")

    def __init__(self, dirfd, base):
        self.dirfd, self.base, self.fd, self.offset = dirfd, base, None, 0


class Cell:
    """One CELL stream: a cell of a kernel, shipped or resumed, streamed."""

    pidfd = None        # the kernel's is in the loop (Agent.kernel)

    def __init__(self, agent, sid, k, cell, offset, out_limit, res_limit,
                 window, req=None):
        self.agent, self.sid, self.k = agent, sid, k
        self.cell, self.req = cell, req     # req: to ship, else resumed
        self.out_name = "cell_out_%06d" % cell
        self.res_name = "cell_res_%06d.json" % cell
        self.o = Output(offset, out_limit)
        self.res_limit = min(res_limit, MAX_PAYLOAD)
        self.acked, self.window = offset, window
        self.dead = False
        self.wd = self.rpc_wd = -1
        self.open = True
        self.tick = None
        self.answers = {}       # name: Answer
        self.started = False
        self.listing = None     # rpc/ looked through, in the loop's turns
        self.listed = None      # what follows the listing
        self.rescan = False
        self.ended = None       # (event lines, result), the result file read

    def begin(self):
        """A new cell: an earlier cell's requests and answers in rpc/ have
        no authority now and go first, then the cell ships.  A kept
        kernel's rpc/ that no name came to since its last sweep (its
        watch says so, once the events queued are read) is not listed
        again: the listing was a quarter of the agent's calls a cell."""
        a, wd = self.agent, self.k.rpc_wd
        if wd >= 0:
            a.inotified(None)
            if wd in a.rpc_clean and a.ino.drained:
                return self.ship()
            a.rpc_clean.add(wd)         # a name that comes now: not clean
        if not self.list(self.swept, self.ship):
            a.rpc_clean.discard(wd)     # not listed: not clean either
            self.ship()

    def swept(self, name):
        if RPC_REQ.match(name) or RPC_RES.match(name):
            unlink_quiet(name, self.k.rpc)

    def ship(self):
        w = ship(self.k, self.cell, self.req)
        self.req = None
        if w is not None:
            return self.word(w)
        self.agent.send(self.sid, b"S", b"")
        self.start(shipped=True)

    def list(self, each, then):
        """rpc/'s names to each() in the loop's turns, then then(); False
        when there is nothing to list."""
        if self.k.rpc is None:
            return False
        try:
            self.listing = Listing(self.k.rpc, each)
        except OSError:
            return False
        self.listed = then
        self.agent.jobs[self] = True
        return True

    def list_turn(self):
        """The loop's turn; once the listing is over, then()."""
        if self.listing is not None and not self.listing.turn():
            return
        self.agent.jobs.pop(self, None)
        self.listing = None
        then, self.listed = self.listed, None
        if then is not None:
            then()

    def start(self, shipped=False):
        """shipped: by ship() just now, which found the runner alive (an
        exit from now on comes through the kernel's pidfd in the loop),
        and after rpc/'s watch was held: its requests all come as events
        (a look through rpc/ is for a resumed stream)."""
        a, k = self.agent, self.k
        self.started = True
        k.streams[self] = True      # its exit marks us dead (Agent.kernel)
        if not shipped and not k.alive():   # gone, or the pid another's
            self.dead = True
        self.wd = a.watch(self, k.wd, k.cells)
        if k.rpc is not None:
            self.rpc_wd = a.watch(self, k.rpc_wd)
        if self.wd < 0:
            self.tick = TICK_NO_INOTIFY
        elif k.pidfd is None and not self.dead:
            self.tick = TICK_NO_PIDFD
        self.pump()
        if self.open and not (shipped and k.rpc_wd >= 0):
            self.rpc_scan()

    def check(self):
        """The periodic look of a stream without pidfd or without watch."""
        if self.k.pidfd is None and not self.dead and not self.k.alive():
            self.dead = True
        self.pump()

    def ack(self, offset):
        if self.acked < offset < 1 << 62:
            self.acked = offset
            self.pump()

    def word(self, w):
        self.finish(dumps(w))

    def finish(self, payload):
        self.agent.send(self.sid, b"R", payload)
        self.cancel()

    def cancel(self):
        a = self.agent
        if not self.open:
            return
        a.forget(self)
        a.jobs.pop(self, None)
        if self.listing is not None:
            self.listing.close()
            self.listing = None
        a.unwatch(self, self.wd)
        a.unwatch(self, self.rpc_wd)
        for p in self.answers.values():
            self.answer_drop(p)
        self.answers = {}
        close(self.o.fd)
        self.o.fd = None
        self.k.streams.pop(self, None)
        a.kernel_put(self.k)

    def pump(self):
        """Send what the files hold and the window allows; end the stream
        when the result is there or the kernel is gone."""
        if not self.open or not self.started:
            return
        try:
            self.step()
        except OSError as e:
            # whatever a cell did to its files, it ends its stream only
            log("cell stream %d: %s" % (self.sid, e))
            self.word({"relay": "unreadable", "status": "error",
                       "error": UNREADABLE_OUT})

    def step(self):
        o, k = self.o, self.k
        cap = self.acked + self.window
        if self.ended is not None:
            return self.send_ended(cap)
        if o.fd is None:
            try:
                o.fd = open_regular(self.out_name, k.cells)
            except Unreadable:
                return self.word({"relay": "unreadable", "status": "error",
                                  "error": UNREADABLE_OUT})
        if o.fd is not None:
            o.scan()
            # bytes before a newline are final: a line the runner is still
            # writing, or drops again when its write fails half-way, waits
            o.send(self.agent, self.sid, min(o.nl, cap))
        try:
            res = open_regular(self.res_name, k.cells)
        except Unreadable:
            return self.word({"relay": "unreadable", "status": "error",
                              "error": UNREADABLE_RES})
        if res is not None:
            if self.listing is not None:
                # requests the cell made before its result go first
                os.close(res)
                return
            try:
                if o.fd is not None:
                    # the runner closed cell_out before renaming the result
                    # into place: what is left of it is final, a tail
                    # without newline too
                    end = o.scan()
                    o.send(self.agent, self.sid, min(end, cap))
                    if cap <= o.offset < end:
                        return      # the window is full: wait for an ACK
                data = read_bounded(res, self.res_limit)
            except Unreadable:
                return self.word({"relay": "unreadable", "status": "error",
                                  "error": UNREADABLE_RES})
            finally:
                os.close(res)
            # the result is the file's last line, event lines may come
            # before it: the whole stream of a cell that made no cell_out.
            # Kept: the file may be gone by the time the window opens.
            i = data.rfind(b"\n") + 1
            self.ended = (data[:i] if o.fd is None else b"", data[i:])
            return self.send_ended(cap)
        if self.dead:
            if o.fd is not None and cap <= o.offset < o.nl:
                return              # whole lines still to send: wait for ACK
            if k.exists(self.res_name):
                return self.step()  # the result came as the runner went
            self.word({"relay": "died"})

    def send_ended(self, cap):
        lines, res = self.ended
        if lines and not self.o.send_lines(self.agent, self.sid, lines, cap):
            return              # the window is full: wait for an ACK
        self.finish(res)

    def rpc_scan(self):
        """Requests that came without an event: at the start, after an
        inotify overflow, once the backlog is sent."""
        if not self.open or not self.started:
            return
        if self.listing is not None:
            self.rescan = True      # what came since the listing began
            return
        self.list(self.rpc_found, self.rpc_scanned)

    def rpc_found(self, name):
        if RPC_REQ.match(name):
            self.rpc_req(name)
            if self.agent.rpc_later:
                return False        # the backlog is full: scanned again

    def rpc_scanned(self):
        if self.rescan:
            self.rescan = False
            self.rpc_scan()
        else:
            self.agent.dirty[self] = True   # a result that waited for it

    def rpc_req(self, name):
        rpc = self.k.rpc
        if len(self.agent.outq) > RPC_BACKLOG:
            self.agent.rpc_later = True     # looked for again once sent
            return
        try:
            fd = open_regular(name, rpc)
            if fd is None:
                return          # taken already
            try:
                # removed while open: no negative dentry stays in rpc/ (a
                # later watch of it would walk them all)
                unlink_quiet(name, rpc)
                data = read_bounded(fd, RPC_MAX)
            finally:
                os.close(fd)
        except (Unreadable, OSError) as e:
            log("rpc/%s refused: %s" % (name, e))
            data = None
            unlink_quiet(name, rpc)
        if data is None:
            # a FIFO, a link, too big: the module counts it, as its own
            self.agent.send(self.sid, b"r", jb({"name": name,
                                                "unreadable": 1}))
        else:
            self.agent.send(self.sid, b"r", jb({"name": name}, data))

    def rpc_answer(self, payload):
        """A piece of an answer: NAME.tmp from offset 0 on, in order,
        renamed to NAME with the last piece."""
        try:
            obj, data = parse_jb(payload)
            name = obj.get("name")
            offset = want_int(obj, "offset", 0, default=0)
            more = obj.get("more", False)
            if not isinstance(name, str) or not isinstance(more, bool):
                raise ValueError("bad name or more")
            m = RPC_ARCHIVE.match(name)
            if not (m or RPC_RES.match(name)):
                raise ValueError("bad name")
        except ValueError as e:
            log("bad RPC_ANSWER on stream %d: %s" % (self.sid, e))
            return
        if self.k.rpc is None:
            log("rpc/%s: the kernel has no rpc directory" % name)
            return
        p = self.answers.pop(name, None)
        try:
            if p is None:
                if offset != 0:
                    raise OSError(errno.EINVAL, "a piece out of order")
                dirfd = self.k.tool_results() if m else os.dup(self.k.rpc)
                p = Answer(dirfd, m.group(1) if m else name)
                try:
                    # a tmp left by an agent that died writing it (unlink
                    # takes the name, never what a link points to)
                    os.unlink(p.base + ".tmp", dir_fd=dirfd)
                except OSError:
                    pass
                p.fd = os.open(p.base + ".tmp", CREATE, 0o600, dir_fd=dirfd)
                if self.k.uid != os.geteuid():
                    os.fchown(p.fd, self.k.uid, -1)
            elif offset != p.offset:
                raise OSError(errno.EINVAL, "a piece out of order")
            view = memoryview(data)
            while view:
                view = view[os.write(p.fd, view):]
            p.offset += len(data)
            if more:
                self.answers[name] = p
                return
            os.close(p.fd)
            p.fd = None
            os.rename(p.base + ".tmp", p.base, src_dir_fd=p.dirfd,
                      dst_dir_fd=p.dirfd)
            os.close(p.dirfd)
        except OSError as e:
            log("rpc answer %s: %s" % (name, e.strerror or e))
            if p is not None:
                self.answer_drop(p)

    def answer_drop(self, p):
        close(p.fd)
        try:
            os.unlink(p.base + ".tmp", dir_fd=p.dirfd)
        except OSError:
            pass
        close(p.dirfd)


class Exec:
    """One EXEC stream: /bin/sh -c CMD hermes ARGS... in its own process
    group (values come as arguments, never as shell text)."""

    def __init__(self, agent, sid, req, data):
        self.agent, self.sid = agent, sid
        self.out = bytearray()
        self.open = True
        self.proc = None
        self.pidfd = None
        self.answered = False
        cmd = req.get("cmd")
        if not isinstance(cmd, str):
            raise ValueError("cmd must be a string")
        if "\0" in cmd:
            raise ValueError("cmd holds a NUL")
        args = req.get("args", [])
        if (not isinstance(args, list)
                or not all(isinstance(a, str) and "\0" not in a
                           for a in args)):
            raise ValueError("args must be a list of strings without NULs")
        self.timeout = want_int(req, "timeout", 1, 1 << 31) / 1000.0
        self.out_max = min(want_int(req, "out_max", 0, default=EXEC_OUT_MAX),
                           EXEC_OUT_MAX)
        self.data = memoryview(data)
        self.cmd = cmd
        self.args = args

    def start(self):
        a = self.agent
        try:
            self.proc = subprocess.Popen(
                ["/bin/sh", "-c", self.cmd, "hermes"] + self.args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, start_new_session=True)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            return self.answer({"status": -1, "error": "spawn: %s" % e})
        self.deadline = time.monotonic() + self.timeout
        a.execs[self] = True
        try:
            self.pidfd = pidfd_open(self.proc.pid)
        except OSError:
            self.pidfd = None       # SIGCHLD says when it exits
        if self.pidfd is not None:
            a.on(self.pidfd, select.POLLIN, self.exited)
        fd = self.proc.stdout.fileno()
        os.set_blocking(fd, False)
        a.on(fd, select.POLLIN, self.readable)
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)
        a.on(fd, select.POLLOUT, self.writable)
        self.writable(0)
        if self.pidfd is None:
            a.sigchld()
            self.reap()     # it may have exited before SIGCHLD was caught

    def writable(self, ev):
        fd = self.proc.stdin.fileno()
        try:
            while self.data:
                self.data = self.data[os.write(fd, self.data[:CHUNK]):]
        except BlockingIOError:
            return
        except OSError:
            pass                # it does not read its stdin: fine
        self.agent.off(fd)
        self.proc.stdin.close()

    def readable(self, ev, drain=False):
        """Take what the pipe holds; bounded when the shell has exited
        (a child of it may hold the pipe and write on)."""
        fd = self.proc.stdout.fileno()
        n = 16 if drain else 1
        while n:
            n -= 1
            try:
                b = os.read(fd, CHUNK)
            except BlockingIOError:
                return
            except OSError:
                b = b""
            if not b:
                self.agent.off(fd)
                self.proc.stdout.close()
                return
            keep = self.out_max - len(self.out)
            if keep > 0:
                self.out += b[:keep]

    def exited(self, ev):
        self.reap()

    def reap(self):
        """The shell has exited (or may have, on SIGCHLD): answer."""
        if self.proc.poll() is None:
            return
        a = self.agent
        a.pidfd_done(self)
        a.execs.pop(self, None)
        if not self.proc.stdout.closed:
            self.readable(0, drain=True)
        self.release()
        rc = self.proc.returncode
        self.answer({"status": rc if rc >= 0 else 128 - rc})

    def release(self):
        a = self.agent
        for f in (self.proc.stdin, self.proc.stdout):
            if not f.closed:
                a.off(f.fileno())
                f.close()

    def expire(self):
        self.answer({"status": -1, "error": "timeout after %d ms"
                     % round(self.timeout * 1000)})
        self.kill()

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.release()
        # reaped when its pidfd (or SIGCHLD) says so; nothing more is sent
        self.open = False
        self.agent.streams.pop(self.sid, None)

    def cancel(self):
        if self.proc is not None and self.proc.returncode is None:
            self.kill()
        self.open = False
        self.agent.streams.pop(self.sid, None)

    def answer(self, status):
        if self.open and not self.answered:
            self.answered = True
            self.agent.send(self.sid, b"x", jb(status, bytes(self.out)))
        self.open = False
        self.agent.streams.pop(self.sid, None)


class Ready:
    """One READY stream: until DIR/ready holds the runner's word, PID is
    gone, or the timeout."""

    out_name, res_name, rpc_wd = "ready", None, None

    def __init__(self, agent, sid, req, data=b""):   # data: none in a READY
        self.agent, self.sid = agent, sid
        path = req.get("dir")
        if not isinstance(path, str) or not path or "\0" in path:
            raise ValueError("dir must be a path")
        self.path = path
        self.pid = want_int(req, "pid", 1, (1 << 31) - 1)
        self.timeout = want_int(req, "timeout", 1, 1 << 31)
        self.deadline = time.monotonic() + self.timeout / 1000.0
        self.dir = self.pidfd = None
        self.wd = -1
        self.tick = None
        self.open = True

    def start(self):
        a = self.agent
        try:
            self.dir = os.open(self.path, DIRS)
        except OSError as e:
            return self.answer({"status": 1}, ("%s: %s\n" % (
                self.path, e.strerror)).encode())
        try:
            self.pidfd = pidfd_open(self.pid)
        except ProcessLookupError:
            return self.pump()
        if self.pidfd is not None:
            a.on(self.pidfd, select.POLLIN, self.exited)
        self.wd = a.watch(self, a.hold(self.dir))
        # a clock where a mechanism is missing, and for the timeout
        self.tick = (TICK_NO_INOTIFY if self.wd < 0 or self.pidfd is None
                     else max(0.0, self.deadline - time.monotonic()))
        self.pump()

    def exited(self, ev):
        self.agent.pidfd_done(self)
        self.pump()

    def check(self):
        if self.wd in self.agent.watches and self.pidfd is not None:
            self.tick = max(0.0, self.deadline - time.monotonic())
        else:                       # no watch (or it went), or no pidfd
            self.tick = TICK_NO_INOTIFY
        self.pump()

    def pump(self):
        if not self.open:
            return
        word = b""
        try:
            fd = None if self.dir is None else open_regular("ready", self.dir)
            if fd is not None:
                try:
                    word = read_bounded(fd, READY_MAX)
                finally:
                    os.close(fd)
        except Unreadable:
            word = b""              # not the runner's: wait on for it
        st = proc_stat(self.pid)
        alive = proc_start(self.pid, st) is not None
        if word:
            if alive:
                return self.answer({"status": 0}, word + b"\n" + st)
            return self.answer({"status": 1}, word + b"\n")
        if not alive:
            return self.answer({"status": 1})
        if time.monotonic() >= self.deadline:
            self.answer({"status": -1, "error": "no ready after %d ms"
                         % self.timeout})

    def answer(self, status, out=b""):
        if self.open:
            self.agent.send(self.sid, b"x", jb(status, out))
        self.cancel()

    def cancel(self):
        if not self.open:
            return
        a = self.agent
        a.forget(self)
        a.unwatch(self, self.wd)
        a.release(self.wd)
        close(self.dir)
        self.dir = None


def is_id(s):
    return len(s) == 32 and all(c in "0123456789abcdef" for c in s)


def file_type(st):
    # stat(1)'s %F words for the types a kernel dir's check tells apart
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISLNK(st.st_mode):
        return "symbolic link"
    return "regular file" if stat.S_ISREG(st.st_mode) else "other"


class StepFailed(Exception):
    """A kernel step's end: its exit status and its words."""

    def __init__(self, status, words):
        Exception.__init__(self, words)
        self.status, self.words = status, words


class KernelStep:
    """One KERNEL stream: hermes_kernel.sh's "dir" or "ship" done here,
    with the script's argv, output and exit statuses (docs/internals.md,
    "Spawn"), without its 6 processes each.  Answered by one
    x, as an EXEC of the script would be."""

    def __init__(self, agent, sid, req, data):
        self.agent, self.sid = agent, sid
        args = req.get("args")
        if (not isinstance(args, list) or not args
                or not all(isinstance(a, str) and "\0" not in a
                           for a in args)):
            raise ValueError("args must be a list of strings without NULs")
        if args[0] not in ("dir", "ship"):
            raise ValueError("no step %r here" % args[0])
        self.verb, self.args, self.data = args[0], args[1:], data
        self.out = []

    def start(self):
        try:
            if self.verb == "dir":
                self.dir(*self.argv(4, 4))
            else:
                self.ship(*self.argv(4, 1 << 20))
            status = 0
        except StepFailed as e:
            self.out.append(e.words)
            status = e.status
        except OSError as e:
            self.out.append("%s: %s" % (e.filename or self.verb, e.strerror))
            status = 1
        out = "".join(w + "\n" for w in self.out).encode("utf-8", "replace")
        self.agent.streams.pop(self.sid, None)
        self.agent.send(self.sid, b"x", jb({"status": status}, out))

    def argv(self, lo, hi):
        if not lo <= len(self.args) <= hi:
            raise StepFailed(2, "usage: dir|ship|start|kill|recover ARG...")
        return self.args

    def dir(self, root, kid, gw, inst):
        """A directory of our own, never one found there, and its line in
        this user's journal: the script's kernel_dir."""
        if not is_id(kid):
            raise StepFailed(2, "bad kernel id")
        if not gw + inst or re.search("[^0-9a-f]", gw + inst):
            raise StepFailed(2, "bad gateway id")
        uid = os.geteuid()
        m = os.stat(root + "/").st_mode
        # writable by group or others, and not sticky
        if m & 0o022 and not m & stat.S_ISVTX:
            raise StepFailed(3, "the kernels root %s is writable by others "
                             "without the sticky bit" % root)
        j = "%s/hermes_journal_%d" % (root, uid)
        try:
            os.mkdir(j, 0o700)
        except OSError:
            pass
        try:
            ok = private(os.lstat(j), uid)
        except OSError:
            ok = False
        if not ok:
            raise StepFailed(6, "the journal %s is not a directory of uid %d "
                             "with mode 0700" % (j, uid))
        d = "%s/hermes_rkernel_%s" % (root, kid)
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            raise StepFailed(4, "EEXIST")
        except OSError as e:
            raise StepFailed(5, "mkdir: cannot create directory '%s': %s"
                             % (d, e.strerror))
        self.out.append("made")
        dfd = os.open(d, DIRS)
        try:
            os.mkdir("cells", 0o700, dir_fd=dfd)
            os.mkdir("rpc", 0o700, dir_fd=dfd)
            sts = [os.fstat(dfd)] + [os.stat(n, dir_fd=dfd,
                                             follow_symlinks=False)
                                     for n in ("cells", "rpc")]
        finally:
            os.close(dfd)
        jfd = os.open(j, DIRS)
        try:
            fd = os.open(kid, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                         | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=jfd)
        finally:
            os.close(jfd)
        try:
            os.write(fd, ("%s %s %d\n" % (gw, inst, sts[0].st_ino)).encode())
        finally:
            os.close(fd)
        for st in sts:
            self.out.append("%s:%d:%o:%d" % (file_type(st), st.st_uid,
                                             stat.S_IMODE(st.st_mode),
                                             st.st_ino))
        self.out.append(str(uid))

    def ship(self, root, kid, *files):
        """The files' bytes one after another in the frame, each NAME
        exactly LEN bytes, each made new 0600 in the dir "dir" made: the
        script's kernel_ship."""
        if len(files) % 2:
            raise StepFailed(2, "usage: dir|ship|start|kill|recover ARG...")
        if not is_id(kid):
            raise StepFailed(2, "bad kernel id")
        names, lens = files[0::2], files[1::2]
        for name in names:
            if name in ("", ".", "..") or "/" in name:
                raise StepFailed(2, "bad file name")
        for n in lens:
            if not n.isdigit() or not n.isascii():
                raise StepFailed(2, "bad number")
        try:
            dfd = os.open("%s/hermes_rkernel_%s" % (root, kid), DIRS)
        except OSError:
            raise StepFailed(1, "no kernel directory")
        try:
            data, pos = memoryview(self.data), 0
            for name, n in zip(names, lens):
                part = data[pos:pos + int(n)]
                pos += len(part)
                fd = os.open(name, CREATE, 0o600, dir_fd=dfd)
                try:
                    while part:
                        part = part[os.write(fd, part):]
                finally:
                    os.close(fd)
        finally:
            os.close(dfd)


# the streams answered by one x: their class, their name in errors
ANSWERED = {ord("X"): (Exec, "EXEC"), ord("W"): (Ready, "READY"),
            ord("K"): (KernelStep, "KERNEL")}


class Agent:

    def __init__(self, inbuf):
        self.inbuf = bytearray(inbuf)
        self.rbuf = bytearray(1 << 18)
        self.outq = bytearray()
        self.poller = select.poll()
        self.handlers = {}
        self.streams = {}
        self.dirty = {}             # Cell -> True, in the order marked
        self.execs = {}             # Exec -> True, until reaped
        self.watches = {}           # wd -> {stream: True}: its events' takers
        self.held = {}              # wd -> holders: kept kernels, READY streams
        self.wide = {}              # wd -> [dirfd, the last stream's names]:
                                    # kept cells/ asking for WATCH
        self.kernels = {}           # Kernel.key -> Kernel kept, LRU first
        self.rpc_clean = set()      # rpc/ wds swept, no name come since
        self.wakeup = None
        self.rpc_later = False
        self.jobs = {}              # Cell -> True, while it lists rpc/
        self.intrs = {}             # (dir, ino, cell) -> True, this read
        self.ino = Inotify()
        if self.ino.ok:
            self.on(self.ino.fd, select.POLLIN, self.inotified)
        self.on(0, select.POLLIN, self.readable)
        self.on(1, 0, self.writable)
        self.out_waiting = False

    # -- the loop ------------------------------------------------------------

    def on(self, fd, events, cb):
        self.handlers[fd] = cb
        self.poller.register(fd, events)

    def off(self, fd):
        if self.handlers.pop(fd, None) is not None:
            self.poller.unregister(fd)

    def run(self):
        self.frames()
        while True:
            self.flush()
            timeout = self.timeout()
            try:
                ready = self.poller.poll(
                    None if timeout is None
                    else max(0, min(int(timeout * 1000) + 1, 1 << 30)))
            except InterruptedError:
                ready = []
            # a handler may close an fd whose number the next one reuses
            batch = [(fd, ev, self.handlers.get(fd)) for fd, ev in ready]
            for fd, ev, cb in batch:
                if cb is not None and self.handlers.get(fd) is cb:
                    cb(ev)
            self.timers()
            # listings share the loop: a turn each, between the polls
            for s in list(self.jobs):
                if s in self.jobs:
                    s.list_turn()
            while self.dirty:
                s = next(iter(self.dirty))
                del self.dirty[s]
                s.pump()

    def timeout(self):
        if self.jobs:
            return 0                # listings go on after a look around
        t = None
        now = time.monotonic()
        for e in self.execs:
            if e.open:
                t = e.deadline - now if t is None else min(t, e.deadline - now)
        for s in self.streams.values():
            if getattr(s, "tick", None) is not None:
                t = s.tick if t is None else min(t, s.tick)
        return t

    def timers(self):
        now = time.monotonic()
        for e in list(self.execs):
            if e.open and e.deadline <= now:
                e.expire()
        for s in list(self.streams.values()):
            if getattr(s, "tick", None) is not None and s.open:
                s.check()

    # -- frames --------------------------------------------------------------

    def readable(self, ev):
        # into a buffer kept: os.read(0, 256 KiB) made and freed a 256 KiB
        # object a read (an mmap, an mremap and a munmap a cell)
        try:
            n = os.readv(0, [self.rbuf])
        except BlockingIOError:
            return
        except OSError:
            n = 0
        if not n:
            raise Quit("stdin closed")
        self.inbuf += memoryview(self.rbuf)[:n]
        self.frames()

    def frames(self):
        buf = self.inbuf
        pos = 0
        while len(buf) - pos >= HEADER.size:
            n, sid, typ = HEADER.unpack_from(buf, pos)
            if n > MAX_PAYLOAD:
                raise Quit("a frame of %d bytes" % n)
            if len(buf) - pos < HEADER.size + n:
                break
            payload = bytes(buf[pos + HEADER.size:pos + HEADER.size + n])
            pos += HEADER.size + n
            self.frame(sid, typ, payload)
        del buf[:pos]
        # interrupts that came together: one each for a cell
        intrs, self.intrs = self.intrs, {}
        for (path, ino, cell) in intrs:
            interrupt(path, ino, cell)

    def frame(self, sid, typ, payload):
        s = self.streams.get(sid)
        if typ == ord("P"):
            self.send(sid, b"p", b"")
        elif typ == ord("I"):
            # a note: no stream, no answer
            try:
                req, _ = parse_jb(payload)
                path = req.get("dir")
                if not isinstance(path, str) or not path or "\0" in path:
                    raise ValueError("dir must be a path")
                key = (path, want_int(req, "ino", 0, (1 << 64) - 1),
                       want_int(req, "cell", 0, 999999999999))
            except ValueError as err:
                log("bad INTERRUPT: %s" % err)
                return
            self.intrs[key] = True
        elif typ in (ord("X"), ord("C"), ord("W"), ord("K")):
            if sid == 0 or s is not None:
                raise Quit("stream %d is in use" % sid)
            if typ == ord("C"):
                self.cell(sid, payload)
            else:
                self.answered(sid, payload, *ANSWERED[typ])
        elif s is None:
            return                  # ended or cancelled: late, ignored
        elif typ == ord("A"):
            if isinstance(s, Cell) and len(payload) == 8:
                s.ack(U64.unpack(payload)[0])
        elif typ == ord("Q"):
            s.cancel()
        elif typ == ord("a"):
            if isinstance(s, Cell):
                s.rpc_answer(payload)

    def send(self, sid, typ, payload):
        self.outq += HEADER.pack(len(payload), sid, typ[0])
        self.outq += payload
        if len(self.outq) >= 1 << 22:
            self.flush()

    def flush(self):
        q = self.outq
        while q:
            try:
                n = os.write(1, q)
            except BlockingIOError:
                break
            except OSError:
                raise Quit("stdout closed")
            del q[:n]
        want = bool(q)
        if not want and self.rpc_later:
            self.rpc_later = False
            for s in list(self.streams.values()):
                if isinstance(s, Cell) and s.open:
                    s.rpc_scan()
            want = bool(q)
        if want != self.out_waiting:
            self.out_waiting = want
            self.poller.modify(1, select.POLLOUT if want else 0)

    def writable(self, ev):
        if ev & (select.POLLERR | select.POLLHUP):
            raise Quit("stdout closed")
        self.flush()

    # -- streams -------------------------------------------------------------

    def answered(self, sid, payload, kind, what):
        """An EXEC, a READY or a KERNEL stream: each ends with one x."""
        try:
            req, data = parse_jb(payload)
            s = kind(self, sid, req, data)
        except ValueError as err:
            self.send(sid, b"x", jb({"status": -1,
                                     "error": "bad %s: %s" % (what, err)}))
            return
        self.streams[sid] = s
        s.start()

    def cell(self, sid, payload):
        try:
            req, data = parse_jb(payload)
            path = req.get("dir")
            if not isinstance(path, str) or not path or "\0" in path:
                raise ValueError("dir must be a path")
            cell = want_int(req, "cell", 0, 999999999999)
            pid = want_int(req, "pid", 1, (1 << 31) - 1)
            start = want_int(req, "start", 0)
            ino = want_int(req, "ino", 0, (1 << 64) - 1)
            uid = req.get("uid")
            if uid is not None:
                uid = want_int(req, "uid", 0, (1 << 32) - 2)
            offset = want_int(req, "offset", -1)
            out_limit = want_int(req, "out_limit", 0)
            res_limit = want_int(req, "res_limit", 0)
            window = want_int(req, "window", 1, default=DEFAULT_WINDOW)
        except ValueError as err:
            self.send(sid, b"R", dumps({"relay": "failed",
                                        "error": "bad CELL: %s" % err}))
            return
        k = self.kernel(path, pid, start, ino, uid)
        if offset >= 0 and not k.ours():
            # the directory went, or is another: the kernel is gone
            self.kernel_put(k)
            self.send(sid, b"R", dumps({"relay": "died"}))
            return
        s = Cell(self, sid, k, cell, max(offset, 0), out_limit, res_limit,
                 window, data if offset < 0 else None)
        self.streams[sid] = s
        if offset < 0:
            s.begin()
        else:
            s.start()

    def pidfd_done(self, s):
        """s's pidfd, if any, out of the loop and closed."""
        if s.pidfd is not None:
            self.off(s.pidfd)
            close(s.pidfd)
            s.pidfd = None

    def forget(self, s):
        """A CELL or READY stream ends: nothing more is sent for it."""
        s.open = False
        self.streams.pop(s.sid, None)
        self.dirty.pop(s, None)
        self.pidfd_done(s)

    # -- kept kernels --------------------------------------------------------

    def kernel(self, path, pid, start, ino, uid):
        """The kernel a CELL names, held until kernel_put(): the one kept
        if it still checks, else verified anew (and kept if it is ours)."""
        key = (path, pid, start, ino, uid)
        k = self.kernels.get(key)
        if k is not None:
            if k.check():
                del self.kernels[key]           # most recently used: last
                self.kernels[key] = k
                k.users += 1
                return k
            self.kernel_drop(k)
        k = Kernel(path, pid, start, ino, uid)
        k.users = 1
        if not k.ours() or k.gone:
            return k                            # for this cell alone
        k.kept = True
        self.kernels[key] = k
        if k.pidfd is not None:
            self.on(k.pidfd, select.POLLIN,
                    lambda ev, k=k: self.kernel_exited(k))
        k.wd = self.hold(k.cells, WATCH_IDLE)
        if k.rpc is not None:
            k.rpc_wd = self.hold(k.rpc, WATCH_RPC)
        if len(self.kernels) > KERNELS_KEPT:
            for o in list(self.kernels.values()):
                if o.users == 0:
                    self.kernel_drop(o)
                    break
        return k

    def kernel_put(self, k):
        k.users -= 1
        if k.users == 0 and (not k.kept or k.gone):
            self.kernel_drop(k)

    def kernel_drop(self, k):
        """k no longer kept; closed once no cell holds it."""
        if k.kept:
            k.kept = False
            del self.kernels[k.key]
        if k.users:
            return
        if k.pidfd is not None:
            self.off(k.pidfd)
        for wd in (k.wd, k.rpc_wd):
            self.release(wd)
        k.wd = k.rpc_wd = -1
        k.close()

    def kernel_exited(self, k):
        """A kept kernel's runner exited: its cells streamed here look
        once more, then say "died" (Cell.step)."""
        self.off(k.pidfd)               # readable from now on
        k.gone = True
        for s in list(k.streams):
            s.dead = True
            self.dirty[s] = True
        if k.users == 0:
            self.kernel_drop(k)

    # -- inotify, pidfds, SIGCHLD --------------------------------------------

    def hold(self, dirfd, mask=WATCH):
        """A watch on dirfd's directory, held until release(); -1: none."""
        wd = self.ino.watch(dirfd, mask)
        if wd >= 0:
            self.held[wd] = self.held.get(wd, 0) + 1
        return wd

    def release(self, wd):
        n = self.held.get(wd)
        if n is None:               # never held, or IN_IGNORED took it
            return
        if n > 1:
            self.held[wd] = n - 1
            return
        del self.held[wd]
        self.watches.pop(wd, None)
        self.wide.pop(wd, None)
        self.rpc_clean.discard(wd)
        self.ino.unwatch(wd)

    def watch(self, s, wd, dirfd=None):
        """s takes wd's events; the first stream on a kept kernel's
        cells/ (dirfd) asks for what a stream needs (WATCH), unless the
        watch still does from an earlier stream."""
        if wd < 0:
            return -1
        w = self.watches.setdefault(wd, {})
        if not w and dirfd is not None and wd not in self.wide:
            self.ino.watch(dirfd, WATCH)
            self.wide[wd] = [dirfd, None]
        w[s] = True
        return wd

    def unwatch(self, s, wd):
        """s takes no more of wd's events.  A kept kernel's cells/ stays
        wide until an event comes that no stream here waits for (a cell
        another agent streams), which narrows it (narrow): a kernel's next
        cell here then needs no inotify_add_watch (two of them a cell,
        each a walk of /proc/self/fd/N, were a fifth of this agent's CPU
        for a trivial cell)."""
        w = self.watches.get(wd)
        if w is None:
            return
        w.pop(s, None)
        if not w:
            del self.watches[wd]
        if wd in self.wide:
            # its files' events may still be queued: not another's cell
            self.wide[wd][1] = (s.out_name, s.res_name)

    def narrow(self, wd, name):
        """A kept kernel's cells/ asks for nothing but its end again, on
        an event of a name no stream here waited for."""
        dirfd, ours = self.wide[wd]
        if ours and name in ours:
            return
        del self.wide[wd]
        if wd in self.held:
            self.ino.watch(dirfd, WATCH_IDLE)

    def inotified(self, ev):
        for wd, mask, name in self.ino.events():
            self.rpc_clean.discard(wd)
            if mask & IN_Q_OVERFLOW:
                self.rpc_clean.clear()
                log("inotify queue overflow: every stream looks again")
                for s in list(self.streams.values()):
                    if isinstance(s, Cell):
                        self.dirty[s] = True
                        s.rpc_scan()
                    elif isinstance(s, Ready):
                        self.dirty[s] = True
                continue
            if mask & IN_IGNORED:
                # the directory is gone: its streams look on a clock
                self.held.pop(wd, None)
                self.wide.pop(wd, None)
                for s in self.watches.pop(wd, ()):
                    s.tick = TICK_NO_INOTIFY
                    self.dirty[s] = True
                continue
            w = self.watches.get(wd)
            if w is None:
                if wd in self.wide:
                    self.narrow(wd, name)
                continue
            for s in list(w):
                if not s.open:
                    continue
                if wd == s.rpc_wd:
                    if mask & IN_MOVED_TO and RPC_REQ.match(name):
                        s.rpc_req(name)
                        break       # one stream of the kernel takes it
                elif name in (s.out_name, s.res_name):
                    self.dirty[s] = True

    def sigchld(self):
        """Without pidfds: EXEC children's exits through SIGCHLD."""
        if self.wakeup is not None:
            return
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wakeup = r
        signal.signal(signal.SIGCHLD, lambda *a: None)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self.on(r, select.POLLIN, self.children)

    def children(self, ev):
        try:
            while os.read(self.wakeup, 4096):
                pass
        except BlockingIOError:
            pass
        for e in list(self.execs):
            e.reap()

    def close(self):
        """Leaving: every EXEC's process group is killed; cells run on."""
        for e in list(self.execs):
            if e.proc is not None and e.proc.returncode is None:
                try:
                    os.killpg(e.proc.pid, signal.SIGKILL)
                except OSError:
                    pass


def main():
    os.umask(0o077)
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
    # what the loader's buffered reader took past this text: first frames
    inbuf = b""
    stdin = getattr(sys.stdin, "buffer", None)
    if stdin is not None:
        os.set_blocking(0, False)
        try:
            inbuf = stdin.peek(1 << 20) or b""
            inbuf = stdin.read(len(inbuf)) if inbuf else b""
        except (OSError, ValueError):
            inbuf = b""
        os.set_blocking(0, True)
    ag = Agent(inbuf)
    pidfd = getattr(os, "pidfd_open", None) is not None
    if pidfd:
        try:
            close(os.pidfd_open(os.getpid()))
        except OSError:
            pidfd = False
    hello = dumps({"v": 1, "pid": os.getpid(), "uid": os.geteuid(),
                   "python": "%d.%d.%d" % sys.version_info[:3],
                   "inotify": ag.ino.ok, "pidfd": pidfd})
    try:
        out = MAGIC + HEADER.pack(len(hello), 0, ord("H")) + hello
        while out:
            out = out[os.write(1, out):]
        os.set_blocking(1, False)
        ag.run()
    except Quit as e:
        if str(e) not in ("stdin closed", "stdout closed"):
            log(str(e))
    except OSError as e:
        log("stopped: %s" % e)
    finally:
        ag.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
