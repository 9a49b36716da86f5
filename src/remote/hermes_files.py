# SPDX-License-Identifier: BSD-2-Clause
"""Moves a file, or a piece of one, into or out of a kernel's directory.

The module runs it from its own copy (never from the kernel directory, which
a cell may rewrite), on either backend, as many times as the backend's
bound on one command's input and output takes (the ssh agent's frames):

    python3 -I -c 'LOADER' get DIR PATH UID MAX OFFSET COUNT
    python3 -I -c 'LOADER' put DIR PATH UID MAX OFFSET TOTAL NONCE
    python3 -I -c 'LOADER' abort DIR PATH UID MAX NONCE

with on stdin the length of this text, a newline, this text and, for put,
the piece's bytes.  PATH is relative to DIR, the kernel's directory: every
component is opened relative to the one before, without following a
symlink (a symlink anywhere on the way is refused, as is "..", an absolute
path or an empty component).

get opens without blocking (a FIFO there is refused) and reads a regular
file only: it prints "SIZE:INODE:MTIME_NS", a newline, then the bytes from
OFFSET, COUNT at most; the module reads piece after piece and refuses a
file whose line changed between them.  put writes NAME.NONCE.tmp (0600,
made exclusively by the piece at OFFSET 0, appended to by the next ones
only at its end) in the last directory, and renames it into place with
the piece that reaches TOTAL; missing directories on the way are made
0700.  abort removes what a put that failed half way left.  UID: the
kernel's user, who is given what put makes (when we are root); -1 leaves
it ours.  MAX bounds the file.

Exit codes: 0 done, 2 no such file, 3 over MAX, 4 refused (a symlink, a
FIFO, a directory, a bad path), 5 any other error; a line on stderr says
why.
"""

import errno
import os
import stat
import sys

DIRS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20


class Refused(Exception):
    pass


def components(path):
    if not path or path.startswith("/") or "\0" in path:
        raise Refused("not a relative path")
    parts = path.split("/")
    for p in parts:
        if p in ("", ".", ".."):
            raise Refused("an empty, . or .. component")
    return parts


def walk(root, parts, make, uid):
    """The directory fd holding the last component, opened one by one."""
    fd = os.open(root, DIRS)
    for p in parts[:-1]:
        try:
            nfd = os.open(p, DIRS, dir_fd=fd)
        except FileNotFoundError:
            if not make:
                os.close(fd)
                raise
            os.mkdir(p, 0o700, dir_fd=fd)
            nfd = os.open(p, DIRS, dir_fd=fd)
            if uid >= 0:
                os.fchown(nfd, uid, -1)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused("%s: not a directory (or a symlink)" % p)
            raise
        os.close(fd)
        fd = nfd
    return fd


def temp_name(name, nonce):
    if len(nonce) != 16 or any(c not in "0123456789abcdef" for c in nonce):
        raise Refused("a bad nonce")
    return "%s.%s.tmp" % (name, nonce)


def put(root, parts, uid, limit, src, offset, total, nonce):
    if offset < 0 or total < offset:
        raise Refused("a bad piece")
    if total > limit:
        return 3
    fd = walk(root, parts, offset == 0, uid)
    name = parts[-1]
    tmp = temp_name(name, nonce)
    try:
        if offset == 0:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    raise Refused("%s: not a regular file" % name)
            except FileNotFoundError:
                pass
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                          | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        else:
            out = os.open(tmp, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW
                          | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        try:
            st = os.fstat(out)
            if not stat.S_ISREG(st.st_mode) or st.st_size != offset:
                raise Refused("%s: not the piece before" % tmp)
            size = offset
            while True:
                b = src.read(CHUNK)
                if not b:
                    break
                size += len(b)
                if size > total:
                    os.unlink(tmp, dir_fd=fd)
                    return 3
                os.write(out, b)
            if size == total and uid >= 0:
                os.fchown(out, uid, -1)
        finally:
            os.close(out)
        if size == total:
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        return 0
    finally:
        os.close(fd)


def abort(root, parts, nonce):
    fd = walk(root, parts, False, -1)
    try:
        os.unlink(temp_name(parts[-1], nonce), dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)
    return 0


def get(root, parts, limit, dst, offset, count):
    fd = walk(root, parts, False, -1)
    try:
        try:
            f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                        | os.O_CLOEXEC, dir_fd=fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EISDIR):
                raise Refused("%s: not a regular file" % parts[-1])
            raise
        try:
            st = os.fstat(f)
            if not stat.S_ISREG(st.st_mode):
                raise Refused("%s: not a regular file" % parts[-1])
            if st.st_size > limit:
                return 3
            dst.write(b"%d:%d:%d\n" % (st.st_size, st.st_ino, st.st_mtime_ns))
            left = max(0, min(count, st.st_size - offset))
            while left:
                b = os.pread(f, min(CHUNK, left), offset)
                if not b:
                    break       # cut while read: the module sees it short
                left -= len(b)
                offset += len(b)
                dst.write(b)
            return 0
        finally:
            os.close(f)
    finally:
        os.close(fd)


def main(argv, src, dst):
    try:
        op, root, path, uid, limit = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
        parts = components(path)
        if op == "put" and len(argv) == 8:
            return put(root, parts, uid, limit, src, int(argv[5]),
                       int(argv[6]), argv[7])
        if op == "get" and len(argv) == 7:
            return get(root, parts, limit, dst, int(argv[5]), int(argv[6]))
        if op == "abort" and len(argv) == 6:
            return abort(root, parts, argv[5])
        raise Refused("unknown operation")
    except Refused as e:
        sys.stderr.write("refused: %s\n" % e)
        return 4
    except FileNotFoundError:
        return 2
    except (OSError, ValueError, IndexError) as e:
        sys.stderr.write("failed: %s\n" % e)
        return 5


if __name__ == "__main__":
    _rc = main(sys.argv[1:], sys.stdin.buffer, sys.stdout.buffer)
    sys.stdout.flush()
    sys.exit(_rc)
