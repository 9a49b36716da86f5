"""Moves one file into or out of a kernel's working directory.

The module runs it from its own copy (never from the kernel directory, which
a cell may rewrite), on either backend:

    python3 -I -c 'LOADER' put|get DIR PATH UID MAX

with on stdin the length of this text, a newline, this text and, for put,
the file's bytes.  PATH is relative to DIR, the kernel's directory: every
component is opened relative to the one before, without following a
symlink (a symlink anywhere on the way is refused, as is "..", an absolute
path or an empty component); get opens without blocking (a FIFO there is
refused) and reads a regular file only.  put writes NAME.tmp (0600, made
exclusively) in the last directory and renames it into place; missing
directories on the way are made 0700.  UID: the kernel's user, who is
given what put makes (when we are root); -1 leaves it ours.  MAX bounds
the bytes moved.

Exit codes: 0 done (get: the bytes on stdout), 2 no such file, 3 over MAX,
4 refused (a symlink, a FIFO, a directory, a bad path), 5 any other error;
a line on stderr says why.
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


def put(root, parts, uid, limit, src):
    fd = walk(root, parts, True, uid)
    name = parts[-1]
    tmp = name + ".tmp"
    try:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise Refused("%s: not a regular file" % name)
        except FileNotFoundError:
            pass
        try:
            os.unlink(tmp, dir_fd=fd)
        except FileNotFoundError:
            pass
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                      | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            total = 0
            while True:
                b = src.read(CHUNK)
                if not b:
                    break
                total += len(b)
                if total > limit:
                    os.unlink(tmp, dir_fd=fd)
                    return 3
                os.write(out, b)
            if uid >= 0:
                os.fchown(out, uid, -1)
        finally:
            os.close(out)
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        return 0
    finally:
        os.close(fd)


def get(root, parts, limit, dst):
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
            left = limit + 1
            while left:
                b = os.read(f, min(CHUNK, left))
                if not b:
                    break
                left -= len(b)
                dst.write(b)
            if left == 0:
                return 3        # it grew while read
            return 0
        finally:
            os.close(f)
    finally:
        os.close(fd)


def main(argv, src, dst):
    try:
        op, root, path, uid, limit = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
        parts = components(path)
        if op == "put":
            return put(root, parts, uid, limit, src)
        if op == "get":
            return get(root, parts, limit, dst)
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
