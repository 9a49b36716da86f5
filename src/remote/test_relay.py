"""Tests for hermes_relay.py, run as the ssh backend runs it: the loader
from ngx_hermes_backend_ssh.c on the command line, the relay's text and the
cell request on stdin.  One clean channel, a resumed one, one that goes
away, and a cell or co-tenant that plants things in the kernel dir.

    cd src/remote && /usr/bin/python3 -m unittest -v test_relay
"""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from test_remote import HERE, Kernel, PYTHON, _wait_for

RELAY = os.path.join(HERE, "hermes_relay.py")
OUT_LIMIT = 6 * 65536 + 65536
RES_LIMIT = 6 * 65536 + 65536


def _loader():
    """The loader as the module sends it (so the two cannot drift)."""
    with open(os.path.join(HERE, "..", "ngx_hermes_backend_ssh.c")) as f:
        c = f.read()
    m = re.search(r"#define NGX_HTTP_HERMES_SSH_LOADER\s*\\\n((?:\s*\".*\"\s*\\?\n)+)", c)
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))
    return "".join(parts).replace('\\"', '"')


LOADER = _loader()


def _start(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def _exited(pid):
    """Gone, or a zombie its new parent has not reaped."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _stdin(req=b""):
    with open(RELAY, "rb") as f:
        src = f.read()
    return b"%d\n" % len(src) + src + req


def argv(k, n, offset, start=None, ino=None, out_limit=OUT_LIMIT,
         res_limit=RES_LIMIT, path=None):
    return [PYTHON, "-I", "-c", LOADER, path or k.dir, str(n), str(k.pid),
            str(_start(k.pid) if start is None else start),
            str(os.stat(k.dir).st_ino if ino is None else ino),
            str(out_limit), str(res_limit), str(offset)]


def relay(k, n, offset, req=b"", **kw):
    return subprocess.run(argv(k, n, offset, **kw), input=_stdin(req),
                          capture_output=True, timeout=20, cwd="/")


def request(n, code):
    return json.dumps({"id": n, "code": code}).encode()


class RelayTest(unittest.TestCase):

    def kernel(self, **kw):
        k = Kernel(**kw)
        self.addCleanup(k.close)
        self.assertTrue(k.ready, "no ready file; runner.log: " + k.log())
        return k

    def test_loader_is_quoted_for_the_shell(self):
        self.assertNotIn("'", LOADER)
        self.assertIn("hermes_relay.py", LOADER)

    def test_ship_stream_result(self):
        k = self.kernel()
        p = relay(k, 1, -1, request(1, "import time\nprint('a', flush=True)\n"
                                       "time.sleep(0.3)\nprint('b')"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith(b"\x1f\n"), p.stdout[:20])
        body, _, res = p.stdout[2:].partition(b"\x1e")
        lines = [json.loads(x) for x in body.splitlines()]
        self.assertEqual("".join(e["text"] for e in lines), "a\nb\n")
        self.assertEqual(json.loads(res)["status"], "success")
        with open(k.res_path(1), "rb") as f:
            self.assertEqual(res, f.read(), "the result is the file, whole")
        self.assertEqual(os.stat(k.path("cells", "cell_req_000001.json")).st_mode & 0o777,
                         0o600)

    def test_nothing_runs_from_the_kernel_dir(self):
        k = self.kernel()
        mark = k.path("ran")
        with open(k.path("hermes_relay.py"), "w") as f:
            f.write("open(%r, 'w').write('ran')\n" % mark)
        p = relay(k, 1, -1, request(1, "print(1)"))
        self.assertTrue(p.stdout.startswith(b"\x1f\n"), p.stdout + p.stderr)
        self.assertFalse(os.path.exists(mark))

    def test_resume_from_offset(self):
        k = self.kernel()
        k.run("print('x' * 10)\nprint('y' * 10)")
        with open(k.path("cells", "cell_out_000001"), "rb") as f:
            first = f.readline()
        p = relay(k, 1, len(first))
        body, _, res = p.stdout.partition(b"\x1e")
        self.assertFalse(body.startswith(b"\x1f"), "a resume ships nothing")
        self.assertEqual(json.loads(body)["text"], "y" * 10 + "\n")
        self.assertEqual(json.loads(res)["status"], "success")

    def test_dead_kernel(self):
        k = self.kernel()
        start = _start(k.pid)
        k.proc.kill()
        k.proc.wait()
        p = relay(k, 1, -1, request(1, "1"), start=start)
        self.assertEqual(p.stdout, b'\x1e{"relay":"dead"}')
        self.assertFalse(os.path.exists(k.path("cells", "cell_req_000001.json")),
                         "nothing shipped to a dead kernel")

    def test_a_pid_started_at_another_time_is_not_the_kernel(self):
        k = self.kernel()
        p = relay(k, 1, -1, request(1, "1"), start=_start(k.pid) + 1)
        self.assertEqual(p.stdout, b'\x1e{"relay":"dead"}')
        self.assertFalse(os.path.exists(k.path("cells", "cell_req_000001.json")))

    def test_a_directory_made_again_is_not_the_kernels(self):
        k = self.kernel()
        ino = os.stat(k.dir).st_ino
        os.rename(k.dir, k.dir + ".old")
        self.addCleanup(shutil.rmtree, k.dir + ".old", True)
        for d in ("", "cells", "rpc"):
            os.mkdir(os.path.join(k.dir, d), 0o700)
        os.mkfifo(k.path("wake"), 0o600)
        holder = os.open(k.path("wake"), os.O_RDWR)
        self.addCleanup(os.close, holder)
        p = relay(k, 1, -1, request(1, "1"), ino=ino)
        self.assertEqual(p.stdout, b'\x1e{"relay":"dead"}')
        self.assertEqual(os.listdir(k.path("cells")), [])

    def test_a_directory_others_may_enter_is_not_the_kernels(self):
        for path, mode in (("", 0o755), ("cells", 0o770)):
            k = self.kernel()
            os.chmod(k.path(path), mode)
            p = relay(k, 1, -1, request(1, "1"))
            self.assertEqual(p.stdout, b'\x1e{"relay":"dead"}', path)
            os.chmod(k.path(path), 0o700)

    def test_a_symlink_to_the_directory_is_not_followed(self):
        k = self.kernel()
        link = k.dir + ".link"
        os.symlink(k.dir, link)
        self.addCleanup(os.unlink, link)
        p = relay(k, 1, -1, request(1, "1"), path=link)
        self.assertEqual(p.stdout, b'\x1e{"relay":"dead"}')

    def test_a_resume_in_a_directory_made_again_is_died(self):
        k = self.kernel()
        k.run("print(1)")
        p = relay(k, 1, 0, ino=os.stat(k.dir).st_ino + 1)
        self.assertEqual(p.stdout, b'\x1e{"relay":"died"}')

    def test_kernel_dies_mid_cell(self):
        k = self.kernel()
        p = relay(k, 1, -1, request(1, "import os, signal, time\n"
                                       "print('bye', flush=True)\ntime.sleep(0.2)\n"
                                       "os.kill(os.getpid(), signal.SIGKILL)"))
        self.assertTrue(p.stdout.endswith(b'\x1e{"relay":"died"}'), p.stdout[-40:])
        self.assertIn(b'"bye\\n"', p.stdout)

    def test_planted_request_tmp_is_never_written(self):
        for kind in ("file", "hardlink", "symlink", "fifo", "dir"):
            k = self.kernel()
            target = k.path("target")
            with open(target, "w") as f:
                f.write("keep\n")
            tmp = k.path("cells", "cell_req_000001.json.tmp")
            if kind == "file":
                open(tmp, "w").close()
            elif kind == "hardlink":
                os.link(target, tmp)
            elif kind == "symlink":
                os.symlink(target, tmp)
            elif kind == "fifo":
                os.mkfifo(tmp, 0o600)
            else:
                os.mkdir(tmp, 0o700)
            p = relay(k, 1, -1, request(1, "print(1)"))
            self.assertTrue(p.stdout.startswith(b'\x1e{"relay":"failed","error":'),
                            (kind, p.stdout, p.stderr))
            with open(target) as f:
                self.assertEqual(f.read(), "keep\n", kind)
            self.assertFalse(os.path.exists(k.path("cells", "cell_req_000001.json")))

    def test_result_that_is_a_fifo_or_too_big_is_refused(self):
        for kind in ("fifo", "big", "symlink"):
            k = self.kernel()
            code = ("import os, time\n"
                    "res = 'cells/cell_res_000001.json'\n")
            if kind == "fifo":
                code += "os.mkfifo('cells/x', 0o600)\n"
            elif kind == "big":
                code += "open('cells/x', 'w').write('{\"id\":1,\"status\":\"success\",\"output\":\"%s\"}')\n" % ("y" * RES_LIMIT)
            else:
                code += "os.symlink('/dev/zero', 'cells/x')\n"
            code += "os.rename('cells/x', res)\ntime.sleep(3)\n"
            t0 = time.monotonic()
            p = relay(k, 1, -1, request(1, code))
            self.assertLess(time.monotonic() - t0, 2.5, kind)
            body, _, w = p.stdout.partition(b"\x1e")
            self.assertEqual(json.loads(w), {
                "relay": "unreadable", "status": "error",
                "error": "the kernel wrote an unreadable result"}, kind)

    def test_output_that_is_a_fifo_is_refused(self):
        k = self.kernel()
        # the next cell's output, planted before the relay looks for it
        os.mkfifo(k.path("cells", "cell_out_000001"), 0o600)
        p = subprocess.Popen(argv(k, 1, 0), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, cwd="/")
        out, _ = p.communicate(_stdin(), timeout=5)
        self.assertEqual(json.loads(out.partition(b"\x1e")[2])["error"],
                         "reading the cell's output failed")

    def test_whole_lines_while_the_cell_runs_the_tail_at_the_end(self):
        k = self.kernel()
        code = ("import os, time\n"
                "print('one', flush=True)\n"
                "f = os.open('cells/cell_out_000001', os.O_WRONLY | os.O_APPEND)\n"
                "size = os.fstat(f).st_size\n"
                "os.write(f, b'{\"type\":\"stdout\",\"text\":\"HA')\n"
                "time.sleep(0.3)\n"
                "os.ftruncate(f, size)\n"           # as the runner on ENOSPC
                "print('two', flush=True)\n"
                "os.write(f, b'TAIL')\n"
                "os.close(f)\n")
        p = relay(k, 1, -1, request(1, code))
        body, _, res = p.stdout[2:].partition(b"\x1e")
        self.assertNotIn(b"HA", body)
        lines = body.split(b"\n")
        self.assertEqual([json.loads(x)["text"] for x in lines[:-1]], ["one\n", "two\n"])
        self.assertEqual(lines[-1], b"TAIL", "the unterminated tail, at the result")
        self.assertEqual(json.loads(res)["status"], "success")

    def test_output_is_read_to_one_byte_past_the_bound(self):
        k = self.kernel()
        code = ("import os\nprint('before', flush=True)\n"
                "os.truncate('cells/cell_out_000001', 300 * 2**20)\n")
        p = relay(k, 1, -1, request(1, code), out_limit=100000)
        body, _, res = p.stdout[2:].partition(b"\x1e")
        self.assertEqual(len(body), 100001)
        self.assertEqual(json.loads(res)["status"], "success")


class RelayOutageTest(unittest.TestCase):

    def test_orphaned_relay_exits(self):
        # sshd's session process dies with the connection; the relay it ran
        # must not poll a quiet cell until the cell ends
        k = Kernel()
        self.addCleanup(k.close)
        n = k.send("import time\nprint('start', flush=True)\ntime.sleep(30)")
        self.assertTrue(_wait_for(lambda: os.path.exists(
            k.path("cells", "cell_out_%06d" % n))), "the cell started")
        out = k.path("relay.out")
        inp = k.path("relay.in")
        with open(inp, "wb") as f:
            f.write(_stdin())
        sh = subprocess.Popen(
            ["sh", "-c", "\"$@\" >'%s' <'%s' & echo $!; wait" % (out, inp), "sh"]
            + argv(k, n, 0), stdout=subprocess.PIPE)
        self.addCleanup(sh.wait)
        self.addCleanup(sh.stdout.close)
        relay_pid = int(sh.stdout.readline())
        self.addCleanup(lambda: _exited(relay_pid) or os.kill(relay_pid, signal.SIGKILL))
        self.assertTrue(_wait_for(lambda: os.path.exists(out)
                                  and os.path.getsize(out) > 0),
                        "the relay streams the cell")
        time.sleep(0.2)
        self.assertFalse(_exited(relay_pid), "the relay waits for the quiet cell")
        sh.kill()
        self.assertTrue(_wait_for(lambda: _exited(relay_pid), timeout=2.0),
                        "the relay exits once its parent is gone")
        self.assertTrue(k.alive(), "the kernel runs on")
        with open(out, "rb") as f:
            self.assertIn(b'"start\\n"', f.read())


class RelayDiskFullTest(unittest.TestCase):
    """The kernel dir on a small tmpfs, filled up before the cell ships."""

    def test_full_disk_is_said_and_nothing_is_left(self):
        mnt = tempfile.mkdtemp(prefix="hermes_rrfull_")
        self.addCleanup(os.rmdir, mnt)
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700",
                            "tmpfs", mnt], capture_output=True)
        if p.returncode != 0:
            self.skipTest("cannot mount a tmpfs to fill (needs root)")
        self.addCleanup(subprocess.run, ["umount", "-l", mnt])
        k = Kernel(root=mnt)
        self.addCleanup(k.close)
        self.assertTrue(k.ready)
        fd = os.open(os.path.join(mnt, "fill"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, bytes(65536))
        except OSError as e:
            self.assertEqual(e.errno, errno.ENOSPC)
        finally:
            os.close(fd)
        p = relay(k, 2, -1, request(2, "print(1)"))
        self.assertEqual(p.stdout, b'\x1e{"relay":"full"}', p.stderr)
        self.assertFalse([x for x in os.listdir(k.path("cells")) if "req_000002" in x])
        self.assertTrue(k.alive())


if __name__ == "__main__":
    unittest.main()
