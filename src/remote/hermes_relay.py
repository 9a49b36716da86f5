"""Relays one cell between the ssh backend and its kernel, over one channel.

    python3 hermes_relay.py ID PID -1        ship the cell on stdin, then relay
    python3 hermes_relay.py ID PID OFFSET    resume relaying from OFFSET

Output, on stdout: "\\x1f\\n" once the cell is shipped, then the bytes of
cells/cell_out_ID as the runner appends them, then "\\x1e" and the contents
of cells/cell_res_ID.json.  When the kernel is gone before the cell was
shipped the output is "\\x1e" {"relay": "dead"}; when it dies during the
cell, "\\x1e" {"relay": "died"}.  JSON text never holds a raw 0x1e or 0x1f,
so the markers cannot be confused with output.  The files are the truth:
a relay that loses its channel is started again with the offset reached.
A relay whose channel is gone (sshd's session process, its parent, died
with the connection) exits at once rather than wait for output to fail on.
"""

import errno
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CELLS = os.path.join(HERE, "cells")
CHUNK = 65536


def alive(pid):
    """The kernel runs; a zombie (its parent may reap late) does not."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_file(path, data):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        if os.geteuid() == 0:     # the kernel runs as the directory's owner
            st = os.stat(HERE)
            os.fchown(fd, st.st_uid, st.st_gid)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def ship(cell, pid, req, out):
    """Write the request, wake the runner; False when the kernel is gone."""
    if not alive(pid):
        return False
    write_file(os.path.join(CELLS, "cell_req_%06d.json" % cell), req)
    try:
        fd = os.open(os.path.join(HERE, "wake"), os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.ENOENT):
            return False
        raise
    try:
        os.write(fd, b"\0")
    except BlockingIOError:
        pass  # a full FIFO already holds a wake-up
    finally:
        os.close(fd)
    out.write(b"\x1f\n")
    out.flush()
    return True


def drain(fd, offset, out):
    """Copy cell_out from offset to its current end; the new offset."""
    while fd is not None:
        data = os.pread(fd, CHUNK, offset)
        if not data:
            break
        out.write(data)
        offset += len(data)
    return offset


def relay(cell, pid, offset, out):
    out_path = os.path.join(CELLS, "cell_out_%06d" % cell)
    res_path = os.path.join(CELLS, "cell_res_%06d.json" % cell)
    fd = None
    delay = 0.0005
    parent = os.getppid()
    while True:
        if fd is None:
            try:
                fd = os.open(out_path, os.O_RDONLY)
            except FileNotFoundError:
                pass
        start = offset
        offset = drain(fd, offset, out)
        moved = offset > start
        if moved:
            out.flush()
        if os.path.exists(res_path):
            # the runner closed cell_out before renaming the result into place
            offset = drain(fd, offset, out)
            with open(res_path, "rb") as f:
                res = f.read()
            out.write(b"\x1e" + res)
            out.flush()
            return
        if moved:
            delay = 0.0005
            continue
        if not alive(pid):
            if os.path.exists(res_path):
                continue
            out.write(b'\x1e{"relay":"died"}')
            out.flush()
            return
        if os.getppid() != parent:
            return  # orphaned: no channel reads us; a resume starts anew
        # quick while output flows, backing off to 10 ms while the cell works
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def main():
    cell, pid, offset = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    out = sys.stdout.buffer
    os.umask(0o077)
    if offset < 0:
        req = sys.stdin.buffer.read()
        if not ship(cell, pid, req, out):
            out.write(b'\x1e{"relay":"dead"}')
            out.flush()
            return 0
        offset = 0
    try:
        relay(cell, pid, offset, out)
    except BrokenPipeError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
