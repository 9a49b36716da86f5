"""Relays one cell between the ssh backend and its kernel, over one channel.

The module runs it from its own copy, never from the kernel directory (a
cell, with the kernel's uid, may rewrite anything there):

    exec python3 -I -c 'LOADER' DIR N PID START INO OUT_LIMIT RES_LIMIT OFFSET

with on stdin the length of this text, a newline, this text and, when
OFFSET is -1, the cell request.  LOADER reads the text and runs it (see
ngx_hermes_backend_ssh.c).  OFFSET -1 ships the cell, then relays; any
other offset resumes relaying from there.

The kernel must still be the one the module started: PID's start time
(field 22 of /proc/PID/stat) is START, DIR (not followed if a link) has
inode INO, and DIR and DIR/cells are ours and 0700.  Everything after is
opened relative to those directories, without following links, without
blocking on a FIFO, regular files only.

Output, on stdout: "\\x1f\\n" once the cell is shipped; then cell_out_N's
whole lines as the runner appends them, never more than OUT_LIMIT + 1
bytes of it in all (one byte past the module's bound, so the module sees
it crossed); once cell_res_N.json is there, what is left of cell_out
(an unterminated tail too), then "\\x1e" and the result, refused when it
is larger than RES_LIMIT.  The relay's own words, each after "\\x1e":

    {"relay":"dead"}     not shipped: the kernel is gone, or is not ours
    {"relay":"full"}     not shipped: the disk is full, the kernel is fine
    {"relay":"failed","error":...}   not shipped, for another reason
    {"relay":"died"}     the kernel died during the cell
    {"relay":"unreadable","status":"error","error":...}   a file of the
                         cell is not a regular file, or too big

JSON text never holds a raw 0x1e or 0x1f, so the markers cannot be
confused with output.  The files are the truth: a relay that loses its
channel is started again with the offset reached.  A relay whose channel
is gone (sshd's session process, its parent, died with the connection)
exits at once rather than wait for output to fail on.
"""

import errno
import os
import stat
import sys
import time

CHUNK = 65536
READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
DIRS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

UNREADABLE_OUT = "reading the cell's output failed"
UNREADABLE_RES = "the kernel wrote an unreadable result"


class Unreadable(Exception):
    pass


def proc_start(pid):
    """The pid's start time in clock ticks; None if it is gone or a zombie."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def private(st, uid):
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == uid
            and stat.S_IMODE(st.st_mode) == 0o700)


class Kernel:
    """The kernel's process and directories, verified once."""

    def __init__(self, path, pid, start, ino):
        self.pid, self.start = pid, start
        self.dir = self.cells = None
        try:
            fd = os.open(path, DIRS)
        except OSError:
            return
        st = os.fstat(fd)
        # as root, the kernel is its directory's user (the spawn handed it
        # over); the inode says the directory is the kernel's
        self.uid = os.geteuid() or st.st_uid
        if st.st_ino != ino or not private(st, self.uid):
            os.close(fd)
            return
        try:
            cells = os.open("cells", DIRS, dir_fd=fd)
        except OSError:
            os.close(fd)
            return
        if not private(os.fstat(cells), self.uid):
            os.close(cells)
            os.close(fd)
            return
        self.dir, self.cells = fd, cells

    def ours(self):
        return self.dir is not None

    def alive(self):
        return proc_start(self.pid) == self.start

    def open(self, name):
        """A regular file of cells/, or None while there is none."""
        try:
            fd = os.open(name, READ, dir_fd=self.cells)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise Unreadable("%s: %s" % (name, e.strerror))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise Unreadable("%s is not a regular file" % name)
        return fd

    def exists(self, name):
        try:
            os.stat(name, dir_fd=self.cells, follow_symlinks=False)
        except OSError:
            return False
        return True


def word(out, w):
    import json  # only here: most relays never say a word of their own
    out.write(b"\x1e" + json.dumps(w, separators=(",", ":")).encode())
    out.flush()


