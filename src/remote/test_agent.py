# SPDX-License-Identifier: BSD-2-Clause
"""Tests for hermes_agent.py, run as the module runs it: a loader on the
command line, the agent's text then frames on stdin, frames on stdout,
against real kernel dirs with real runners (test_remote.Kernel).

    cd src/remote && /usr/bin/python3 -m unittest -v test_agent
"""

import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import tempfile
import threading
import time
import unittest

from test_remote import HERE, Kernel, PYTHON, _wait_for

AGENT = os.path.join(HERE, "hermes_agent.py")
# the agent's python: any python3 >= 3.9 a kernel host may have (3.8: the
# fallbacks); the runners keep PYTHON
AGENT_PYTHON = os.environ.get("HERMES_AGENT_PYTHON", PYTHON)
LOADER = ('import sys;i=sys.stdin.buffer;'
          'exec(compile(i.read(int(i.readline())),"hermes_agent.py","exec"))')
MAGIC = b"\0HERMES-AGENT-1\n"
OUT_LIMIT = 6 * 65536 + 65536
RES_LIMIT = 6 * 65536 + 65536
HEADER = struct.Struct(">IIB")


def frame(sid, typ, payload=b""):
    return HEADER.pack(len(payload), sid, ord(typ)) + payload


def jb(obj, data=b""):
    j = json.dumps(obj).encode()
    return struct.pack(">I", len(j)) + j + data


def unjb(payload):
    n = struct.unpack_from(">I", payload)[0]
    return json.loads(payload[4:4 + n]), payload[4 + n:]