def ship(k, cell, req, out):
    """Write the request as a new file, wake the runner; the relay's word
    when the cell was not shipped, else None."""
    if not k.ours() or not k.alive():
        return {"relay": "dead"}
    name = "cell_req_%06d.json" % cell
    tmp = name + ".tmp"
    try:
        # O_EXCL: a name already there (planted, or a link) is not ours
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=k.cells)
    except OSError as e:
        return {"relay": "failed", "error": "cells/%s: %s" % (tmp, e.strerror)}
    try:
        if k.uid != os.geteuid():     # root writes for the kernel's user
            os.fchown(fd, k.uid, -1)
        data = memoryview(req)
        while data:
            data = data[os.write(fd, data):]
    except OSError as e:
        os.close(fd)
        os.unlink(tmp, dir_fd=k.cells)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return {"relay": "full"}
        return {"relay": "failed", "error": "cells/%s: %s" % (tmp, e.strerror)}
    os.close(fd)
    try:
        os.rename(tmp, name, src_dir_fd=k.cells, dst_dir_fd=k.cells)
    except OSError as e:
        return {"relay": "failed", "error": "cells/%s: %s" % (name, e.strerror)}
    try:
        fd = os.open("wake", os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW
                     | os.O_CLOEXEC, dir_fd=k.dir)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.ENOENT):
            return {"relay": "dead"}
        return {"relay": "failed", "error": "wake: %s" % e.strerror}
    try:
        os.write(fd, b"\0")
    except BlockingIOError:
        pass  # a full FIFO already holds a wake-up
    except OSError as e:
        return {"relay": "failed", "error": "wake: %s" % e.strerror}
    finally:
        os.close(fd)
    out.write(b"\x1f\n")
    out.flush()
    return None


class Output:
    """cell_out from an offset: whole lines while the cell runs."""

    def __init__(self, offset, limit):
        self.offset = offset
        self.limit = limit + 1          # one past the module's bound
        self.fd = None
        self.clean = offset             # no newline in [offset, clean)

    def copy(self, out, whole):
        """Forward what there is; True when something was."""
        if self.fd is None:
            return False
        end = min(os.fstat(self.fd).st_size, self.limit)
        if end < self.clean:
            self.clean = self.offset    # cut back: look again
        if end <= self.offset:
            return False
        if whole:
            # up to the last newline: a line the runner is still writing,
            # or drops again when its write fails half-way, waits
            last, pos = -1, max(self.clean, self.offset)
            while pos < end:
                data = os.pread(self.fd, min(CHUNK, end - pos), pos)
                if not data:
                    break
                i = data.rfind(b"\n")
                if i >= 0:
                    last = pos + i + 1
                pos += len(data)
            self.clean = pos
            if last < 0:
                return False
            end = last
        start = self.offset
        while self.offset < end:
            data = os.pread(self.fd, min(CHUNK, end - self.offset), self.offset)
            if not data:
                break
            out.write(data)
            self.offset += len(data)
        return self.offset > start


def read_result(fd, limit):
    size = os.fstat(fd).st_size
    if size > limit:
        raise Unreadable("the result is %d bytes, more than %d" % (size, limit))
    parts, pos = [], 0
    while pos < size:
        data = os.pread(fd, size - pos, pos)
        if not data:
            break
        parts.append(data)
        pos += len(data)
    return b"".join(parts)


def relay(k, cell, o, res_limit, out):
    out_name = "cell_out_%06d" % cell
    res_name = "cell_res_%06d.json" % cell
    delay = 0.0005
    parent = os.getppid()
    while True:
        if o.fd is None:
            try:
                o.fd = k.open(out_name)
            except Unreadable:
                word(out, {"relay": "unreadable", "status": "error",
                           "error": UNREADABLE_OUT})
                return
        moved = o.copy(out, True)
        if moved:
            out.flush()
        try:
            res = k.open(res_name)
        except Unreadable:
            word(out, {"relay": "unreadable", "status": "error",
                       "error": UNREADABLE_RES})
            return
        if res is not None:
            # the runner closed cell_out before renaming the result into
            # place: what is left of it is final, a tail without newline too
            o.copy(out, False)
            try:
                data = read_result(res, res_limit)
            except Unreadable:
                word(out, {"relay": "unreadable", "status": "error",
                           "error": UNREADABLE_RES})
                return
            finally:
                os.close(res)
            out.write(b"\x1e" + data)
            out.flush()
            return
        if moved:
            delay = 0.0005
            continue
        if not k.alive():
            if k.exists(res_name):
                continue
            word(out, {"relay": "died"})
            return
        if os.getppid() != parent:
            return  # orphaned: no channel reads us; a resume starts anew
        # quick while output flows, backing off to 10 ms while the cell works
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def main(argv):
    path = argv[1]
    cell, pid, start, ino, out_limit, res_limit, offset = map(int, argv[2:9])
    out = sys.stdout.buffer
    os.umask(0o077)
    k = Kernel(path, pid, start, ino)
    try:
        if offset < 0:
            req = sys.stdin.buffer.read()
            w = ship(k, cell, req, out)
            if w is not None:
                word(out, w)
                return 0
            offset = 0
        elif not k.ours():
            # the directory went, or is another: the kernel is gone
            word(out, {"relay": "died"})
            return 0
        relay(k, cell, Output(offset, out_limit), res_limit, out)
    except BrokenPipeError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