def _start(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def _exited(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _proc(pid):
    """(utime + stime in ticks, voluntary context switches) of pid."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open("/proc/%d/status" % pid) as f:
        sw = [int(line.split()[1]) for line in f
              if line.startswith("voluntary_ctxt_switches")][0]
    return int(fields[11]) + int(fields[12]), sw


def request(n, code):
    return json.dumps({"id": n, "code": code}).encode()


class Agent:
    """An agent process and a thread that reads its frames."""

    def __init__(self, first=b"", shell=None, autoack=True, reader=True,
                 prelude=b""):
        with open(AGENT, "rb") as f:
            src = prelude + f.read()
        self.err = tempfile.TemporaryFile()
        argv = [AGENT_PYTHON, "-I", "-c", LOADER]
        if shell is not None:       # a login shell's rc, printing junk
            argv = ["sh", "-c", shell + "; exec \"$@\"", "sh"] + argv
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.err,
                                  cwd="/")
        self.pid = self.p.pid
        self.wlock = threading.Lock()
        self.cv = threading.Condition()
        self.frames = []
        self.eof = False
        self.autoack = autoack
        # the text and the first frames in one write: the loader's buffered
        # reader takes some frames with the text
        self.write(b"%d\n" % len(src) + src + first)
        self.junk = b""
        while not self.junk.endswith(MAGIC):
            b = self.p.stdout.read(1)
            if not b:
                raise AssertionError("no magic; stderr: %s" % self.stderr())
            self.junk += b
        self.junk = self.junk[:-len(MAGIC)]
        self.thread = threading.Thread(target=self._read, daemon=True)
        if reader:
            self.thread.start()

    def write(self, data):
        with self.wlock:
            self.p.stdin.write(data)
            self.p.stdin.flush()

    def send(self, sid, typ, payload=b""):
        self.write(frame(sid, typ, payload))

    def _read(self):
        f = self.p.stdout
        while True:
            h = f.read(HEADER.size)
            if len(h) < HEADER.size:
                break
            n, sid, typ = HEADER.unpack(h)
            payload = f.read(n)
            if len(payload) < n:
                break
            typ = chr(typ)
            if typ == "O" and self.autoack:
                off = struct.unpack_from(">Q", payload)[0] + n - 8
                try:
                    self.send(sid, "A", struct.pack(">Q", off))
                except (OSError, ValueError):
                    pass
            with self.cv:
                self.frames.append((sid, typ, payload))
                self.cv.notify_all()
        with self.cv:
            self.eof = True
            self.cv.notify_all()

    def wait(self, pred, timeout=10.0):
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                v = pred()
                if v or self.eof:
                    return v
                left = end - time.monotonic()
                if left <= 0:
                    return v
                self.cv.wait(left)

    def of(self, sid):
        with self.cv:
            return [(t, p) for s, t, p in self.frames if s == sid]

    def end(self, sid, timeout=10.0):
        """The stream's frames once its R or x came."""
        ok = self.wait(lambda: any(t in "Rx" for t, _ in self.of(sid)), timeout)
        if not ok:
            raise AssertionError("stream %d did not end: %r; stderr: %s"
                                 % (sid, self.of(sid)[-3:], self.stderr()))
        return self.of(sid)

    def cell(self, sid, k, n, offset=-1, code=None, **kw):
        self.write(self.cell_frame(sid, k, n, offset, code, **kw))

    @staticmethod
    def cell_frame(sid, k, n, offset=-1, code=None, window=1 << 20,
                   out_limit=OUT_LIMIT, res_limit=RES_LIMIT, **kw):
        req = {"dir": kw.get("path", k.dir), "cell": n, "pid": k.pid,
               "start": kw.get("start", _start(k.pid)),
               "ino": kw.get("ino", os.stat(k.dir).st_ino),
               "uid": kw.get("uid", os.geteuid()), "offset": offset,
               "out_limit": out_limit, "res_limit": res_limit,
               "window": window}
        body = request(n, code) if offset < 0 else b""
        return frame(sid, "C", jb(req, body))

    def exec_(self, sid, cmd, timeout=5000, out_max=1 << 20, stdin=b""):
        self.send(sid, "X", jb({"cmd": cmd, "timeout": timeout,
                                "out_max": out_max}, stdin))

    def ready(self, sid, path, pid, timeout=5000):
        self.send(sid, "W", jb({"dir": path, "pid": pid, "timeout": timeout}))

    def ping(self, sid=77):
        before = len(self.of(sid))
        self.send(sid, "P")
        return self.wait(lambda: len(self.of(sid)) > before, 5.0)

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        if self.thread.is_alive():
            self.thread.join(5)
        if not self.p.stdout.closed:
            self.p.stdout.close()
        self.err.close()


def out_bytes(frames, offset=0):
    """The OUT frames' bytes, checked to follow each other from offset."""
    data = b""
    for t, p in frames:
        if t == "O":
            off = struct.unpack_from(">Q", p)[0]
            assert off == offset + len(data), (off, offset + len(data))
            data += p[8:]
    return data


def result(frames):
    rs = [p for t, p in frames if t == "R"]
    assert len(rs) == 1, rs
    assert frames[-1][0] == "R", "R ends the stream"
    return rs[0]


class AgentTest(unittest.TestCase):

    def agent(self, **kw):
        a = Agent(**kw)
        self.addCleanup(a.close)
        return a

    def kernel(self):
        k = Kernel()
        self.addCleanup(k.close)
        self.assertTrue(k.ready, "no ready file; runner.log: " + k.log())
        return k

    def file(self, k, name):
        with open(k.path("cells", name), "rb") as f:
            return f.read()

    # -- the connection ---------------------------------------------------

    def test_magic_first_then_hello_then_frames_that_came_with_the_text(self):
        a = self.agent(first=frame(3, "P") + frame(4, "P"))
        self.assertEqual(a.junk, b"", "the agent's first bytes are the magic")
        a.wait(lambda: len(a.frames) >= 3)
        sid, t, p = a.frames[0]
        self.assertEqual((sid, t), (0, "H"))
        hello = json.loads(p)
        self.assertEqual(hello["v"], 1)
        self.assertEqual(hello["pid"], a.pid)
        self.assertEqual(hello["uid"], os.geteuid())
        self.assertTrue(hello["inotify"])
        self.assertRegex(hello["python"], r"^3\.\d+\.\d+$")
        self.assertEqual(a.frames[1:3], [(3, "p", b""), (4, "p", b"")])

    def test_junk_from_the_shell_rc_comes_before_the_magic(self):
        a = self.agent(shell="echo 'Welcome!'; printf '\\0\\033[0m'")
        self.assertEqual(a.junk, b"Welcome!\n\0\033[0m")
        self.assertEqual(a.wait(lambda: a.frames)[0][:2], (0, "H"))

    def test_a_frame_in_pieces_is_whole_before_it_counts(self):
        a = self.agent()
        data = frame(9, "Z", b"unknown type: ignored") + frame(8, "P")
        for i in range(len(data)):
            a.write(data[i:i + 1])
            time.sleep(0.002)
        self.assertTrue(a.wait(lambda: a.of(8)))
        self.assertEqual(a.of(8), [("p", b"")])
        self.assertEqual(a.of(9), [])

    def test_stdin_eof_ends_the_agent_and_its_commands(self):
        a = self.agent()
        mark = os.path.join(tempfile.mkdtemp(prefix="hermes_ragent_"), "pid")
        self.addCleanup(os.rmdir, os.path.dirname(mark))
        self.addCleanup(os.unlink, mark)
        a.exec_(1, "sleep 30 & echo $! >%s; wait" % mark, timeout=60000)
        self.assertTrue(_wait_for(lambda: os.path.exists(mark)
                                  and os.path.getsize(mark)))
        a.p.stdin.close()
        self.assertEqual(a.p.wait(5), 0)
        self.assertEqual(a.of(1), [], "nothing answered")
        with open(mark) as f:
            pid = int(f.read())
        self.assertTrue(_wait_for(lambda: _exited(pid)),
                        "its commands' process groups are killed")

    def test_a_broken_stdout_ends_the_agent(self):
        a = self.agent(reader=False)
        mark = os.path.join(tempfile.mkdtemp(prefix="hermes_ragent_"), "pid")
        self.addCleanup(os.rmdir, os.path.dirname(mark))
        self.addCleanup(os.unlink, mark)
        a.exec_(1, "sleep 30 & echo $! >%s; wait" % mark, timeout=60000)
        self.assertTrue(_wait_for(lambda: os.path.exists(mark)
                                  and os.path.getsize(mark)))
        a.p.stdout.close()          # the connection broke: nobody reads
        self.assertEqual(a.p.wait(5), 0, "the agent left at once, idle")
        with open(mark) as f:
            pid = int(f.read())
        self.assertTrue(_wait_for(lambda: _exited(pid)),
                        "its commands' process groups are killed")

    def test_a_frame_too_long_closes_the_connection(self):
        a = self.agent()
        a.write(HEADER.pack((1 << 20) + 65, 1, ord("P")))
        self.assertEqual(a.p.wait(5), 0)
        self.assertIn("frame", a.stderr())

    def test_bad_requests_are_answered_and_the_agent_goes_on(self):
        a = self.agent()
        k = self.kernel()
        good = {"dir": k.dir, "cell": 1, "pid": k.pid, "start": _start(k.pid),
                "ino": os.stat(k.dir).st_ino, "uid": os.geteuid(),
                "offset": -1, "out_limit": 100, "res_limit": 100}
        bad = [b"", b"\0\0\0\x09{}", b"\0\0\0\x02[]", b"\0\0\0\x03{x}"]
        for key, v in (("dir", k.dir + "\0x"), ("pid", 1 << 40), ("pid", "1"),
                       ("uid", 1 << 40), ("offset", -2), ("cell", 1.0),
                       ("ino", -1), ("window", 0), ("start", None)):
            bad.append(jb(dict(good, **{key: v}), request(1, "1")))
        for i, p in enumerate(bad):
            a.send(i + 1, "C", p)
            w = json.loads(result(a.end(i + 1)))
            self.assertEqual(w["relay"], "failed", i)
            self.assertTrue(w["error"].startswith("bad CELL: "), w)
        for i, req in enumerate(({"cmd": "true\0"}, {"cmd": "true", "timeout": 1 << 60},
                                 {"cmd": ["true"], "timeout": 1}, {"timeout": 9})):
            a.send(100 + i, "X", jb(req))
            st, _ = unjb(a.end(100 + i)[0][1])
            self.assertEqual(st["status"], -1)
            self.assertTrue(st["error"].startswith("bad EXEC: "), st)
        a.send(200, "A", b"\xff" * 8)      # an ACK for no stream
        a.send(201, "a", jb({"name": "res_000001"}, b"x"))
        self.assertTrue(a.ping())
        self.assertEqual([x for x in os.listdir(k.cells) if "req" in x], [])
        self.assertEqual(os.listdir(k.rpc), [])

    # -- EXEC -------------------------------------------------------------

    def test_exec_status_stdout_stdin(self):
        a = self.agent()
        a.exec_(1, "echo hi; echo err >&2; exit 3")
        big = os.urandom(600000)
        a.exec_(2, "cat", stdin=big)
        a.exec_(3, "head -c 100000 /dev/zero", out_max=10)
        a.exec_(4, "kill -9 $$")
        a.send(5, "X", jb({"timeout": 100}))
        (t, p), = a.end(1)
        self.assertEqual(t, "x")
        self.assertEqual(unjb(p), ({"status": 3}, b"hi\n"))
        self.assertIn("err\n", a.stderr())
        self.assertEqual(unjb(a.end(2)[0][1]), ({"status": 0}, big))
        self.assertEqual(unjb(a.end(3)[0][1]), ({"status": 0}, bytes(10)))
        self.assertEqual(unjb(a.end(4)[0][1]), ({"status": 137}, b""))
        st, _ = unjb(a.end(5)[0][1])
        self.assertEqual(st["status"], -1)
        self.assertIn("cmd", st["error"])

    def test_exec_timeout_kills_the_process_group(self):
        a = self.agent()
        t0 = time.monotonic()
        a.exec_(1, "sleep 30 & echo $!; wait", timeout=300)
        (t, p), = a.end(1)
        self.assertLess(time.monotonic() - t0, 3)
        st, out = unjb(p)
        self.assertEqual(st, {"status": -1, "error": "timeout after 300 ms"})
        pid = int(out)
        self.assertTrue(_wait_for(lambda: _exited(pid)), "the group is killed")
        self.assertTrue(a.ping())
        time.sleep(0.1)
        self.assertEqual(len(a.of(1)), 1, "one answer")

    def test_a_slow_exec_does_not_delay_a_fast_one(self):
        a = self.agent()
        a.exec_(1, "sleep 2; echo slow")
        t0 = time.monotonic()
        a.exec_(2, "echo fast")
        self.assertEqual(unjb(a.end(2)[0][1]), ({"status": 0}, b"fast\n"))
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertEqual(a.of(1), [], "the slow one still runs")
        self.assertEqual(unjb(a.end(1)[0][1]), ({"status": 0}, b"slow\n"))

    def test_cancel_kills_a_command(self):
        a = self.agent()
        a.exec_(1, "echo $$; exec sleep 30", timeout=60000, out_max=100)
        time.sleep(0.3)
        a.send(1, "Q")
        self.assertTrue(a.ping())
        self.assertEqual(a.of(1), [])

    # -- cells ------------------------------------------------------------

    def test_ship_stream_result_exact(self):
        a = self.agent()
        k = self.kernel()
        # (a request too large for the wake FIFO: a file, its mode seen)
        a.cell(1, k, 1, code="import time\nprint('a', flush=True)\n"
                             "time.sleep(0.3)\nprint('b' * 70000)\nprint('\u00e9')\n#"
                             + "p" * 5000)
        fr = a.end(1)
        self.assertEqual(fr[0], ("S", b""))
        self.assertEqual(out_bytes(fr), self.file(k, "cell_out_000001"))
        res = result(fr)
        self.assertEqual(res, self.file(k, "cell_res_000001.json"))
        self.assertEqual(json.loads(res)["status"], "success")
        st = os.stat(k.path("cells", "cell_req_000001.json"))
        self.assertEqual(st.st_mode & 0o777, 0o600)
        self.assertNotIn("cell_req_000001.json.tmp", os.listdir(k.cells))

    def test_many_cells_on_several_kernels_at_once(self):
        a = self.agent()
        ks = [self.kernel() for _ in range(4)]
        code = ("import time\nfor i in range(100):\n"
                "    print(%d, i, 'x' * (i * 37 %% 300), flush=True)\n"
                "    time.sleep(0.003)\n")
        for n in (1, 2):            # two cells in a row on each kernel
            for i, k in enumerate(ks):
                a.cell(10 * i + n, k, n, code=code % i)
            for i, k in enumerate(ks):
                fr = a.end(10 * i + n)
                self.assertEqual(out_bytes(fr[1:]),
                                 self.file(k, "cell_out_%06d" % n))
                self.assertEqual(result(fr), self.file(k, "cell_res_%06d.json" % n))

    def test_a_crowded_rpc_dir_costs_its_kernel_not_the_neighbours(self):
        # 40,000 junk names in one kernel's rpc/: its sweep before the ship
        # goes in the loop's turns, so the neighbour's cell, asked for in
        # the same write, ships first (a sweep in one go ships it after)
        a = self.agent()
        crowded, quiet = self.kernel(), self.kernel()
        rpc = crowded.path("rpc")
        for i in range(40000):
            os.close(os.open(os.path.join(rpc, "junk%d" % i),
                             os.O_WRONLY | os.O_CREAT, 0o600))
        for name in ("req_000001", "res_000002"):
            with open(os.path.join(rpc, name), "w") as f:
                f.write("{}")
        a.write(a.cell_frame(1, crowded, 1, code="print(1)")
                + a.cell_frame(2, quiet, 1, code="print(2)"))
        fr1, fr2 = a.end(1), a.end(2)
        self.assertEqual(result(fr1), self.file(crowded, "cell_res_000001.json"))
        self.assertEqual(result(fr2), self.file(quiet, "cell_res_000001.json"))
        with a.cv:
            shipped = [sid for sid, t, _ in a.frames if t == "S"]
        self.assertEqual(shipped, [2, 1])
        # the earlier cell's request and answer went, the junk stayed
        names = os.listdir(rpc)
        self.assertNotIn("req_000001", names)
        self.assertNotIn("res_000002", names)
        self.assertEqual(len(names), 40000)

    def test_window_stops_the_stream_until_ack(self):
        a = self.agent(autoack=False)
        k = self.kernel()
        a.cell(1, k, 1, window=1000,
               code="for i in range(30):\n    print('%03d' % i + 'y' * 100)\n"
                    "print('z' * 5000)\nprint('end')")
        self.assertTrue(_wait_for(lambda: os.path.exists(k.res_path(1))))
        whole = self.file(k, "cell_out_000001")
        self.assertGreater(len(whole), 8000)
        acked = rounds = 0
        while True:
            time.sleep(0.2)        # more would have come by now
            fr = a.of(1)
            got = out_bytes(fr)
            self.assertLessEqual(len(got), acked + 1000, "never past the window")
            if fr[-1][0] == "R":
                break
            self.assertGreater(len(got), acked, "the window is used")
            acked = len(got)
            rounds += 1
            a.send(1, "A", struct.pack(">Q", acked))
        self.assertGreaterEqual(rounds, len(whole) // 1000)
        self.assertEqual(got, whole)
        self.assertEqual(result(fr), self.file(k, "cell_res_000001.json"))

    def test_resume_after_the_agent_dies(self):
        k = self.kernel()
        a = Agent()
        code = ("import time\nfor i in range(300):\n"
                "    print('line', i, flush=True)\n    time.sleep(0.005)\n")
        a.cell(1, k, 1, code=code)
        a.wait(lambda: len(out_bytes(a.of(1))) > 200)
        a.p.kill()                  # the connection breaks mid-cell
        a.close()
        first = out_bytes(a.of(1))
        self.assertFalse([t for t, _ in a.of(1) if t == "R"])
        self.assertFalse(os.path.exists(k.res_path(1)), "the cell still runs")
        b = self.agent()
        b.cell(1, k, 1, offset=len(first))
        fr = b.end(1)
        self.assertNotIn("S", [t for t, _ in fr], "a resume ships nothing")
        rest = out_bytes(fr, len(first))
        self.assertEqual(first + rest, self.file(k, "cell_out_000001"))
        self.assertEqual(json.loads(result(fr))["status"], "success")
        # every print there once, in order (a record is a piece of the
        # stream, not a line: a loaded machine may cut a print in two)
        text = "".join(json.loads(r)["text"] for r in
                       self.file(k, "cell_out_000001").splitlines())
        self.assertEqual(text, "".join("line %d\n" % i for i in range(300)))
        # the files are the truth: after the end too, from any offset
        whole = self.file(k, "cell_out_000001")
        for off in (0, 17, len(whole)):
            b.cell(10 + off, k, 1, offset=off)
            fr = b.end(10 + off)
            self.assertEqual(out_bytes(fr[:-1], off), whole[off:])
            self.assertEqual(result(fr), self.file(k, "cell_res_000001.json"))

    def test_events_with_the_result_come_as_cell_out_would(self):
        # a cell whose events came after its code (its last value) makes no
        # cell_out: the lines are in its result file before the result;
        # they go as OUT frames, within the window, from any offset, and
        # the RESULT frame is the result alone
        a = self.agent(autoack=False)
        k = self.kernel()
        a.cell(1, k, 1, window=40, code="'v' * 50")
        self.assertTrue(_wait_for(lambda: os.path.exists(k.res_path(1))))
        self.assertNotIn("cell_out_000001", os.listdir(k.cells))
        whole = self.file(k, "cell_res_000001.json")
        i = whole.rfind(b"\n") + 1
        lines, res = whole[:i], whole[i:]
        self.assertEqual(lines.count(b"\n"), 2)         # stdout, display
        time.sleep(0.2)
        self.assertEqual(out_bytes(a.of(1)), lines[:40], "within the window")
        self.assertNotIn("R", [t for t, _ in a.of(1)])
        # the file may be gone before the window opens (the runner reuses
        # an old result's file): what was read is sent
        os.rename(k.res_path(1), k.path("res.moved"))
        for _ in range(20):
            fr = a.of(1)
            if fr[-1][0] == "R":
                break
            got = out_bytes(fr)
            a.send(1, "A", struct.pack(">Q", len(got)))
            a.wait(lambda: len(a.of(1)) > len(fr))
            self.assertLessEqual(len(out_bytes(a.of(1))), len(got) + 40)
        fr = a.end(1)
        self.assertEqual(out_bytes(fr), lines)
        self.assertEqual(result(fr), res)
        self.assertEqual(json.loads(res)["output"], "'%s'\n" % ("v" * 50))
        os.rename(k.path("res.moved"), k.res_path(1))
        for off in (0, 17, len(lines), len(lines) + 5):
            a.cell(10 + off, k, 1, offset=off, window=1 << 20)
            fr = a.end(10 + off)
            self.assertEqual(out_bytes(fr, off), lines[off:])
            self.assertEqual(result(fr), res)

    def test_runner_killed_mid_cell_is_died(self):
        a = self.agent()
        k = self.kernel()
        a.cell(1, k, 1, code="import time\nprint('bye', flush=True)\ntime.sleep(30)")
        a.wait(lambda: b"bye" in out_bytes(a.of(1)))
        t0 = time.monotonic()
        k.proc.kill()
        fr = a.end(1, timeout=5)
        self.assertLess(time.monotonic() - t0, 2)
        self.assertEqual(result(fr), b'{"relay":"died"}')
        self.assertIn(b'"bye\\n"', out_bytes(fr[1:]))

    def test_runner_that_kills_itself_is_died_after_its_output(self):
        a = self.agent()
        k = self.kernel()
        a.cell(1, k, 1, code="import os, signal\nprint('last', flush=True)\n"
                             "os.kill(os.getpid(), signal.SIGKILL)")
        fr = a.end(1)
        self.assertEqual(result(fr), b'{"relay":"died"}')
        self.assertEqual(out_bytes(fr[1:]), self.file(k, "cell_out_000001"))

    def test_not_the_kernel_is_dead_and_nothing_ships(self):
        a = self.agent()
        k = self.kernel()
        a.cell(1, k, 1, code="1", start=_start(k.pid) + 1)
        a.cell(2, k, 1, code="1", ino=os.stat(k.dir).st_ino + 1)
        a.cell(3, k, 1, code="1", uid=os.geteuid() + 1)
        os.symlink(k.dir, k.dir + ".link")
        self.addCleanup(os.unlink, k.dir + ".link")
        a.cell(4, k, 1, code="1", path=k.dir + ".link")
        for sid in (1, 2, 3, 4):
            self.assertEqual(a.end(sid), [("R", b'{"relay":"dead"}')], sid)
        self.assertEqual([x for x in os.listdir(k.cells) if "req" in x], [])
        a.cell(5, k, 1, offset=0, ino=os.stat(k.dir).st_ino + 1)
        self.assertEqual(a.end(5), [("R", b'{"relay":"died"}')])

    def test_a_kept_kernel_is_checked_again_before_each_cell(self):
        # The agent keeps a kernel it verified for its next cells.  Between
        # two cells a cell (the kernel's uid) changes what it held: the
        # kernel dir or cells/ opened to others, the dir moved away (the
        # path names another): the next cell is not shipped.  cells/ or
        # rpc/ swapped for owner-only ones of its own: the kernel is
        # verified anew, the cell runs in what its path names now (as a
        # kernel not kept), nothing goes to the old one.
        def dir_mode(k):
            os.chmod(k.dir, 0o750)

        def cells_mode(k):
            os.chmod(k.cells, 0o755)

        def cells_swapped(k):
            os.rename(k.cells, k.cells + ".old")
            os.mkdir(k.cells, 0o700)

        def rpc_swapped(k):
            os.rename(k.rpc, k.rpc + ".old")
            os.mkdir(k.rpc, 0o700)

        def moved(k):
            os.rename(k.dir, k.dir + ".old")
            os.mkdir(k.dir, 0o700)
            os.mkdir(k.cells, 0o700)
            self.addCleanup(shutil.rmtree, k.dir + ".old", True)

        a = self.agent()
        sid = 0
        for change, runs in ((dir_mode, False), (cells_mode, False),
                             (cells_swapped, True), (rpc_swapped, True),
                             (moved, False)):
            what = change.__name__
            k = self.kernel()
            ino = os.stat(k.dir).st_ino
            for n in (1, 2):            # the second on the kept kernel
                sid += 1
                a.cell(sid, k, n, code="%d" % n, ino=ino)
                self.assertEqual(json.loads(result(a.end(sid)))["output"],
                                 "%d\n" % n, what)
            change(k)
            sid += 1
            a.cell(sid, k, 3, code="print('three')", ino=ino)
            fr = a.end(sid)
            if runs:
                self.assertEqual(json.loads(result(fr))["output"], "three\n", what)
                self.assertTrue(os.path.exists(k.path("cells", "cell_res_000003.json")), what)
            else:
                self.assertEqual(fr, [("R", b'{"relay":"dead"}')], what)
            for d in (k.cells + ".old", k.dir + ".old/cells"):
                self.assertFalse(os.path.isdir(d) and [
                    x for x in os.listdir(d) if "000003" in x], what)

    def test_a_small_request_goes_inline(self):
        # no request file: the JSON line in the wake FIFO
        a = self.agent()
        k = self.kernel()
        a.cell(1, k, 1, code="print('in line')")
        fr = a.end(1)
        self.assertEqual(json.loads(result(fr))["output"], "in line\n")
        self.assertFalse([x for x in os.listdir(k.cells) if "req" in x])

    def test_planted_request_tmp_fails_the_ship(self):
        a = self.agent()
        for i, kind in enumerate(("file", "symlink", "fifo", "dir")):
            k = self.kernel()
            target = k.path("target")
            with open(target, "w") as f:
                f.write("keep\n")
            tmp = k.path("cells", "cell_req_000001.json.tmp")
            if kind == "file":
                open(tmp, "w").close()
            elif kind == "symlink":
                os.symlink(target, tmp)
            elif kind == "fifo":
                os.mkfifo(tmp, 0o600)
            else:
                os.mkdir(tmp, 0o700)
            a.cell(i + 1, k, 1, code="1\n#" + "p" * 5000)   # not inline: a file
            w = json.loads(result(a.end(i + 1)))
            self.assertEqual(w["relay"], "failed", kind)
            self.assertTrue(w["error"].startswith("cells/cell_req_000001.json.tmp: "), w)
            with open(target) as f:
                self.assertEqual(f.read(), "keep\n", kind)
            self.assertFalse(os.path.exists(k.path("cells", "cell_req_000001.json")))

    def test_wake_that_is_not_a_fifo_fails_the_ship(self):
        a = self.agent()
        k = self.kernel()
        os.rename(k.path("wake"), k.path("wake.old"))
        open(k.path("wake"), "w").close()
        a.cell(1, k, 1, code="1")
        self.assertEqual(json.loads(result(a.end(1))),
                         {"relay": "failed", "error": "wake: not a FIFO"})
        self.assertEqual(os.path.getsize(k.path("wake")), 0)

    def test_hostile_files_are_unreadable_and_others_flow_on(self):
        a = self.agent()
        good = self.kernel()
        a.cell(100, good, 1, code="import time\nfor i in range(150):\n"
                                  "    print(i, flush=True)\n    time.sleep(0.01)\n")
        ks = []
        for kind in ("fifo", "dir", "symlink"):
            k = self.kernel()
            p = k.path("cells", "cell_out_000001")
            if kind == "fifo":
                os.mkfifo(p, 0o600)
            elif kind == "dir":
                os.mkdir(p, 0o700)
            else:
                os.symlink("/dev/zero", p)
            ks.append(k)
        for i, k in enumerate(ks):
            a.cell(i + 1, k, 1, offset=0)
        for i in range(3):
            self.assertEqual(json.loads(result(a.end(i + 1))),
                             {"relay": "unreadable", "status": "error",
                              "error": "reading the cell's output failed"})
        # a result that is a FIFO, a link or too big, made while streaming
        bad = []
        for kind in ("fifo", "big", "symlink", "made in place"):
            k = self.kernel()
            code = "import os, time\nprint('x', flush=True)\ntime.sleep(0.2)\n"
            if kind == "made in place":     # no rename: seen at the next write
                code += ("os.mkfifo('cells/cell_res_000001.json', 0o600)\n"
                         "print('y', flush=True)\ntime.sleep(5)\n")
            elif kind == "fifo":
                code += "os.mkfifo('cells/x', 0o600)\n"
            elif kind == "big":
                code += ("open('cells/x', 'w').write('{\"id\":1,\"output\":\"%s\"}')\n"
                         % ("y" * RES_LIMIT))
            else:
                code += "os.symlink('/dev/zero', 'cells/x')\n"
            code += "os.rename('cells/x', 'cells/cell_res_000001.json')\ntime.sleep(5)\n"
            bad.append(k)
            a.cell(10 + len(bad), k, 1, code=code)
        t0 = time.monotonic()
        for i in range(len(bad)):
            self.assertEqual(json.loads(result(a.end(11 + i)))["error"],
                             "the kernel wrote an unreadable result")
        self.assertLess(time.monotonic() - t0, 3)
        fr = a.end(100)
        self.assertEqual(out_bytes(fr[1:]), self.file(good, "cell_out_000001"))
        self.assertEqual(json.loads(result(fr))["status"], "success")

    def test_sparse_output_is_read_to_one_byte_past_the_bound(self):
        a = self.agent()
        k = self.kernel()
        a.cell(1, k, 1, out_limit=100000,
               code="import os\nprint('before', flush=True)\n"
                    "os.truncate('cells/cell_out_000001', 300 * 2**20)\n")
        fr = a.end(1)
        self.assertEqual(len(out_bytes(fr[1:])), 100001)
        self.assertEqual(json.loads(result(fr))["status"], "success")

    def test_interrupt_frames_reach_the_cell_and_nothing_else(self):
        a = self.agent()
        k = self.kernel()
        ino = os.stat(k.dir).st_ino

        def intr(ino, cell=1, path=k.dir):
            return frame(0, "I", jb({"dir": path, "ino": ino, "cell": cell}))

        a.cell(1, k, 1, code="import time\nprint('go', flush=True)\n"
                             "time.sleep(30)")
        a.wait(lambda: out_bytes(a.of(1)))
        # another inode (a directory put in the kernel's place), another
        # cell, a bad frame: nothing reaches the cell, the agent goes on
        a.write(intr(ino + 1) + intr(ino, cell=2) + frame(0, "I", b"junk"))
        self.assertTrue(a.ping())
        self.assertFalse(any(t == "R" for t, _ in a.of(1)))
        self.assertIn("not the kernel's directory", a.stderr())
        self.assertIn("bad INTERRUPT", a.stderr())
        # the same interrupt three times in one read: one line in the FIFO
        a.write(intr(ino) * 3)
        r = json.loads(result(a.end(1)))
        self.assertEqual((r["status"], r["error"]),
                         ("interrupted", "KeyboardInterrupt"))
        self.assertEqual(sum(1 for line in k.log().splitlines()
                             if "cell 1: interrupted" in line), 1)

    def test_interrupt_never_writes_through_a_planted_intr(self):
        a = self.agent()
        k = self.kernel()
        canary = k.path("canary")
        with open(canary, "w") as f:
            f.write("canary")
        os.unlink(k.path("intr"))
        os.symlink(canary, k.path("intr"))
        a.write(frame(0, "I", jb({"dir": k.dir, "ino": os.stat(k.dir).st_ino,
                                   "cell": 1})))
        self.assertTrue(a.ping())
        os.unlink(k.path("intr"))
        os.link(canary, k.path("intr"))     # a regular file, not a FIFO
        a.write(frame(0, "I", jb({"dir": k.dir, "ino": os.stat(k.dir).st_ino,
                                   "cell": 1})))
        self.assertTrue(a.ping())
        with open(canary) as f:
            self.assertEqual(f.read(), "canary")
        self.assertIn("intr is not a FIFO", a.stderr())

    def test_cancel_forgets_the_stream(self):
        a = self.agent()
        k = self.kernel()
        a.cell(1, k, 1, code="import time\nprint(1, flush=True)\ntime.sleep(0.5)\nprint(2)")
        a.wait(lambda: out_bytes(a.of(1)))
        a.send(1, "Q")
        self.assertTrue(_wait_for(lambda: os.path.exists(k.res_path(1))))
        time.sleep(0.1)
        self.assertTrue(a.ping())
        self.assertEqual(out_bytes(a.of(1)), b'{"type":"stdout","text":"1\\n"}\n')
        self.assertNotIn("R", [t for t, _ in a.of(1)])

    def test_inotify_queue_overflow_looks_at_every_stream_again(self):
        with open("/proc/sys/fs/inotify/max_queued_events") as f:
            events = int(f.read())
        a = self.agent()
        k = self.kernel()
        go = k.path("go")
        # the cell ends once told to: after the queue overflowed, so that
        # its result's event is lost too, whatever the machine's speed
        a.cell(1, k, 1, code="import os, time\nprint('a', flush=True)\n"
                             "while not os.path.exists(%r):\n"
                             "    time.sleep(0.01)\nprint('b')" % go)
        a.wait(lambda: out_bytes(a.of(1)))
        # the ack of 'a' taken before the stop: taken after it, it would
        # read the result without a single event, the queue unread
        self.assertTrue(a.ping())
        os.kill(a.pid, signal.SIGSTOP)     # its queue fills up meanwhile
        try:
            for i in range(events + 10):     # a write: an event each
                fd = os.open(k.path("cells", "junk%d" % i),
                             os.O_WRONLY | os.O_CREAT, 0o600)
                os.write(fd, b"j")
                os.close(fd)
            req = k.path("rpc", "req_000003")
            with open(req + ".tmp", "wb") as f:
                f.write(b"{}")
            os.rename(req + ".tmp", req)
            open(go, "w").close()
            self.assertTrue(_wait_for(lambda: os.path.exists(k.res_path(1)),
                                      timeout=15.0))
        finally:
            os.kill(a.pid, signal.SIGCONT)
        fr = a.end(1, timeout=15)   # 16k events to read first, under load
        self.assertEqual([unjb(p) for t, p in fr if t == "r"],
                         [({"name": "req_000003"}, b"{}")])
        self.assertEqual(out_bytes([f for f in fr if f[0] == "O"]),
                         self.file(k, "cell_out_000001"))
        self.assertEqual(result(fr), self.file(k, "cell_res_000001.json"))
        self.assertIn("overflow", a.stderr())

    # -- tool calls -------------------------------------------------------

    def test_leftovers_in_rpc_between_kept_cells_are_swept(self):
        # Between two cells of a kept kernel, what an earlier cell's thread
        # leaves in rpc/ (a request renamed in, made in place, linked, a
        # symlink; an answer) has no authority: the next cell's stream
        # never carries it, and it is gone once that cell ships: the
        # agent's sweep is the only one (this fails when it skips a
        # listing it owed).
        def renamed(k, name):
            with open(k.path("rpc", "t"), "wb") as f:
                f.write(b'{"tool":"t"}')
            os.rename(k.path("rpc", "t"), k.path("rpc", name))

        def in_place(k, name):
            with open(k.path("rpc", name), "wb") as f:
                f.write(b'{"tool":"t"}')

        def linked(k, name):
            with open(k.path("x"), "wb") as f:
                f.write(b'{"tool":"t"}')
            os.link(k.path("x"), k.path("rpc", name))

        def symlinked(k, name):
            os.symlink(k.path("x"), k.path("rpc", name))

        a = self.agent()
        k = self.kernel()
        n = 0                           # the cell's id and its stream's
        for plant in (renamed, in_place, linked, symlinked):
            for _ in range(2):          # the second on the kept kernel
                n += 1
                a.cell(n, k, n, code="1")
                self.assertEqual(json.loads(result(a.end(n)))["output"],
                                 "1\n", plant.__name__)
            plant(k, "req_%06d" % (100 + n))
            plant(k, "res_%06d" % (100 + n))
            n += 1
            a.cell(n, k, n, code="import time\ntime.sleep(0.3)")
            fr = a.end(n)
            self.assertEqual([t for t, _ in fr if t == "r"], [], plant.__name__)
            self.assertEqual([x for x in os.listdir(k.rpc)
                              if x.startswith(("req_", "res_"))], [],
                             plant.__name__)

    def test_rpc_request_and_answer_files(self):
        a = self.agent()
        k = self.kernel()
        a.cell(1, k, 1, code="import time\ntime.sleep(3)")
        a.wait(lambda: a.of(1))
        req = k.path("rpc", "req_000007")
        with open(req + ".tmp", "wb") as f:
            f.write(b'{"tool":"t"}')
        time.sleep(0.1)
        self.assertEqual(a.of(1), [("S", b"")], "a tmp is not a request yet")
        os.rename(req + ".tmp", req)
        a.wait(lambda: len(a.of(1)) > 1)
        (t, p), = a.of(1)[1:]
        self.assertEqual(t, "r")
        self.assertEqual(unjb(p), ({"name": "req_000007"}, b'{"tool":"t"}'))
        self.assertFalse(os.path.exists(req), "taken: removed")
        # hostile requests: a FIFO, a link; neither hangs the agent
        os.mkfifo(k.path("rpc", "x"), 0o600)
        os.rename(k.path("rpc", "x"), k.path("rpc", "req_000008"))
        os.symlink("/dev/zero", k.path("rpc", "x"))
        os.rename(k.path("rpc", "x"), k.path("rpc", "req_000009"))
        with open(k.path("rpc", "x"), "wb") as f:
            f.truncate(300 << 20)
        os.rename(k.path("rpc", "x"), k.path("rpc", "req_000010"))
        self.assertTrue(a.ping())
        # each said unreadable, for the module to count; none read
        self.assertEqual(sorted((unjb(p) for t, p in a.of(1)[2:]),
                                key=lambda m: m[0]["name"]),
                         [({"name": "req_%06d" % n, "unreadable": 1}, b"")
                          for n in (8, 9, 10)])
        self.assertFalse([n for n in os.listdir(k.rpc) if n.startswith("req_")])
        a.send(1, "a", jb({"name": "res_000007"}, b'{"seq":7}'))
        a.send(1, "a", jb({"name": "../cells/res_000007"}, b"no"))
        self.assertTrue(a.ping())
        res = k.path("rpc", "res_000007")
        st = os.lstat(res)
        self.assertEqual(st.st_mode & 0o777, 0o600)
        with open(res, "rb") as f:
            self.assertEqual(f.read(), b'{"seq":7}')
        self.assertEqual(sorted(os.listdir(k.rpc)), ["res_000007"])

    def test_tool_call_round_trip(self):
        a = self.agent()
        k = self.kernel()
        a.cell(1, k, 1, code="import hermes_tools\n"
                             "print(hermes_tools.call('echo', {'x': 1}, timeout=5))")
        a.wait(lambda: [1 for t, _ in a.of(1) if t == "r"])
        (p,) = [p for t, p in a.of(1) if t == "r"]
        meta, body = unjb(p)
        self.assertEqual(meta, {"name": "req_000001"})
        call = json.loads(body)
        self.assertEqual((call["tool"], call["args"], call["seq"]), ("echo", {"x": 1}, 1))
        a.send(1, "a", jb({"name": "res_000001"}, json.dumps(
            {"seq": 1, "ok": True, "result": {"y": 2}, "error": None}).encode()))
        fr = a.end(1)
        self.assertIn(b"{'y': 2}", out_bytes([f for f in fr if f[0] == "O"]))
        self.assertEqual(json.loads(result(fr))["status"], "success")

    def test_rpc_answer_in_pieces_and_archive(self):
        a = self.agent()
        k = self.kernel()
        with open(k.path("rpc", "req_000003"), "wb") as f:
            f.write(b"left by an earlier cell")
        with open(k.path("rpc", "res_000004"), "wb") as f:
            f.write(b"ditto")
        a.cell(1, k, 1, code="import time\ntime.sleep(3)")
        a.wait(lambda: a.of(1))
        self.assertEqual(sorted(os.listdir(k.rpc)), [], "swept before the cell")
        # an archived answer in three pieces, out of the rpc/ directory
        name = "tool_results/cell_000001_000002.json"
        a.send(1, "a", jb({"name": name, "offset": 0, "more": True}, b"ab"))
        a.send(1, "a", jb({"name": name, "offset": 2, "more": True}, b"cd"))
        self.assertTrue(a.ping())
        tr = k.path("tool_results")
        self.assertEqual(os.listdir(tr), ["cell_000001_000002.json.tmp"],
                         "not in place before the last piece")
        a.send(1, "a", jb({"name": name, "offset": 4, "more": False}, b"e"))
        self.assertTrue(a.ping())
        self.assertEqual(os.listdir(tr), ["cell_000001_000002.json"])
        self.assertEqual(os.stat(tr).st_mode & 0o777, 0o700)
        path = os.path.join(tr, "cell_000001_000002.json")
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"abcde")
        # a piece out of order drops the answer; a path out is refused
        a.send(1, "a", jb({"name": "res_000005", "offset": 0, "more": True}, b"x"))
        a.send(1, "a", jb({"name": "res_000005", "offset": 9}, b"y"))
        a.send(1, "a", jb({"name": "tool_results/../cells/x.json"}, b"no"))
        self.assertTrue(a.ping())
        self.assertEqual(sorted(os.listdir(k.rpc)), [], "nothing left behind")
        self.assertIn("out of order", a.stderr())
        # tool_results/ made a link by the code: not followed
        elsewhere = tempfile.mkdtemp(prefix="hermes_raelse_")
        self.addCleanup(shutil.rmtree, elsewhere)
        shutil.rmtree(tr)
        os.symlink(elsewhere, tr)
        a.send(1, "a", jb({"name": "tool_results/cell_000001_000006.json"}, b"z"))
        self.assertTrue(a.ping())
        self.assertEqual(os.listdir(elsewhere), [], "nothing written through it")

    # -- READY: a new kernel's word ----------------------------------------

    def runner_dir(self):
        """A kernel dir whose "runner" sleeps until killed: (dir, process)."""
        d = tempfile.mkdtemp(prefix="hermes_ready_")
        self.addCleanup(shutil.rmtree, d, True)
        p = subprocess.Popen(["sleep", "60"])
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        return d, p

    def say_ready(self, d, pid):
        with open(os.path.join(d, "ready.tmp"), "w") as f:
            f.write('{"pid":%d}' % pid)
        os.rename(os.path.join(d, "ready.tmp"), os.path.join(d, "ready"))

    def test_ready_answers_once_the_runner_says_so(self):
        a = self.agent()
        d, p = self.runner_dir()
        a.ready(1, d, p.pid)
        self.assertTrue(a.ping())
        sw0 = _proc(a.pid)[1]
        time.sleep(0.5)
        # woken, not polled: the shell loop it replaces woke 50 times
        self.assertLessEqual(_proc(a.pid)[1] - sw0, 3, "wake-ups while waiting")
        self.assertEqual(a.of(1), [], "nothing before the word")
        self.say_ready(d, p.pid)
        (t, pl), = a.end(1)
        st, out = unjb(pl)
        self.assertEqual((t, st), ("x", {"status": 0}))
        word, stat_line = out.split(b"\n", 1)
        self.assertEqual(word, b'{"pid":%d}' % p.pid)
        with open("/proc/%d/stat" % p.pid, "rb") as f:
            self.assertEqual(stat_line, f.read(), "the pid's stat, whole")
        # a word already there: at once
        a.ready(2, d, p.pid)
        self.assertEqual(unjb(a.end(2)[0][1])[0], {"status": 0})

    def test_ready_ends_when_the_runner_dies_or_time_is_up(self):
        a = self.agent()
        d, p = self.runner_dir()
        a.ready(1, d, p.pid, timeout=30000)
        a.ready(2, d, p.pid, timeout=200)
        t0 = time.monotonic()
        st, _ = unjb(a.end(2)[0][1])
        self.assertEqual(st, {"status": -1, "error": "no ready after 200 ms"})
        self.assertGreaterEqual(time.monotonic() - t0, 0.15)
        p.kill()
        p.wait()
        t0 = time.monotonic()
        self.assertEqual(unjb(a.end(1)[0][1]), ({"status": 1}, b""))
        self.assertLess(time.monotonic() - t0, 2.0, "the exit, not the timeout")
        a.ready(3, d, p.pid)            # gone already
        self.assertEqual(unjb(a.end(3)[0][1])[0], {"status": 1})
        a.ready(4, d + "-missing", 1)
        st, out = unjb(a.end(4)[0][1])
        self.assertEqual(st, {"status": 1})
        self.assertIn(b"No such file", out)
        a.send(5, "W", jb({"dir": d, "timeout": 100}))
        st, _ = unjb(a.end(5)[0][1])
        self.assertEqual(st["status"], -1)
        self.assertIn("bad READY", st["error"])

    def test_ready_that_is_not_a_regular_file_is_not_the_word(self):
        a = self.agent()
        d, p = self.runner_dir()
        other = os.path.join(d, "other")
        with open(other, "w") as f:
            f.write('{"pid":%d}' % p.pid)
        os.symlink(other, os.path.join(d, "ready"))
        a.ready(1, d, p.pid, timeout=300)
        st, _ = unjb(a.end(1)[0][1])
        self.assertEqual(st["status"], -1, "a link is not followed")
        os.unlink(os.path.join(d, "ready"))
        os.mkfifo(os.path.join(d, "ready"), 0o600)
        a.ready(2, d, p.pid, timeout=300)
        st, _ = unjb(a.end(2)[0][1])
        self.assertEqual(st["status"], -1, "a FIFO neither, and no hang")
        self.assertTrue(a.ping())
        os.unlink(os.path.join(d, "ready"))
        self.say_ready(d, p.pid)
        a.ready(3, d, p.pid)
        self.assertEqual(unjb(a.end(3)[0][1])[0], {"status": 0})

    # -- never polls ------------------------------------------------------

    def test_cells_another_agent_streams_wake_this_one_once(self):
        # A kernel kept by agent A (its cells/ watch left wide after A's
        # cell) while agent B runs its next cells (the other worker's
        # connection): A is woken once, narrows the watch, and sleeps
        # through the rest; its own next cell still streams.
        a, b = self.agent(), self.agent()
        if not json.loads(a.wait(lambda: a.frames)[0][2])["inotify"]:
            self.skipTest("no inotify: streams look on a clock")
        k = self.kernel()
        a.cell(1, k, 1, code="1")
        self.assertEqual(json.loads(result(a.end(1)))["output"], "1\n")
        time.sleep(0.1)
        sw0 = _proc(a.pid)[1]
        for n in range(2, 42):
            b.cell(n, k, n, code="print(%d)" % n)
            self.assertEqual(json.loads(result(b.end(n)))["output"],
                             "%d\n" % n)
        time.sleep(0.1)
        self.assertLessEqual(_proc(a.pid)[1] - sw0, 4,
                             "wake-ups for 40 cells of another agent")
        a.cell(42, k, 42, code="print('back')")
        self.assertEqual(json.loads(result(a.end(42)))["output"], "back\n")

    def test_idle_agent_sleeps(self):
        a = self.agent()
        if not json.loads(a.wait(lambda: a.frames)[0][2])["pidfd"]:
            self.skipTest("no pidfds: runners are looked at on a clock")
        k = self.kernel()
        a.cell(1, k, 1, code="import time\nprint(1, flush=True)\ntime.sleep(3)")
        a.exec_(2, "sleep 3")
        a.wait(lambda: out_bytes(a.of(1)))
        time.sleep(0.1)
        cpu0, sw0 = _proc(a.pid)
        time.sleep(1.0)
        cpu1, sw1 = _proc(a.pid)
        self.assertLessEqual(cpu1 - cpu0, 2, "CPU ticks while idle")
        self.assertLessEqual(sw1 - sw0, 3, "wake-ups while idle")
        self.assertEqual(json.loads(result(a.end(1)))["status"], "success")


class DiskFullTest(unittest.TestCase):
    """The kernel dir on a small tmpfs, filled up before the cell ships."""

    def test_full_disk_is_said_and_nothing_is_left(self):
        mnt = tempfile.mkdtemp(prefix="hermes_rafull_")
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
        except OSError:
            pass
        finally:
            os.close(fd)
        a = Agent()
        self.addCleanup(a.close)
        # a request too large for the wake FIFO cannot be written
        a.cell(1, k, 2, code="print(1)\n#" + "p" * 5000)
        self.assertEqual(a.end(1), [("R", b'{"relay":"full"}')], a.stderr())
        self.assertFalse([x for x in os.listdir(k.cells) if "req_000002" in x])
        self.assertTrue(k.alive())
        # a small one goes inline, and its result into the reserve
        a.cell(2, k, 2, code="print(1)")
        self.assertEqual(a.end(2)[0], ("S", b""))
        self.assertTrue(k.alive())


SCRIPT = os.path.join(HERE, "hermes_kernel.sh")
GW, INST = "0123456789abcdef", "fedcba98"


class KernelStepTest(unittest.TestCase):
    """A KERNEL frame does the kernel script's "dir" and "ship" as the
    script does them: the same statuses and words for the same argv, on
    twin roots, for a fresh kernel and for what a co-tenant plants."""

    def setUp(self):
        self.a = Agent()
        self.addCleanup(self.a.close)
        with open(SCRIPT) as f:
            self.script = "exec 2>&1\n" + f.read()
        self.sid = 0
        self.tmp = tempfile.mkdtemp(prefix="hermes_ksteps_")
        os.chmod(self.tmp, 0o700)
        self.addCleanup(shutil.rmtree, self.tmp)

    def twins(self):
        """Two fresh roots, the script's and the agent's."""
        self.sid += 1
        roots = []
        for who in ("sh", "agent"):
            r = os.path.join(self.tmp, "%s%d" % (who, self.sid))
            os.mkdir(r, 0o755)
            roots.append(r)
        return roots

    def step(self, typ, args, data=b""):
        self.sid += 1
        req = {"args": args, "timeout": 5000, "out_max": 4096}
        if typ == "X":
            req["cmd"] = self.script
        self.a.send(self.sid, typ, jb(req, data))
        (t, p), = self.a.end(self.sid)
        self.assertEqual(t, "x")
        st, out = unjb(p)
        return st["status"], out.decode()

    def both(self, roots, verb, *args, data=b"", words=True):
        """The script's and the agent's answer, the same but for the root
        and inode numbers; the agent's status and words."""
        got = []
        for typ, root in zip("XK", roots):
            status, out = self.step(typ, [verb, root] + list(args), data)
            got.append((status, re.sub(r"\d{5,}", "N",
                                       out.replace(root, "ROOT"))))
        if words:
            self.assertEqual(got[0], got[1])
        else:
            self.assertEqual(got[0][0], got[1][0], got)
        return got[1]

    def test_a_fresh_kernel_dir_and_its_files(self):
        kid = "ab" * 16
        roots = self.twins()
        status, out = self.both(roots, "dir", kid, GW, INST)
        uid = os.geteuid()
        self.assertEqual(status, 0, out)
        self.assertEqual(out, "made\n" + "directory:%d:700:N\n" % uid * 3
                         + "%d\n" % uid)
        files = [("kernel_start.py", b"pass\n"), ("kernel.env", b"T=1\n"),
                 ("empty", b"")]
        args = [x for n, b in files for x in (n, str(len(b)))]
        data = b"".join(b for _, b in files)
        self.assertEqual(self.both(roots, "ship", kid, *args, data=data),
                         (0, ""))
        for r in roots:
            d = os.path.join(r, "hermes_rkernel_" + kid)
            for sub in (d, d + "/cells", d + "/rpc"):
                st = os.lstat(sub)
                self.assertEqual(stat.S_IMODE(st.st_mode), 0o700, sub)
            for n, b in files:
                st = os.lstat(os.path.join(d, n))
                self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
                with open(os.path.join(d, n), "rb") as f:
                    self.assertEqual(f.read(), b)
            j = os.path.join(r, "hermes_journal_%d" % uid)
            self.assertEqual(stat.S_IMODE(os.lstat(j).st_mode), 0o700)
            with open(os.path.join(j, kid)) as f:
                self.assertEqual(f.read(), "%s %s %d\n"
                                 % (GW, INST, os.lstat(d).st_ino))

    def test_a_planted_kernel_dir_is_never_taken(self):
        kid = "cd" * 16
        canary = os.path.join(self.tmp, "canary")
        os.mkdir(canary)
        for plant in ("dir", "link", "file"):
            roots = self.twins()
            for r in roots:
                d = os.path.join(r, "hermes_rkernel_" + kid)
                if plant == "dir":
                    os.mkdir(d, 0o777)
                elif plant == "link":
                    os.symlink(canary, d)
                else:
                    open(d, "w").close()
            self.assertEqual(self.both(roots, "dir", kid, GW, INST),
                             (4, "EEXIST\n"), plant)
            # nothing shipped into it, nothing through the link
            self.assertEqual(self.both(roots, "ship", kid, "kernel.env", "1",
                                       data=b"x"),
                             (1, "no kernel directory\n") if plant != "dir"
                             else (0, ""), plant)
        self.assertEqual(os.listdir(canary), [])

    def test_a_planted_file_in_the_dir_fails_the_ship(self):
        kid = "ef" * 16
        canary = os.path.join(self.tmp, "canary")
        with open(canary, "w") as f:
            f.write("canary")
        roots = self.twins()
        self.assertEqual(self.both(roots, "dir", kid, GW, INST)[0], 0)
        for r in roots:
            os.symlink(canary, os.path.join(r, "hermes_rkernel_" + kid,
                                            "kernel.env"))
        status, _ = self.both(roots, "ship", kid, "kernel.env", "3",
                              data=b"T=1", words=False)
        self.assertEqual(status, 1)
        with open(canary) as f:
            self.assertEqual(f.read(), "canary")

    def test_roots_and_journals_not_ours(self):
        uid = os.geteuid()
        # writable by others: refused; sticky too: fine
        roots = self.twins()
        for r in roots:
            os.chmod(r, 0o777)
        self.assertEqual(self.both(roots, "dir", "01" * 16, GW, INST)[0], 3)
        for r in roots:
            os.chmod(r, 0o1777)
        self.assertEqual(self.both(roots, "dir", "01" * 16, GW, INST)[0], 0)
        # a journal that is a link, or not 0700
        elsewhere = os.path.join(self.tmp, "elsewhere")
        os.mkdir(elsewhere, 0o700)
        for plant in ("link", "mode"):
            roots = self.twins()
            for r in roots:
                j = os.path.join(r, "hermes_journal_%d" % uid)
                if plant == "link":
                    os.symlink(elsewhere, j)
                else:
                    os.mkdir(j, 0o755)
            self.assertEqual(self.both(roots, "dir", "02" * 16, GW, INST),
                             (6, "the journal ROOT/hermes_journal_%d is not "
                              "a directory of uid %d with mode 0700\n"
                              % (uid, uid)), plant)
            for r in roots:
                self.assertEqual(os.listdir(r), ["hermes_journal_%d" % uid])
        self.assertEqual(os.listdir(elsewhere), [])
        # no root at all
        roots = [os.path.join(self.tmp, "none")] * 2
        self.assertEqual(self.both(roots, "dir", "03" * 16, GW, INST,
                                   words=False)[0], 1)

    def test_bad_arguments_change_nothing(self):
        roots = self.twins()
        for args in (["dir", "AB" * 16, GW, INST], ["dir", "ab" * 15, GW, INST],
                     ["dir", "ab" * 16, "xyz", INST], ["dir", "ab" * 16, "", ""],
                     ["dir", "ab" * 16, GW], ["ship", "ab" * 16, "a/b", "1"],
                     ["ship", "ab" * 16, "..", "1"], ["ship", "ab" * 16, "a"],
                     ["ship", "ab" * 16, "a", "-1"], ["ship", "ab" * 16, "a", "1x"],
                     ["ship", "ab", "a", "1"]):
            status, _ = self.both(roots, args[0], *args[1:])
            self.assertEqual(status, 2, args)
        for r in roots:
            self.assertEqual(os.listdir(r), [])
        # no step but these two
        self.sid += 1
        self.a.send(self.sid, "K", jb({"args": ["kill", roots[1]]}))
        st, _ = unjb(self.a.end(self.sid)[0][1])
        self.assertEqual(st["status"], -1)


# A host without pidfds (Python 3.8, Linux < 5.3) and without inotify (no
# ctypes): the agent's text run after a prelude that takes them away.
NO_PIDFD = b"import os\nif hasattr(os, 'pidfd_open'): del os.pidfd_open\n"
NO_INOTIFY = b"import sys\nsys.modules['ctypes'] = None\n"


class FallbackTest(unittest.TestCase):

    def agent(self, prelude):
        a = Agent(prelude=prelude)
        self.addCleanup(a.close)
        return a

    def test_without_pidfd_or_inotify(self):
        for prelude in (NO_PIDFD, NO_INOTIFY, NO_PIDFD + NO_INOTIFY):
            a = self.agent(prelude)
            hello = json.loads(a.wait(lambda: a.frames)[0][2])
            self.assertEqual(hello["inotify"], b"ctypes" not in prelude)
            if b"pidfd" in prelude:
                self.assertFalse(hello["pidfd"])
            a.exec_(1, "sleep 1; echo slow")
            a.exec_(2, "exit 4")
            a.exec_(3, "exec sleep 30", timeout=200)
            t0 = time.monotonic()
            self.assertEqual(unjb(a.end(2)[0][1]), ({"status": 4}, b""))
            self.assertLess(time.monotonic() - t0, 0.5, prelude)
            self.assertEqual(unjb(a.end(3)[0][1])[0]["status"], -1)
            self.assertEqual(unjb(a.end(1)[0][1]), ({"status": 0}, b"slow\n"))
            k = Kernel()
            self.addCleanup(k.close)
            a.cell(4, k, 1, code="import time\nfor i in range(20):\n"
                                 "    print(i, flush=True)\n    time.sleep(0.01)\n")
            fr = a.end(4)
            self.assertEqual(out_bytes(fr[1:]), _file(k, "cell_out_000001"))
            self.assertEqual(result(fr), _file(k, "cell_res_000001.json"))
            a.cell(5, k, 2, code="import time\nprint('bye', flush=True)\ntime.sleep(30)")
            a.wait(lambda: out_bytes(a.of(5)))
            k.proc.kill()
            self.assertEqual(result(a.end(5, timeout=3)), b'{"relay":"died"}')
            # READY on the clock where a mechanism is missing
            d = tempfile.mkdtemp(prefix="hermes_ready_")
            self.addCleanup(shutil.rmtree, d, True)
            p = subprocess.Popen(["sleep", "60"])
            self.addCleanup(p.wait)
            self.addCleanup(p.kill)
            a.ready(6, d, p.pid)
            time.sleep(0.1)
            with open(os.path.join(d, "ready"), "w") as f:
                f.write("{}")
            self.assertEqual(unjb(a.end(6)[0][1])[0], {"status": 0}, prelude)
            os.unlink(os.path.join(d, "ready"))
            a.ready(7, d, p.pid)
            time.sleep(0.1)
            p.kill()
            self.assertEqual(unjb(a.end(7)[0][1]), ({"status": 1}, b""), prelude)


def _file(k, name):
    with open(k.path("cells", name), "rb") as f:
        return f.read()


if __name__ == "__main__":
    unittest.main()
