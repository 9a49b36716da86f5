# SPDX-License-Identifier: BSD-2-Clause
"""Tests for kernel_runner.py and hermes_tools.py.

Each test starts the real runner in a temp kernel dir and drives it through
files, as the nginx module does:

    cd src/remote && /usr/bin/python3 -m unittest -v test_remote

HERMES_TEST_PYTHON names another python for the runner (its kernels'),
e.g. an older one: the runner must work on any CPython >= 3.8.
"""

import errno
import itertools
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.environ.get("HERMES_TEST_PYTHON", "/usr/bin/python3")
TOKEN = "5e" * 32
with open(os.path.join(HERE, "kernel_runner.py")) as _f:
    WITH_RESULT_MAX = eval(re.search(r"^WITH_RESULT_MAX = (.*?)  #", _f.read(),
                                     re.M).group(1))


def _write_atomic(path, data):
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, data)
    os.close(fd)
    os.rename(path + ".tmp", path)


def _wait_for(pred, timeout=5.0, step=0.002):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def _ignore_sigint():
    # A background job of a non-interactive shell starts with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _answer_rpc(test, k, seq, tool, result):
    """Answer the kernel's request seq (for tool) with result; its args."""
    req = os.path.join(k.rpc, "req_%06d" % seq)
    test.assertTrue(_wait_for(lambda: os.path.exists(req)),
                    "no %s; runner.log: %s" % (req, k.log()))
    with open(req) as f:
        got = json.load(f)
    test.assertEqual(got["tool"], tool)
    os.unlink(req)
    _write_atomic(os.path.join(k.rpc, "res_%06d" % seq), json.dumps(
        {"seq": seq, "ok": True, "result": result, "error": None}).encode())
    return got["args"]


class Kernel:
    """A kernel dir plus a running kernel_runner.py, driven like the module."""

    def __init__(self, idle=0, shell=False, sigint_ignored=True, plant=None,
                 env=None, root=None, env_fd=False):
        self.dir = tempfile.mkdtemp(prefix="hermes_rkernel_", dir=root)  # 0700
        self.cells = os.path.join(self.dir, "cells")
        self.rpc = os.path.join(self.dir, "rpc")
        os.mkdir(self.cells, 0o700)
        os.mkdir(self.rpc, 0o700)
        for name in ("kernel_runner.py", "hermes_tools.py"):
            shutil.copyfile(os.path.join(HERE, name), os.path.join(self.dir, name))
            os.chmod(os.path.join(self.dir, name), 0o600)
        for name, text in (plant or {}).items():     # files a cell left in D
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(text)
        self.n = 0
        self.proc = None
        env = {"HERMES_RPC_TOKEN": TOKEN, "HERMES_KERNEL_ID": "9f2c",
               "HERMES_IDLE_TIMEOUT": str(idle), **(env or {})}
        if shell:
            self._spawn_shell(env)
        else:
            log = os.open(self.path("runner.log"), os.O_WRONLY | os.O_CREAT, 0o600)
            fds = ()
            if env_fd:
                # as the module's spawn: kernel.env open and unlinked, its
                # fd the only way in (the token in no environment)
                fd = os.open(self.dir, os.O_RDWR | os.O_TMPFILE, 0o600)
                os.write(fd, "".join("%s='%s'\n" % kv
                                     for kv in env.items()).encode())
                env, fds = {"HERMES_ENV_FD": str(fd)}, (fd,)
            self.proc = subprocess.Popen(
                [PYTHON, "-I", "kernel_runner.py"], cwd=self.dir,
                env=dict(env, PATH=os.environ.get("PATH", "/usr/bin:/bin")),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                pass_fds=fds,
                preexec_fn=_ignore_sigint if sigint_ignored else None)
            for fd in fds:
                os.close(fd)
            os.close(log)
            self.pid = self.proc.pid
        self.ready = _wait_for(lambda: os.path.exists(self.path("ready")))

    def _spawn_shell(self, env):
        # The module's own start line: token only in the sourced env file.
        _write_atomic(self.path("kernel.env"), "".join(
            "%s='%s'\n" % kv for kv in env.items()).encode())
        cmd = ("umask 077 && cd '%s' && { ( set -a; . ./kernel.env; set +a;"
               " rm -f ./kernel.env; exec setsid %s -I kernel_runner.py )"
               " >runner.log 2>&1 </dev/null & } && echo $!" % (self.dir, PYTHON))
        out = subprocess.run(["sh", "-c", cmd], capture_output=True, check=True)
        self.pid = int(out.stdout)

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def alive(self):
        if self.proc is not None:
            return self.proc.poll() is None
        try:
            with open("/proc/%d/stat" % self.pid) as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def wake(self):
        fd = os.open(self.path("wake"), os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"\0")
        os.close(fd)

    def send(self, code, inline=False, **opts):
        self.n += 1
        req = dict(opts, id=self.n, code=code)
        if inline:        # the local module's way for a small request
            self.say(json.dumps(req).encode() + b"\n")
            return self.n
        _write_atomic(os.path.join(self.cells, "cell_req_%06d.json" % self.n),
                      json.dumps(req).encode())
        self.wake()
        return self.n

    def say(self, data):
        fd = os.open(self.path("wake"), os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, data)
        os.close(fd)

    def res_path(self, n):
        return os.path.join(self.cells, "cell_res_%06d.json" % n)

    def result(self, n, timeout=5.0):
        if not _wait_for(lambda: os.path.exists(self.res_path(n)), timeout):
            raise AssertionError("no result for cell %d; runner.log: %s"
                                 % (n, self.log()))
        with open(self.res_path(n), "rb") as f:
            data = f.read()
        # the last line; event lines may come before it (with_result)
        return json.loads(data[data.rfind(b"\n") + 1:].decode("utf-8"))

    def run(self, code, **opts):
        return self.result(self.send(code, **opts))

    def with_result(self, n):
        """The event lines cell n's result file holds before the result."""
        with open(self.res_path(n), "rb") as f:
            data = f.read()
        return data[:data.rfind(b"\n") + 1]

    def events(self, n):
        """cell_out_n's events, or those the result file holds: a cell
        makes one or the other."""
        try:
            with open(os.path.join(self.cells, "cell_out_%06d" % n), "rb") as f:
                data = f.read()
        except FileNotFoundError:       # made at the first event, if any
            data = b""
        if os.path.exists(self.res_path(n)):
            more = self.with_result(n)
            if data and more:
                raise AssertionError("cell %d: events in cell_out and with "
                                     "the result" % n)
            data += more
        # strict UTF-8 and one JSON object a line
        return [json.loads(line) for line in data.decode("utf-8").splitlines()]

    def log(self):
        try:
            with open(self.path("runner.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def close(self):
        if self.alive():
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class RunnerTest(unittest.TestCase):

    def kernel(self, **kw):
        k = Kernel(**kw)
        self.addCleanup(k.close)
        self.assertTrue(k.ready, "no ready file; runner.log: " + k.log())
        return k

    # -- startup -----------------------------------------------------------

    def test_ready_file_pid_fifo_and_session(self):
        k = self.kernel(sigint_ignored=False)
        with open(k.path("ready")) as f:
            self.assertEqual(json.load(f), {"pid": k.pid})
        st = os.stat(k.path("wake"))
        self.assertTrue(stat.S_ISFIFO(st.st_mode))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
        self.assertEqual(os.getsid(k.pid), k.pid)      # own session and group
        self.assertFalse(os.path.exists(k.path("ready.tmp")))
        os.kill(k.pid, signal.SIGINT)            # before any cell: ignored
        time.sleep(0.05)
        self.assertTrue(k.alive())

    def test_shell_spawn_token_stays_out_of_env_argv_and_log(self):
        k = self.kernel(shell=True)
        with open(k.path("ready")) as f:
            self.assertEqual(json.load(f)["pid"], k.pid)   # $! is the runner
        self.assertFalse(os.path.exists(k.path("kernel.env")))
        self.assertEqual(os.getsid(k.pid), k.pid)
        r = k.run("import os, subprocess\n"
                  "print(os.environ.get('HERMES_RPC_TOKEN'))\n"
                  "print(os.environ.get('HERMES_KERNEL_ID'))\n"
                  "print(subprocess.run(['env'], capture_output=True, text=True).stdout)\n"
                  "hermes_tools._token == %r" % TOKEN)
        self.assertEqual(r["status"], "success", r)
        self.assertTrue(r["output"].startswith("None\n9f2c\n"), r["output"])
        self.assertNotIn(TOKEN, r["output"])
        self.assertTrue(r["output"].endswith("True\n"))   # the client has it
        for what in ("cmdline", "environ"):
            with open("/proc/%d/%s" % (k.pid, what), "rb") as f:
                self.assertNotIn(TOKEN.encode(), f.read(), what)
        self.assertNotIn(TOKEN, k.log())

    def test_env_fd_start_is_ready_for_a_fast_first_cell(self):
        # the module's spawn: the token comes through HERMES_ENV_FD only
        k = self.kernel(env_fd=True)
        with open("/proc/%d/environ" % k.pid, "rb") as f:
            self.assertNotIn(TOKEN.encode(), f.read())
        # what the first cell would load lazily is loaded before `ready`
        # (ctypes, for the fflush after each cell: ~2 ms on a warm pool's
        # first cell otherwise)
        with open("/proc/%d/maps" % k.pid) as f:
            self.assertTrue("/_ctypes." in f.read(), "ctypes is not loaded")
        r = k.run("print(hermes_tools._token == %r)" % TOKEN)
        self.assertEqual((r["status"], r["output"]), ("success", "True\n"), r)

    def test_isolated_mode_kernel_dir_never_shadows_the_stdlib(self):
        # `python3 -I`: no script dir on sys.path, PYTHON* env ignored.  The
        # runner adds D itself, after the stdlib: a module a cell planted in
        # D (the cwd) must not replace one the runner or a cell imports.
        marker = os.path.join(tempfile.mkdtemp(prefix="hermes_rplant_"), "hit")
        self.addCleanup(shutil.rmtree, os.path.dirname(marker), True)
        evil = ("open(%r, 'a').write(__name__ + ' ')\n"
                "print('PLANTED', __name__)\n"
                "raise ImportError('planted ' + __name__)\n" % marker)
        names = ("ast", "json", "re", "traceback", "select", "csv", "uuid",
                 "sitecustomize", "usercustomize")
        k = self.kernel(plant=dict([("%s.py" % m, evil) for m in names]
                                   + [("mine.py", "X = 'from D'\n")]),
                        env={"PYTHONPATH": "."})
        r = k.run("import ast, json, csv, uuid, sys, os\n"
                  "import hermes_tools, mine\n"
                  "print(json.dumps(ast.literal_eval('[1, 2]')))\n"
                  "print(csv.__file__.startswith(sys.base_prefix + '/lib'))\n"
                  "print(hermes_tools.__file__ == os.path.join(os.getcwd(), "
                  "'hermes_tools.py'))\n"
                  "print(mine.X, sys.flags.isolated, sys.path.count(os.getcwd()))\n"
                  "print(sys.path.index(os.getcwd()) == len(sys.path) - 1)")
        self.assertEqual(r["status"], "success", r)
        self.assertEqual(r["output"], "[1, 2]\nTrue\nTrue\nfrom D 1 1\nTrue\n")
        self.assertFalse(os.path.exists(marker), "a planted module was imported")
        self.assertNotIn("PLANTED", k.log())
        self.assertEqual(k.run("hermes_tools._token == %r" % TOKEN)["output"],
                         "True\n")

    # -- running cells -----------------------------------------------------

    def test_state_persists_and_last_expression_repr(self):
        k = self.kernel()
        r1 = k.run("x = 41\ndef f(): return 'a' * 3")
        self.assertEqual((r1["status"], r1["output"], r1["execution_count"]),
                         ("success", "", 1))
        r2 = k.run("x + 1")
        self.assertEqual((r2["output"], r2["execution_count"]), ("42\n", 2))
        self.assertEqual(k.run("f()")["output"], "'aaa'\n")
        self.assertEqual(k.run("None")["output"], "")
        self.assertEqual(k.run("print('p')")["output"], "p\n")   # no "None"
        self.assertEqual(k.run("__name__, hermes_tools.__name__")["output"],
                         "('__main__', 'hermes_tools')\n")
        self.assertIsNone(r2["error"])
        self.assertFalse(r2["ended"] or r2["state_reset"] or r2["stdout_truncated"])
        self.assertIsInstance(r2["duration_seconds"], float)

    def test_streaming_is_incremental(self):
        k = self.kernel()
        t0 = time.monotonic()
        n = k.send("import sys, time\nprint('first')\ntime.sleep(0.5)\n"
                   "sys.stdout.write('partial')\ntime.sleep(0.4)\nprint('second')")
        out = os.path.join(k.cells, "cell_out_%06d" % n)

        def has(text):
            def check():
                try:
                    with open(out) as f:
                        return text in f.read()
                except FileNotFoundError:
                    return False
            return check

        self.assertTrue(_wait_for(has('"first\\n"'), 2.0))
        self.assertLess(time.monotonic() - t0, 0.4)
        self.assertFalse(os.path.exists(k.res_path(n)))
        # a line without "\n" is flushed too, while the cell still runs
        self.assertTrue(_wait_for(has('"partial"'), 2.0))
        self.assertFalse(os.path.exists(k.res_path(n)))
        r = k.result(n)
        self.assertEqual(r["output"], "first\npartialsecond\n")
        self.assertEqual(k.events(n), [{"type": "stdout", "text": "first\n"},
                                       {"type": "stdout", "text": "partial"},
                                       {"type": "stdout", "text": "second\n"}])

    def test_print_is_one_event_and_order_is_kept(self):
        k = self.kernel()
        n = k.send("print('a', 'b')")
        k.result(n)
        self.assertEqual(k.events(n), [{"type": "stdout", "text": "a b\n"}])
        n = k.send("import sys\nsys.stdout.write('o')\nsys.stderr.write('e')\n"
                   "print('o2')\nprint('e2', file=sys.stderr)")
        k.result(n)
        self.assertEqual([(e["type"], e["text"]) for e in k.events(n)],
                         [("stdout", "o"), ("stderr", "e"),
                          ("stdout", "o2\n"), ("stderr", "e2\n")])
        # a tight loop may share writes, but never splits a print
        n = k.send("for i in range(2000): print(i)")
        k.result(n)
        ev = k.events(n)
        self.assertEqual("".join(e["text"] for e in ev),
                         "".join("%d\n" % i for i in range(2000)))
        self.assertTrue(all(e["text"].endswith("\n") for e in ev))

    def test_print_is_the_builtins(self):
        # print writes a line of str in one write(); everything it does
        # otherwise is the built-in's
        k = self.kernel()
        code = (
            "import io, pickle, sys\n"
            "print('a', 'b', sep=None, end=None)\n"
            "print(1, 'x', [2], sep='-')\n"
            "print('p', end='')\n"
            "print('q', flush=True)\n"
            "print()\n"
            "s = io.StringIO()\n"
            "print('to', 'sio', file=s)\n"
            "print(repr(s.getvalue()))\n"
            "print('e', file=sys.stderr)\n"
            "class S(str):\n"
            "    def __str__(self): return 'sub'\n"
            "print(S('x'), sep=S(':'))\n"
            "got = []\n"
            "w = sys.stdout.write\n"
            "sys.stdout.write = lambda t: got.append(t) or len(t)\n"
            "print('hid', 'den')\n"
            "sys.stdout.write = w\n"
            "print(got)\n"
            "print(print.__name__, print.__module__,"
            " pickle.loads(pickle.dumps(print)) is print)\n")
        r = k.run(code)
        self.assertEqual(r["status"], "success", r)
        self.assertEqual(r["output"],
                         "a b\n1-x-[2]\npq\n\n'to sio\\n'\nsub\n"
                         "['hid den\\n']\nprint builtins True\n"
                         "\n--- stderr ---\ne\n")
        for bad, why in (("print('a', sep=1)", "TypeError: sep must be None or a string, not int"),
                         ("print('a', end=b'')", "TypeError: end must be None or a string, not bytes")):
            r = k.run(bad)
            self.assertEqual(r["status"], "error", r)
            self.assertIn(why, r["output"])
        r = k.run("class B:\n    def __str__(self): raise ValueError('no str')\n"
                  "print('before', B())")
        self.assertEqual(r["status"], "error", r)
        self.assertIn("ValueError: no str", r["output"])
        self.assertNotIn("kernel_runner", r["output"])

    def out_text(self, k, n):
        """What cell_out_n holds so far (the cell may still run)."""
        try:
            with open(os.path.join(k.cells, "cell_out_%06d" % n), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return ""
        data = data[:data.rfind(b"\n") + 1]
        return "".join(json.loads(line).get("text", "")
                       for line in data.decode("utf-8").splitlines())

    def test_a_print_loop_shows_its_last_lines_promptly(self):
        # Prints close together share a write, never waiting for the cell
        # to end: the last ones of a loop come while the cell sleeps, or
        # computes (the flusher thread needs the GIL then).
        k = self.kernel()
        want = "".join("%d\n" % i for i in range(3000))
        for then in ("time.sleep(3)",
                     "t = time.monotonic()\nwhile time.monotonic() - t < 3: pass"):
            n = k.send("import time\nfor i in range(3000): print(i)\n" + then)
            t0 = time.monotonic()
            self.assertTrue(_wait_for(lambda: self.out_text(k, n) == want, 2.5),
                            (then, self.out_text(k, n)[-50:]))
            self.assertLess(time.monotonic() - t0, 1.5, then)
            self.assertFalse(os.path.exists(k.res_path(n)))
            k.result(n)
            self.assertEqual("".join(e["text"] for e in k.events(n)), want)

    def test_tight_loop_keeps_the_order_of_streams_and_fds(self):
        k = self.kernel()
        n = k.send("import os, sys\nfor i in range(500):\n"
                   "    print('p%d' % i)\n    _ = os.write(1, b'w%d\\n' % i)\n"
                   "    sys.stderr.write('e%d\\n' % i)\n"
                   "    _ = os.write(2, b'f%d\\n' % i)\n    print('q%d' % i, end='')\n"
                   "    print()")
        r = k.result(n)
        self.assertEqual(r["status"], "success", r)
        def runs(events):               # consecutive texts of a stream, joined
            out = []
            for t, text in events:
                if out and out[-1][0] == t:
                    out[-1][1] += text
                else:
                    out.append([t, text])
            return out
        want = []
        for i in range(500):
            want += [("stdout", "p%d\nw%d\n" % (i, i)),
                     ("stderr", "e%d\nf%d\n" % (i, i)), ("stdout", "q%d\n" % i)]
        self.assertEqual(runs((e["type"], e["text"]) for e in k.events(n)),
                         runs(want))

    def test_interrupted_print_loop_loses_and_repeats_nothing(self):
        k = self.kernel()
        n = k.send("import sys\ni = 0\nwhile True:\n    print(i)\n"
                   "    sys.stderr.write('.')\n    i += 1",
                   max_stream=1 << 30, max_output=1 << 26)
        self.assertTrue(_wait_for(lambda: len(self.out_text(k, n)) > 100000, 5))
        os.kill(k.pid, signal.SIGINT)
        r = k.result(n, 10)
        self.assertEqual(r["status"], "interrupted")
        ev = k.events(n)
        out = "".join(e["text"] for e in ev if e["type"] == "stdout")
        err = "".join(e["text"] for e in ev if e["type"] == "stderr")
        lines = out.split("\n")         # the last print may be half done
        self.assertEqual(lines[:-1], [str(i) for i in range(len(lines) - 1)])
        self.assertIn(lines[-1], ("", str(len(lines) - 1)))
        self.assertEqual(r["stdout_bytes_total"], len(out))
        dots = len(err) - len(err.lstrip("."))
        self.assertIn(dots, (len(lines) - 1, len(lines) - 2))
        self.assertIn("KeyboardInterrupt", err)
        self.assertEqual(r["output"], out + "\n--- stderr ---\n" + err)

    def test_a_forked_child_does_not_repeat_what_waited(self):
        k = self.kernel()
        r = k.run("import os, sys\nfor i in range(2000): print(i)\n"
                  "pid = os.fork()\nif pid == 0:\n    print('child')\n"
                  "    sys.stdout.flush()\n    os._exit(0)\n"
                  "os.waitpid(pid, 0)\nprint('parent')")
        self.assertEqual(r["status"], "success", r)
        out = "".join(e["text"] for e in k.events(k.n))
        want = "".join("%d\n" % i for i in range(2000))
        # the parent's buffer is flushed before the fork, not copied
        self.assertEqual(out, want + "child\nparent\n")

    def test_a_child_forked_before_any_print_shares_the_cells_file(self):
        # cell_out_N is made at the first line: a fork before it must not
        # leave parent and child each making (and replacing) their own
        k = self.kernel()
        r = k.run("import os, time\npid = os.fork()\nif pid == 0:\n"
                  "    print('child')\n    os._exit(0)\n"
                  "time.sleep(0.05)\nprint('parent')\n_ = os.waitpid(pid, 0)")
        self.assertEqual(r["status"], "success", r)
        out = "".join(e["text"] for e in k.events(k.n))
        self.assertEqual(sorted(out.splitlines()), ["child", "parent"])

    def test_fork_warns_of_a_cells_threads_not_the_runners(self):
        # Python >= 3.12 warns at a fork with threads: never for the
        # runner's own, still for one the cell started
        k = self.kernel()
        code = ("import os, sys, threading, warnings\n"
                "warnings.simplefilter('default')\n"
                "e = threading.Event()\n"
                "t = threading.Thread(target=e.wait)\n"
                "if %s: t.start()\n"
                "pid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
                "os.waitpid(pid, 0)\ne.set()\nt.is_alive() and t.join()\n"
                "print(sys.version_info >= (3, 12))")
        for own in (False, True, False):
            r = k.run(code % own)
            self.assertEqual(r["status"], "success", r)
            warned = "DeprecationWarning: This process" in r["output"]
            self.assertEqual(warned, own and r["output"].startswith("True"), r)

    def test_error_traceback_and_recovery(self):
        k = self.kernel()
        r = k.run("def f():\n    return 1 / 0\nprint('before')\nf()")
        self.assertEqual(r["status"], "error")
        self.assertEqual(r["error"], "ZeroDivisionError: division by zero")
        out, err = r["output"].split("\n--- stderr ---\n")
        self.assertEqual(out, "before\n")
        self.assertTrue(err.startswith("Traceback (most recent call last):\n"
                                       '  File "<cell>", line 4, in <module>\n'), err)
        self.assertIn('File "<cell>", line 2, in f', err)
        self.assertNotIn("kernel_runner", err)
        self.assertTrue(err.endswith("ZeroDivisionError: division by zero\n"))
        self.assertEqual(k.events(k.n)[-1]["type"], "stderr")

        r = k.run("def g(:\n  pass")
        self.assertEqual(r["status"], "error")
        self.assertTrue(r["error"].startswith("SyntaxError: "), r["error"])
        self.assertIn("\n--- stderr ---\n", r["output"])
        self.assertNotIn("kernel_runner", r["output"])

        k.run("e = ValueError('bad'); e.add_note('a note')")
        self.assertEqual(k.run("raise e")["error"], "ValueError: bad")
        self.assertEqual(k.run("print('alive')")["output"], "alive\n")

    def test_bad_request_gets_an_error_result(self):
        k = self.kernel()
        _write_atomic(os.path.join(k.cells, "cell_req_000001.json"), b"{nope")
        k.wake()
        r = k.result(1)
        self.assertEqual(r["status"], "error")
        self.assertIn("bad cell request", r["error"])
        k.n = 1
        self.assertEqual(k.run("1")["output"], "1\n")

    def test_inline_requests_in_the_wake_fifo(self):
        # Small requests come as JSON lines in the wake FIFO, files the
        # rest: one order of ids either way, several in one read, and no
        # request file made for an inline one.
        k = self.kernel()
        self.assertEqual(k.run("x = 40", inline=True)["status"], "success")
        self.assertFalse(os.path.exists(k.path("cells", "cell_req_000001.json")))
        self.assertEqual(k.run("x + 1")["output"], "41\n")
        a = json.dumps({"id": 3, "code": "x += 1"}).encode() + b"\n"
        b = json.dumps({"id": 4, "code": "print(x)"}).encode() + b"\n"
        k.say(a + b"\0" + b[:10])       # a line cut by a read comes whole
        self.assertEqual(k.result(3)["execution_count"], 3)
        k.say(b[10:])
        k.n = 4
        self.assertEqual(k.result(4)["output"], "41\n")

    def test_self_time_is_the_runners_own_cost(self):
        # make bench's second floor: a trivial cell inside the runner,
        # nothing made in any directory
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        out = subprocess.run([PYTHON, "-I", os.path.join(HERE, "kernel_runner.py"),
                              "--self-time", "200", "x = 1"], cwd=d, capture_output=True,
                             check=True, timeout=60)
        r = json.loads(out.stdout)
        self.assertEqual(r["n"], 200)
        self.assertTrue(0 < r["p50_ms"] <= r["p90_ms"] < 50, r)
        self.assertEqual(os.listdir(d), [])

    def test_bad_inline_lines_are_logged_and_passed_over(self):
        k = self.kernel()
        k.say(b"nope\n[1]\n{\"id\": 0}\n" + b"\x01" * 100 + b"\n")
        self.assertEqual(k.run("1 + 1", inline=True)["output"], "2\n")
        self.assertEqual(k.log().count("wake: not a request"), 4, k.log())
        # a request without code is the cell's error, as in a file
        k.say(json.dumps({"id": 2, "code": 1}).encode() + b"\n")
        r = k.result(2)
        self.assertEqual((r["status"], r["error"]), ("error", "bad cell request: no code"))

    def test_the_files_of_earlier_cells_go_without_a_listing(self):
        k = self.kernel()
        for i in range(3):
            k.run("print(%d)" % i, inline=i != 1)
        # the earlier cells' files go once cell 3's result is in (the
        # module was done with them when it shipped cell 3)
        left = lambda: sorted(n for n in os.listdir(k.cells)  # noqa: E731
                              if n.startswith("cell_"))
        _wait_for(lambda: len(left()) == 2)
        self.assertEqual(left(), ["cell_out_000003", "cell_res_000003.json"])

    def test_request_that_is_a_fifo_or_symlink_is_refused(self):
        # A cell shares the kernel dir: what it puts in place of a request
        # must neither hang the runner (a FIFO nobody writes, /dev/zero)
        # nor be followed (a symlink to code elsewhere).
        k = self.kernel()
        other = os.path.join(k.dir, "elsewhere.json")
        _write_atomic(other, b'{"id": 2, "code": "print(\'followed\')"}')
        plant = (lambda p: os.mkfifo(p, 0o600), lambda p: os.symlink(other, p),
                 lambda p: os.symlink("/dev/zero", p))
        for n, how in enumerate(plant, 1):
            how(os.path.join(k.cells, "cell_req_%06d.json" % n))
            k.wake()
            r = k.result(n, 3)
            self.assertEqual((r["status"], r["error"]),
                             ("error", "bad cell request: not a regular file"), n)
            self.assertEqual(r["output"], "")
        k.n = 3
        self.assertEqual(k.run("1 + 1")["output"], "2\n")

    def test_reserve_replaced_between_cells(self):
        # cells/reserve.tmp is the runner's, but a cell's thread can swap it
        # for a directory, a FIFO, or a link to a file of its own: the next
        # result is still written, and never into that file.
        k = self.kernel()
        victim = k.path("victim")
        _write_atomic(victim, b"keep me")
        keep = k.path("cells", "reserve.tmp")
        self.assertTrue(os.path.isfile(keep))
        swaps = (os.mkdir, lambda p: os.mkfifo(p, 0o600),
                 lambda p: os.symlink(victim, p), lambda p: os.link(victim, p))
        for i, swap in enumerate(swaps):
            os.unlink(keep) if not os.path.isdir(keep) else os.rmdir(keep)
            swap(keep)
            r = k.run("%d" % i)
            self.assertEqual((r["status"], r["output"]), ("success", "%d\n" % i))
            with open(victim, "rb") as f:
                self.assertEqual(f.read(), b"keep me")
        self.assertTrue(os.path.isfile(keep) and not os.path.islink(keep))

    def test_results_are_new_files_and_the_reserve_stays(self):
        # On a disk with room the reserve is not written: it stays, the
        # same file at the size a cell takes (7 x max_output + 32 KiB).
        k = self.kernel()
        keep = k.path("cells", "reserve.tmp")
        k.run("x = 1")
        st = os.stat(keep)
        for i in range(3):
            r = k.run("print(%d)" % i)
            self.assertEqual((r["status"], r["output"]), ("success", "%d\n" % i))
            now = os.lstat(keep)
            self.assertEqual((now.st_ino, stat.S_IMODE(now.st_mode)), (st.st_ino, 0o600))
            self.assertGreaterEqual(now.st_blocks * 512, 7 * 50000 + 32 * 1024)
            self.assertNotEqual(os.stat(k.res_path(k.n)).st_ino, st.st_ino)
            self.assertFalse(os.path.exists(k.res_path(k.n) + ".tmp"))

    def test_reset_clears_state(self):
        k = self.kernel()
        k.run("x = 1")
        r = k.run("x", reset=True)
        self.assertEqual(r["status"], "error")
        self.assertEqual(r["error"], "NameError: name 'x' is not defined")
        self.assertTrue(r["state_reset"])
        self.assertEqual(r["execution_count"], 2)
        r = k.run("hermes_tools.__name__")
        self.assertEqual((r["output"], r["state_reset"]), ("'hermes_tools'\n", False))

    def test_system_exit_ends_the_kernel(self):
        for code, status, error in (("raise SystemExit(3)", "error", "SystemExit: 3"),
                                    ("import sys; print('bye'); sys.exit()",
                                     "success", None)):
            k = self.kernel()
            r = k.run(code)
            self.assertEqual((r["status"], r["error"], r["ended"]),
                             (status, error, True))
            self.assertEqual(k.proc.wait(timeout=3), 0)
            self.assertTrue(os.path.isdir(k.cells))     # the module removes D
        self.assertEqual(r["output"], "bye\n")

    def test_interrupt(self):
        k = self.kernel()
        n = k.send("import time\nprint('start')\ntime.sleep(10)")
        self.assertTrue(_wait_for(
            lambda: os.path.exists(os.path.join(k.cells, "cell_out_%06d" % n))
            and k.events(n)))
        os.kill(k.pid, signal.SIGINT)
        r = k.result(n, 3)
        self.assertEqual((r["status"], r["error"]), ("interrupted", "KeyboardInterrupt"))
        self.assertIn("KeyboardInterrupt", r["output"])
        self.assertNotIn("kernel_runner", r["output"])     # the cell's frames only
        os.kill(k.pid, signal.SIGINT)            # between cells: ignored
        time.sleep(0.05)
        self.assertTrue(k.alive())
        self.assertEqual(k.run("1 + 1")["output"], "2\n")

    def test_interrupt_through_the_intr_fifo(self):
        # how the module interrupts a cell it cannot signal (a sandbox)
        k = self.kernel()
        k.run("kept = 41")
        n = k.send("import time\nprint('start')\ntime.sleep(10)")
        self.assertTrue(_wait_for(
            lambda: os.path.exists(os.path.join(k.cells, "cell_out_%06d" % n))
            and k.events(n)))
        intr = os.path.join(k.dir, "intr")
        self.assertTrue(stat.S_ISFIFO(os.lstat(intr).st_mode))
        self.assertEqual(stat.S_IMODE(os.lstat(intr).st_mode), 0o600)

        def say(text):
            fd = os.open(intr, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, text)
            os.close(fd)

        say(b"%d\n" % (n + 7))                  # another cell's id: ignored
        time.sleep(0.3)
        self.assertFalse(os.path.exists(k.res_path(n)))
        say(b"%d\n" % n)
        r = k.result(n, 3)
        self.assertEqual((r["status"], r["error"]), ("interrupted", "KeyboardInterrupt"))
        say(b"%d\n" % (n + 1))                  # before that cell: ignored
        time.sleep(0.1)
        self.assertTrue(k.alive())
        self.assertEqual(k.run("print(kept + 1)")["output"], "42\n")

    # -- output limits -----------------------------------------------------

    def test_output_truncation_head_and_tail(self):
        k = self.kernel()
        r = k.run("print('H' * 500 + 'x' * 5000 + 'T' * 700, end='')", max_output=1000)
        self.assertEqual(r["output"], "H" * 400 +
                         "\n... [output truncated: 5200 bytes omitted] ...\n" + "T" * 600)
        self.assertTrue(r["stdout_truncated"])
        self.assertFalse(r["stream_truncated"])
        self.assertEqual(r["stdout_bytes_total"], 6200)
        # across the stderr marker
        r = k.run("import sys\nprint('a' * 99)\n_ = sys.stderr.write('b' * 2000)",
                  max_output=1000)
        self.assertEqual(r["output"], "a" * 99 + "\n\n--- stderr ---\n" + "b" * 284 +
                         "\n... [output truncated: 1116 bytes omitted] ...\n" + "b" * 600)
        # never splits a UTF-8 character: 2-byte chars, odd limit
        r = k.run("print('é' * 1000, end='')", max_output=1001)
        self.assertEqual(r["output"], "é" * 200 +
                         "\n... [output truncated: 1000 bytes omitted] ...\n" + "é" * 300)
        # exactly max_output: kept whole
        r = k.run("print('z' * 999)", max_output=1000)
        self.assertEqual((r["output"], r["stdout_truncated"]), ("z" * 999 + "\n", False))

    def test_max_stream_cut_is_exact(self):
        k = self.kernel()
        n = k.send("print('x' * 600)\nprint('é' * 300)\nprint('after')", max_stream=1000)
        r = k.result(n)
        self.assertEqual(k.events(n), [
            {"type": "stdout", "text": "x" * 600 + "\n"},
            {"type": "stdout", "text": "é" * 199},      # 601 + 398 <= 1000 bytes
            {"type": "stream_truncated", "max_stream": 1000}])
        self.assertTrue(r["stream_truncated"] and r["stdout_truncated"])
        self.assertEqual(r["output"], "x" * 600 + "\n" + "é" * 300 + "\nafter\n")
        self.assertEqual(r["stdout_bytes_total"], 601 + 601 + 6)
        # ASCII: exactly max_stream bytes, the cell keeps running, and a
        # huge print neither kills the runner nor the output's head/tail
        n = k.send("import sys\nprint('y' * 1500)\nprint('q' * 10_000_000)\n"
                   "print('err', file=sys.stderr)\nprint('end')", max_stream=1000)
        r = k.result(n)
        ev = k.events(n)
        self.assertEqual(ev, [{"type": "stdout", "text": "y" * 1000},
                              {"type": "stream_truncated", "max_stream": 1000}])
        self.assertEqual(r["status"], "success")
        self.assertEqual(r["stdout_bytes_total"], 1501 + 10_000_001 + 4)
        self.assertTrue(r["output"].startswith("y" * 1500 + "\n" + "q" * 100))
        self.assertTrue(r["output"].endswith("q\nend\n\n--- stderr ---\nerr\n"))
        self.assertEqual(k.run("1")["stream_truncated"], False)

    def test_result_size_is_bounded_by_max_output(self):
        # The module reads at most 6 * max_output + 64 KiB of result: a
        # huge exception message must not make it bigger.
        k = self.kernel()
        r = k.run("raise ValueError('\\x01' * 200000)", max_output=1000)
        self.assertEqual(r["status"], "error")
        self.assertTrue(r["error"].startswith("ValueError: \x01\x01"))
        self.assertTrue(r["error"].endswith("..."))
        self.assertLessEqual(os.path.getsize(k.res_path(k.n)), 6 * 1000 + 65536)
        self.assertTrue(r["stdout_truncated"])

    def test_stdout_bytes_total_counts_utf8_stdout_only(self):
        k = self.kernel()
        r = k.run("import sys\nprint('héllo')\nprint('no', file=sys.stderr)")
        self.assertEqual(r["stdout_bytes_total"], 7)

    def test_unicode_and_lone_surrogates(self):
        k = self.kernel()
        r = k.run("import sys\nprint('héllo ✓ 🐍')\nprint('bad \\ud800 x')\n"
                  "sys.stderr.write('\\udcff\\n')\nsys.stdout.buffer.write(b'\\xff raw\\n')\n"
                  "'\\udc80'")
        self.assertEqual(r["status"], "success", r)
        self.assertTrue(r["output"].startswith("héllo ✓ 🐍\nbad \ufffd x\n\ufffd raw\n"),
                        r["output"])
        k.events(k.n)       # strict UTF-8, valid JSON lines
        with open(k.res_path(k.n), "rb") as f:
            f.read().decode("utf-8")

    # -- output from anywhere, rich results ---------------------------------

    def test_fd_output_in_order_with_prints(self):
        k = self.kernel()
        n = k.send("import os, subprocess, sys\nprint('a')\nos.system('echo x')\n"
                   "print('b')\n_ = os.write(1, b'w1\\n')\nprint('c')\n"
                   "_ = os.write(2, b'e1\\n')\nprint('e2', file=sys.stderr)\n"
                   "subprocess.run(['sh', '-c', 'echo s1; echo s2 >&2'])\nprint('d')\n"
                   "subprocess.run(['echo', 'via-fileno'], stdout=sys.stdout)\n"
                   "_ = os.write(1, b'\\xff\\n')")
        r = k.result(n)
        self.assertEqual(r["output"], "a\nx\nb\nw1\nc\ns1\nd\nvia-fileno\n\ufffd\n"
                         "\n--- stderr ---\ne1\ne2\ns2\n")
        out = "".join(e["text"] for e in k.events(n) if e["type"] == "stdout")
        self.assertEqual(out, "a\nx\nb\nw1\nc\ns1\nd\nvia-fileno\n\ufffd\n")
        self.assertEqual(r["stdout_bytes_total"], len(out.encode()))
        self.assertNotIn("w1", k.log())
        # a cell that closes fd 1 does not take it from the next one
        self.assertEqual(k.run("import os\nos.close(1)")["status"], "success")
        self.assertEqual(k.run("import os\n_ = os.write(1, b'back\\n')")["output"],
                         "back\n")

    def test_child_outliving_the_cell_and_bytes_between_cells(self):
        k = self.kernel()
        t0 = time.monotonic()
        r = k.run("import subprocess\n"
                  "subprocess.Popen(['sh', '-c', 'sleep 0.6; echo late; echo late2 >&2'])\n"
                  "print('end')")
        self.assertLess(time.monotonic() - t0, 0.5)
        self.assertEqual(r["output"], "end\n")
        self.assertTrue(_wait_for(lambda: "late\n" in k.log() and "late2\n" in k.log(), 3),
                        k.log())
        self.assertEqual(k.run("print('next')")["output"], "next\n")

    def test_fd_flood_is_cut_at_max_stream(self):
        k = self.kernel()
        t0 = time.monotonic()
        n = k.send("import os\n_ = os.write(1, b'z' * 300_000_000)\nprint('done')",
                   max_stream=1000)
        r = k.result(n, timeout=60)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertEqual(r["status"], "success")
        self.assertEqual(k.events(n), [{"type": "stdout", "text": "z" * 1000},
                                       {"type": "stream_truncated", "max_stream": 1000}])
        self.assertEqual(r["stdout_bytes_total"], 300_000_005)
        self.assertTrue(r["output"].startswith("z" * 20000 + "\n... [output truncated"))
        self.assertTrue(r["output"].endswith("z" * 1000 + "done\n"))

    def test_display_bundles(self):
        k = self.kernel()
        r = k.run("41 + 1")
        self.assertEqual((r["output"], r["displays"]), ("42\n", [{"text/plain": "42"}]))
        self.assertEqual(k.events(k.n)[-1], {"type": "display", "data": {"text/plain": "42"}})
        self.assertEqual(k.run("x = 1")["displays"], [])
        n = k.send("class H:\n"
                   "    def __repr__(self): return 'H()'\n"
                   "    def _repr_html_(self): return '<b>h</b>'\n"
                   "    def _repr_json_(self): return {'a': 1}\n"
                   "    def _repr_png_(self): return b'\\x89PNG'\n"
                   "    def _repr_markdown_(self): raise ValueError('skipped')\n"
                   "print('before')\ndisplay(H())\nprint('after')")
        r = k.result(n)
        bundle = {"text/plain": "H()", "text/html": "<b>h</b>",
                  "application/json": {"a": 1}, "image/png": "iVBORw=="}
        self.assertEqual(r["displays"], [bundle])
        self.assertEqual(r["output"], "before\nH()\nafter\n")
        ev = [(e["type"], e.get("data")) for e in k.events(n)]
        self.assertEqual([t for t, _ in ev], ["stdout", "stdout", "display", "stdout"])
        self.assertEqual(ev[2][1], bundle)

    def test_displays_are_bounded_never_silently_dropped(self):
        k = self.kernel()
        n = k.send("class P:\n"
                   "    def __repr__(self): return 'P'\n"
                   "    def _repr_png_(self): return b'x' * 30000\n"
                   "display(P())\nfor i in range(200): display(i)",
                   max_output=2000, max_stream=100000)
        r = k.result(n)
        d = r["displays"]
        self.assertEqual(d[0]["text/plain"], "P\n[image/png of 40002 bytes not shown: "
                         "over hermes_max_output (2000 bytes)]")
        self.assertNotIn("image/png", d[0])
        self.assertRegex(d[-1]["text/plain"],
                         r"^\[\d+ more display\(s\) not shown: over hermes_max_output")
        self.assertLessEqual(len(json.dumps(d[:-1], separators=(",", ":"))), 2000 + 200)
        kept = [x["text/plain"] for x in d[1:-1]]
        self.assertEqual(kept, [str(i) for i in range(len(kept))])
        # the stream has what fits in max_stream: the PNG itself
        first = [e for e in k.events(n) if e["type"] == "display"][0]
        self.assertEqual(len(first["data"]["image/png"]), 40000)

    @unittest.skipUnless(subprocess.run([PYTHON, "-c", "import matplotlib"],
                                        capture_output=True).returncode == 0,
                         "matplotlib is not installed for %s: no PNG to check" % PYTHON)
    def test_matplotlib_png(self):
        import base64
        k = self.kernel()
        n = k.send("import matplotlib, matplotlib.pyplot as plt\n"
                   "plt.plot([1, 2])\nplt.show()\nprint(matplotlib.get_backend())\n"
                   "fig = plt.figure()\nplt.plot([2, 1])", max_output=500000)
        r = k.result(n, timeout=30)
        self.assertEqual(r["status"], "success", r)
        self.assertEqual(len(r["displays"]), 3, r["output"])   # show, [Line2D], fig
        png = [d for d in r["displays"] if "image/png" in d]
        self.assertEqual(len(png), 2)
        for d in png:
            self.assertTrue(d["text/plain"].startswith("<Figure size"))
            self.assertEqual(base64.b64decode(d["image/png"])[:8], b"\x89PNG\r\n\x1a\n")
        self.assertIn("module://hermes_display\n", r["output"])
        # figures are closed after the cell: the next cell shows none
        self.assertEqual(k.run("plt.get_fignums()")["output"], "[]\n")

    def test_text_plain_display_without_matplotlib(self):
        k = self.kernel()
        r = k.run("import sys\nsys.modules['matplotlib'] = None\n"
                  "class Fig:\n    def __repr__(self): return '<Fig>'\nFig()")
        self.assertEqual(r["displays"], [{"text/plain": "<Fig>"}])

    def test_top_level_await(self):
        k = self.kernel()
        r = k.run("import asyncio\nawait asyncio.sleep(0.01)\nv = await asyncio.sleep(0, 'v')\n"
                  "print(v)\nawait asyncio.sleep(0, 7)")
        self.assertEqual((r["status"], r["output"]), ("success", "v\n7\n"), r)
        r = k.run("async def f(): return 3\nasyncio.run(f())")
        self.assertEqual(r["output"], "3\n")           # no await: asyncio.run works
        r = k.run("await asyncio.sleep(0)\nc = f()\ntry:\n    asyncio.run(c)\n"
                  "finally:\n    c.close()")
        self.assertEqual(r["status"], "error")
        self.assertIn("cannot be called from a running event loop", r["error"])
        n = k.send("import asyncio\nawait asyncio.sleep(30)")
        time.sleep(0.3)
        os.kill(k.pid, signal.SIGINT)
        r = k.result(n)
        self.assertEqual(r["status"], "interrupted")
        self.assertEqual(k.run("await asyncio.sleep(0, 'again')")["output"], "'again'\n")

    # -- files -------------------------------------------------------------

    def test_modes_and_cleanup_of_older_cells(self):
        k = self.kernel()
        self.assertEqual(k.run("open('made_by_cell', 'w').write('x')\nimport os\n"
                               "os.umask(0)\n1/0")["status"], "error")
        k.run("print(open('made_in_cell_2', 'w').write('x'))")   # umask is reset
        names = sorted(os.listdir(k.cells))
        self.assertEqual(names, ["cell_out_000002", "cell_req_000002.json",
                                 "cell_res_000002.json", "reserve.tmp"])
        self.assertTrue(os.path.isfile(k.path(".hermes_result.tmp")))
        seen = 0
        for root, dirs, files in os.walk(k.dir):
            for d in dirs:
                self.assertEqual(stat.S_IMODE(os.stat(os.path.join(root, d)).st_mode),
                                 0o700, d)
            for f in files:
                p = os.path.join(root, f)
                self.assertEqual(stat.S_IMODE(os.lstat(p).st_mode), 0o600, p)
                seen += 1
        self.assertGreaterEqual(seen, 8)

    def test_cell_that_removes_its_files_or_chdirs(self):
        k = self.kernel()
        r = k.run("import os\nprint('first')\nos.remove('cells/cell_out_000001')\n"
                  "os.remove('cells/cell_req_000001.json')\nos.chdir('/')\nprint('still')")
        self.assertEqual(r["output"], "first\nstill\n")
        r = k.run("import shutil\nshutil.rmtree(os.path.join(hermes_tools._DIR, 'cells'))")
        self.assertEqual(r["status"], "success")
        self.assertEqual(stat.S_IMODE(os.stat(k.cells).st_mode), 0o700)
        self.assertEqual(k.run("os.getcwd()")["output"], "'/'\n")

    def test_a_cell_that_prints_nothing_makes_no_output_file(self):
        k = self.kernel()
        self.assertEqual(k.run("x = 1")["status"], "success")
        self.assertNotIn("cell_out_%06d" % k.n, os.listdir(k.cells))
        self.assertEqual(k.with_result(k.n), b"")
        self.assertEqual(k.run("print('now', flush=True)\nx + 1")["output"],
                         "now\n2\n")
        self.assertIn("cell_out_%06d" % k.n, os.listdir(k.cells))
        self.assertEqual(k.with_result(k.n), b"", "one or the other")
        self.assertEqual([e["type"] for e in k.events(k.n)],
                         ["stdout", "stdout", "display"])

    def test_events_after_the_code_go_with_the_result(self):
        # A cell that made no cell_out before its code was over (its last
        # value, a traceback) makes none: the lines go into the result
        # file, before the result, its last line
        k = self.kernel()
        for code, types in (("1 + 1", ["stdout", "display"]),
                            ("1 / 0", ["stderr"]),
                            ("def f(:", ["stderr"]),
                            ("import sys\nsys.exit('bye')", ["stderr"])):
            n = k.send(code)
            r = k.result(n)
            self.assertNotIn("cell_out_%06d" % n, os.listdir(k.cells), code)
            self.assertEqual([e["type"] for e in k.events(n)], types, code)
            self.assertEqual(k.with_result(n).count(b"\n"), len(types), code)
            self.assertEqual(stat.S_IMODE(os.stat(k.res_path(n)).st_mode), 0o600)
            if code == "1 + 1":
                self.assertEqual(k.events(n)[0]["text"], "2\n")
            self.assertEqual(r["ended"], code.startswith("import sys"))

    def test_events_too_many_for_the_result_make_cell_out(self):
        # past WITH_RESULT_MAX the lines go to cell_out after all, in order
        k = self.kernel()
        n = k.send("'x' * %d" % (WITH_RESULT_MAX // 2))
        r = k.result(n)
        self.assertEqual(len(r["output"]), WITH_RESULT_MAX // 2 + 3)
        self.assertIn("cell_out_%06d" % n, os.listdir(k.cells))
        self.assertEqual(k.with_result(n), b"")
        self.assertEqual([e["type"] for e in k.events(n)], ["stdout", "display"])
        # a fork once the code is over (a thread of the cell's may) makes
        # cell_out after all, with the lines held so far first
        n = k.send("import os, sys\n"
                   "s = sys.modules['__main__']._state.current\n"
                   "def ending(orig=s.ending):\n"
                   "    s.ending = orig\n"
                   "    orig()\n"
                   "    print('held')\n"
                   "    if os.fork() == 0:\n"
                   "        os._exit(0)\n"
                   "    os.wait()\n"
                   "s.ending = ending\n7")
        self.assertEqual(k.result(n)["output"], "held\n7\n")
        self.assertIn("cell_out_%06d" % n, os.listdir(k.cells))
        self.assertEqual(k.with_result(n), b"")
        self.assertEqual([(e["type"], e.get("text")) for e in k.events(n)],
                         [("stdout", "held\n"), ("stdout", "7\n"), ("display", None)])

    def test_print_writes_its_line_at_once_whatever_it_prints(self):
        # print(42) wrote "42" and "\n" apart: the first woke the flusher
        # for a partial line.  One write now, and what the built-in wrote
        # before an argument's __str__ raised is still there
        k = self.kernel()
        r = k.run("print(42, None, 1.5, sep='|')\n"
                  "import sys\nprint(7, file=sys.stderr)")
        self.assertEqual(r["output"], "42|None|1.5\n\n--- stderr ---\n7\n")
        self.assertEqual(len(k.events(k.n)), 2)
        r = k.run("import sys\nw, calls = sys.stdout.write, []\n"
                  "sys.stdout.write = lambda s: (calls.append(s), w(s))[1]\n"
                  "print(42, None)\nsys.stdout.write = w\nprint(calls)")
        self.assertEqual(r["output"], "42 None\n['42 None\\n']\n")
        # anything else is the built-in's: what it wrote before a __str__
        # raised stays, and a __str__ that prints does so where it would
        r = k.run("class B:\n    def __str__(self): raise ValueError('no')\n"
                  "print(1, B())")
        self.assertTrue(r["output"].startswith("1 \n--- stderr ---\n"), r)
        self.assertIn("ValueError: no", r["output"])
        r = k.run("class C:\n    def __str__(self): return print('inner') or 'C'\n"
                  "print('a', C())")
        self.assertEqual(r["output"], "a inner\nC\n")
        if k.run("import sys\nhasattr(sys, 'set_int_max_str_digits')")["output"] == "True\n":
            r = k.run("sys.set_int_max_str_digits(640)\nprint(2, 10 ** 700)")
            self.assertTrue(r["output"].startswith("2 \n--- stderr ---"), r)
            self.assertIn("ValueError: Exceeds the limit (640 digits)", r["output"])

    def test_a_large_output_reuses_the_heap(self):
        # glibc gave a 1 MB print's copies back to the system after each
        # cell and the next took them again, page by page (456 faults a
        # cell); with malloc's thresholds fixed (_use_libc) the heap stays
        k = self.kernel()

        def faults():
            with open("/proc/%d/stat" % k.pid) as f:
                return int(f.read().rsplit(")", 1)[1].split()[7])

        for size in (1000000, 5 * 1024 * 1024):
            code = "print('x' * %d)" % size
            k.run(code)
            before = faults()
            for _ in range(3):
                self.assertEqual(k.run(code)["status"], "success")
            self.assertLess(faults() - before, 3 * 50, size)

    def test_the_next_results_file_replaced_by_the_cell(self):
        # .hermes_result.tmp is the next result's file, made ahead or an old
        # result reused; the cell can put its own file there, remove it,
        # or close the fd we hold
        k = self.kernel()
        k.run("x = 0")
        forged = json.dumps({"id": k.n + 1, "status": "success",
                             "output": "forged\n"})
        for code in ("import os\nopen('cells/mine', 'w').write(%r)\n"
                     "os.replace('cells/mine', '.hermes_result.tmp')" % forged,
                     "import os\nos.remove('.hermes_result.tmp')",
                     "import os\nos.remove('.hermes_result.tmp')\n"
                     "os.mkdir('.hermes_result.tmp')",
                     "import os\nos.rmdir('.hermes_result.tmp')\nx = 1",
                     "import os\nfd = os.open('.hermes_result.tmp', os.O_RDONLY)\n"
                     "os.close(sorted(int(f) for f in os.listdir('/proc/self/fd')"
                     " if os.path.realpath('/proc/self/fd/' + f) =="
                     " os.path.realpath('.hermes_result.tmp'))[0])\n"
                     "f = open('cells/other', 'w')"):
            r = k.run(code + "\nprint('real')")
            self.assertEqual((r["status"], r["output"]), ("success", "real\n"),
                             code)
            self.assertEqual(stat.S_IMODE(os.stat(k.path("cells", "cell_res_%06d.json"
                                                         % k.n)).st_mode), 0o600)
        self.assertEqual(k.run("x")["output"], "1\n")

    def test_an_old_result_the_cell_replaced_is_not_reused(self):
        # the result before the last becomes the next result's file: where
        # the cell put a link to another file, a FIFO or a directory, no
        # file but our own is written and every result still comes
        k = self.kernel()
        canary = k.path("canary")
        for code, inline in itertools.product(
                ("os.remove(old)\nos.symlink(canary, old)",
                 "os.remove(old)\nos.link(canary, old)",
                 "os.remove(old)\nos.mkfifo(old)",
                 "os.remove(old)\nos.mkdir(old)"), (True, False)):
            with open(canary, "w") as f:
                f.write("canary")
            k.run("x = 0", inline=inline)
            old = k.res_path(k.n)
            r = k.run("import os\nold, canary = %r, %r\n" % (old, canary) + code,
                      inline=inline)
            self.assertEqual(r["status"], "success", (code, r))
            for i in range(3):
                r = k.run("print(%d)" % i, inline=inline)
                self.assertEqual(r["output"], "%d\n" % i, code)
                self.assertEqual(stat.S_IMODE(os.stat(k.res_path(k.n)).st_mode),
                                 0o600)
            with open(canary) as f:
                self.assertEqual(f.read(), "canary", code)
            if os.path.isdir(old):
                os.rmdir(old)

    def test_a_reused_result_longer_than_the_next_is_cut(self):
        k = self.kernel()
        self.assertEqual(len(k.run("print('x' * 5000)")["output"]), 5001)
        for i in range(4):    # each reuses a result before it: none whole
            r = k.run("y = %d" % i, inline=i % 2 == 0)   # k.result: one JSON
            self.assertEqual((r["status"], r["output"]), ("success", ""))
            self.assertEqual(os.path.getsize(k.res_path(k.n)),
                             len(json.dumps(r, separators=(",", ":"))))

    def test_streams_outlive_cells(self):
        k = self.kernel()
        k.run("import logging, sys, threading, time\n"
              "logging.basicConfig(level=logging.INFO)\n"
              "threading.Thread(target=lambda: (time.sleep(0.2), print('late'))).start()")
        time.sleep(0.3)
        r = k.run("logging.info('hello log')")
        # the handler made in cell 1 writes into cell 2's output
        self.assertEqual(r["output"], "\n--- stderr ---\nINFO:root:hello log\n")
        self.assertIn("late", k.log())           # between cells: runner.log

    def test_idle_timeout_removes_dir_and_exits(self):
        k = self.kernel(idle=1)
        r = k.run("import time; time.sleep(0.8)")
        self.assertEqual(r["status"], "success")
        time.sleep(0.5)       # 1.3 s after spawn, 0.5 s after the cell ended
        self.assertTrue(k.alive() and os.path.isdir(k.dir))
        self.assertEqual(k.proc.wait(timeout=3), 0)
        self.assertFalse(os.path.exists(k.dir))

    # -- tool calls --------------------------------------------------------

    def test_tool_calls(self):
        k = self.kernel()
        n = k.send("r = hermes_tools.call('echo', {'a': 1})\nprint(r)\n"
                   "try:\n    hermes_tools.web_search(query='x')\n"
                   "except hermes_tools.ToolError as e:\n    print('ToolError:', e)\n"
                   "try:\n    hermes_tools.call('slow', timeout=0.05)\n"
                   "except hermes_tools.ToolError as e:\n    print('ToolError:', e)\n",
                   tools=["echo", "web_search", "slow"])

        def answer(seq, tool, args, reply):
            req = os.path.join(k.rpc, "req_%06d" % seq)
            self.assertTrue(_wait_for(lambda: os.path.exists(req)), "no " + req)
            self.assertEqual(stat.S_IMODE(os.stat(req).st_mode), 0o600)
            with open(req) as f:
                self.assertEqual(json.load(f), {"tool": tool, "args": args,
                                                "seq": seq, "token": TOKEN})
            os.unlink(req)
            _write_atomic(os.path.join(k.rpc, "res_%06d" % seq),
                          json.dumps(dict(reply, seq=seq)).encode())

        answer(1, "echo", {"a": 1}, {"ok": True, "result": {"b": 2}, "error": None})
        # the stub's schema first: none here
        answer(2, "tools/list", {}, {"ok": True, "result": [], "error": None})
        answer(3, "web_search", {"query": "x"},
               {"ok": False, "result": None, "error": "no results"})
        r = k.result(n)
        self.assertEqual(r["output"], "{'b': 2}\nToolError: no results\n"
                                      "ToolError: tool call timed out\n")
        self.assertEqual(os.listdir(k.rpc), [])    # res read and removed,
                                                   # the timed-out req withdrawn

    def test_only_enabled_tools_and_at_once(self):
        k = self.kernel()
        t0 = time.monotonic()
        r = k.run("print(sorted(n for n in dir(hermes_tools) if n.islower()))\n"
                  "try:\n    hermes_tools.rm_rf(path='/')\n"
                  "except hermes_tools.ToolError as e:\n    print(e)\n"
                  "print(hasattr(hermes_tools, 'rm_rf'))\n"
                  "try:\n    hermes_tools.call('rm_rf', {})\n"
                  "except hermes_tools.ToolNotEnabled as e:\n    print(e)\n",
                  tools=["web_search", "echo"])
        self.assertLess(time.monotonic() - t0, 3)
        msg = "tool 'rm_rf' is not enabled here; enabled tools: web_search, echo\n"
        self.assertEqual(r["output"], "['call', 'echo', 'web_search']\n" + msg
                         + "False\n" + msg, r)
        self.assertEqual(os.listdir(k.rpc), [])     # nothing was asked
        r = k.run("try:\n    hermes_tools.echo()\n"
                  "except hermes_tools.ToolError as e:\n    print(e)\n", tools=[])
        self.assertEqual(r["output"],
                         "tool 'echo' is not enabled here; enabled tools: none\n")

    def test_tool_names_that_are_not_identifiers(self):
        k = self.kernel()
        tools = ["get-sum", "web.search", "class", "3d", "a-b", "a.b", "echo"]
        n = k.send("print([n for n in dir(hermes_tools) if n.islower() "
                   "and n != 'call'])\n"
                   "print(hermes_tools.get_sum.__doc__)\n"
                   "print(hermes_tools.get_sum(a=1))\n"
                   "for n in ('a_b', 'web-search'):\n"
                   "    try:\n        getattr(hermes_tools, n)()\n"
                   "    except hermes_tools.ToolNotEnabled as e:\n"
                   "        print(type(e).__name__)\n", tools=tools)
        _answer_rpc(self, k, 1, "tools/list", [])
        self.assertEqual(_answer_rpc(self, k, 2, "get-sum", 3), {"a": 1})
        r = k.result(n)
        self.assertEqual(r["output"],
                         "['class_', 'echo', 'get_sum', 'tool_3d', 'web_search']\n"
                         "Calls the gateway's tool 'get-sum' with these arguments "
                         "(a dict, or keyword arguments).\n"
                         "3\nToolNotEnabled\nToolNotEnabled\n", r)

    SCHEMAS = [
        {"name": "get-sum", "description": "Add two integers.",
         "parameters": {"type": "object",
                        "properties": {"a": {"type": "integer",
                                             "description": "the first"},
                                       "b": {"type": "integer"}},
                        "required": ["a", "b"]}},
        {"name": "web_search", "description": "Search the web.",
         "parameters": {"type": "object",
                        "properties": {"query": {"type": "string"},
                                       "limit": {"type": "integer",
                                                 "default": 10},
                                       "max-results": {"type": "integer"},
                                       "from": {"type": "string"}},
                        "required": ["query"]}},
        {"name": "not-enabled", "parameters": {"type": "object"}},
    ]

    def test_tool_stubs_have_their_schemas_signature(self):
        k = self.kernel()
        code = (
            "import inspect\n"
            "print(hermes_tools.get_sum(1, 2))\n"
            "print(inspect.signature(hermes_tools.get_sum))\n"
            "print(inspect.signature(hermes_tools.web_search))\n"
            "print(hermes_tools.web_search('nginx', limit=5))\n"
            "print(hermes_tools.web_search(query='q', max_results=1, from_='x'))\n"
            "print(hermes_tools.web_search('q', **{'max-results': 2}))\n"
            "print(hermes_tools.get_sum({'a': 5, 'b': 6}))\n"
            "for bad in ('get_sum(1)', 'get_sum(1, 2, 3)', 'get_sum(1, b=2, c=3)',"
            " 'web_search(\\'q\\', 5)', 'get_sum(1, a=2)'):\n"
            "    try:\n        eval('hermes_tools.' + bad)\n"
            "    except TypeError as e:\n        print('TypeError', e)\n"
            "print(hermes_tools.plain.__doc__)\n"
            "help(hermes_tools)\n")
        n = k.send(code, tools=["get-sum", "web_search", "plain"])
        _answer_rpc(self, k, 1, "tools/list", self.SCHEMAS)
        self.assertEqual(_answer_rpc(self, k, 2, "get-sum", 3), {"a": 1, "b": 2})
        # only what the code passed; the tool applies its own defaults
        self.assertEqual(_answer_rpc(self, k, 3, "web_search", "r1"),
                         {"query": "nginx", "limit": 5})
        self.assertEqual(_answer_rpc(self, k, 4, "web_search", "r2"),
                         {"query": "q", "max-results": 1, "from": "x"})
        self.assertEqual(_answer_rpc(self, k, 5, "web_search", "r3"),
                         {"query": "q", "max-results": 2})
        self.assertEqual(_answer_rpc(self, k, 6, "get-sum", 11), {"a": 5, "b": 6})
        r = k.result(n)
        self.assertEqual(r["status"], "success", r)
        out = r["output"]
        self.assertTrue(out.startswith(
            "3\n(a: int, b: int)\n"
            "(query: str, *, limit: int = 10, max_results: int = None, "
            "from_: str = None)\nr1\nr2\nr3\n11\n"
            "TypeError get_sum(): missing a required argument: 'b'\n"
            "TypeError get_sum(): too many positional arguments\n"
            "TypeError get_sum(): got an unexpected keyword argument 'c'\n"
            "TypeError web_search(): too many positional arguments\n"
            "TypeError get_sum(): multiple values for argument 'a'\n"
            "Calls the gateway's tool 'plain' with these arguments "
            "(a dict, or keyword arguments).\n"), out)
        # help(): every enabled tool, its signature and its description
        # (pydoc >= 3.13 puts a long signature's parameters a line each)
        out = re.sub(r"\(\n\s+(.*?),?\n\s*\)",
                     lambda m: "(" + re.sub(r",\n\s+", ", ", m.group(1)) + ")",
                     out, flags=re.S)
        for text in ("get_sum(a: int, b: int)\n        Add two integers.",
                     "            a (integer): the first\n",
                     "web_search(query: str, *, limit: int = 10, "
                     "max_results: int = None, from_: str = None)\n"
                     "        Search the web.",
                     "max_results (integer, sent as 'max-results')",
                     "plain(args=None, /, **kwargs)"):
            self.assertIn(text, out)
        self.assertNotIn("not_enabled", out)
        self.assertEqual(os.listdir(k.rpc), [])
        # the next cell asks again (a reload may have changed them)
        n = k.send("print(hermes_tools.get_sum(a=1, b=1))", tools=["get-sum"])
        _answer_rpc(self, k, 7, "tools/list", self.SCHEMAS)
        _answer_rpc(self, k, 8, "get-sum", 2)
        self.assertEqual(k.result(n)["output"], "2\n")

    def test_tool_stubs_of_an_mcp_servers_list(self):
        # hermes_tools auto: "tools": null, the names are the list's
        k = self.kernel()
        n = k.send("print([n for n in dir(hermes_tools) if n.islower()])\n"
                   "print(hermes_tools.get_sum(2, 3))\n", tools=None)
        _answer_rpc(self, k, 1, "tools/list", self.SCHEMAS)
        self.assertEqual(_answer_rpc(self, k, 2, "get-sum", 5), {"a": 2, "b": 3})
        self.assertEqual(k.result(n)["output"],
                         "['call', 'get_sum', 'not_enabled', 'web_search']\n5\n")

    def test_a_failed_list_leaves_plain_stubs(self):
        k = self.kernel()
        n = k.send("print(hermes_tools.echo(x=1))", tools=["echo"])
        req = os.path.join(k.rpc, "req_000001")
        self.assertTrue(_wait_for(lambda: os.path.exists(req)), "no " + req)
        os.unlink(req)
        _write_atomic(os.path.join(k.rpc, "res_000001"), json.dumps(
            {"seq": 1, "ok": False, "result": None, "error": "no"}).encode())
        self.assertEqual(_answer_rpc(self, k, 2, "echo", "e"), {"x": 1})
        self.assertEqual(k.result(n)["output"], "e\n")

    def test_tools_client_outside_a_kernel(self):
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "hermes_tools_t", os.path.join(HERE, "hermes_tools.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        with self.assertRaises(mod.ToolError):
            mod.call("x")                           # no token: refuse
        self.assertEqual(mod.web_search.__name__, "web_search")
        with self.assertRaises(AttributeError):
            mod.__wrapped__


class KernelStartTest(unittest.TestCase):
    """kernel_start.py runs the shipped bytecode only where this Python
    reads it, else the source: a kernel never runs stale or foreign code."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="hermes_start_")
        self.addCleanup(shutil.rmtree, self.dir)
        shutil.copyfile(os.path.join(HERE, "kernel_start.py"),
                        os.path.join(self.dir, "kernel_start.py"))
        self._write("kernel_runner.py", "print('source', __name__)\n"
                    "if len(__import__('sys').argv) > 1: 1 / 0\n")
        # the bytecode of other code, so the output says which one ran
        other = os.path.join(self.dir, "other.py")
        with open(other, "w") as f:
            f.write("print('bytecode', __name__)\n"
                    "if len(__import__('sys').argv) > 1: 1 / 0\n")
        subprocess.run([PYTHON, "-c", "import py_compile as c, sys; c.compile("
                        "sys.argv[1], cfile=sys.argv[2], dfile='kernel_runner.py',"
                        " doraise=True, invalidation_mode="
                        "c.PycInvalidationMode.UNCHECKED_HASH)",
                        other, self.path("kernel_runner.pyc")], check=True)
        os.unlink(other)

    def path(self, name):
        return os.path.join(self.dir, name)

    def _write(self, name, text):
        with open(self.path(name), "w") as f:
            f.write(text)

    def start(self, *args):
        return subprocess.run([PYTHON, "-I", "kernel_start.py", *args],
                              cwd=self.dir, capture_output=True, text=True)

    def test_bytecode_of_this_python_runs_as_main(self):
        r = self.start()
        self.assertEqual((r.returncode, r.stdout, r.stderr),
                         (0, "bytecode __main__\n", ""))

    def test_tracebacks_name_the_runner(self):
        r = self.start("fail")
        self.assertEqual(r.returncode, 1)
        self.assertIn('File "kernel_runner.py", line 2', r.stderr)
        self.assertIn("ZeroDivisionError", r.stderr)

    def test_no_bytecode_runs_the_source(self):
        os.unlink(self.path("kernel_runner.pyc"))
        r = self.start()
        self.assertEqual((r.returncode, r.stdout), (0, "source __main__\n"))

    def test_another_pythons_bytecode_runs_the_source(self):
        with open(self.path("kernel_runner.pyc"), "r+b") as f:
            magic = f.read(4)
            f.seek(0)
            f.write(bytes([magic[0] ^ 1]) + magic[1:])
        r = self.start()
        self.assertEqual((r.returncode, r.stdout), (0, "source __main__\n"))

    def test_short_bytecode_runs_the_source(self):
        with open(self.path("kernel_runner.pyc"), "wb") as f:
            f.write(b"\x00")
        r = self.start()
        self.assertEqual((r.returncode, r.stdout), (0, "source __main__\n"))


def _tiny_wheel(d, name="hermes_tiny", value=42):
    """A pure-Python wheel made here (a zip with a .dist-info): pip installs
    it with no index and no network."""
    import base64
    import hashlib
    import zipfile
    dist = "%s-1.0.dist-info" % name
    files = {
        "%s/__init__.py" % name: "VALUE = %d\n" % value,
        dist + "/METADATA": "Metadata-Version: 2.1\nName: %s\nVersion: 1.0\n" % name,
        dist + "/WHEEL": ("Wheel-Version: 1.0\nGenerator: test_remote\n"
                          "Root-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    record = []
    for path, text in files.items():
        digest = hashlib.sha256(text.encode()).digest()
        record.append("%s,sha256=%s,%d" % (
            path, base64.urlsafe_b64encode(digest).rstrip(b"=").decode(),
            len(text.encode())))
    files[dist + "/RECORD"] = "\n".join(record + [dist + "/RECORD,,"]) + "\n"
    whl = os.path.join(d, "%s-1.0-py3-none-any.whl" % name)
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return whl


def _has_pip(python):
    return subprocess.run([python, "-m", "pip", "--version"],
                          stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


class SitePackagesTest(unittest.TestCase):
    """Packages installed at run time: D/site-packages is on sys.path (the
    runner runs -I: no user site for `pip install --user`)."""

    kernel = RunnerTest.kernel

    def site(self, k):
        return k.path("site-packages")

    def test_site_packages_on_sys_path_after_the_stdlib(self):
        k = self.kernel()
        st = os.lstat(self.site(k))
        self.assertTrue(stat.S_ISDIR(st.st_mode))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o700)
        r = k.run("import os, sys\n"
                  "site = os.environ['HERMES_SITE_PACKAGES']\n"
                  "i = sys.path.index(site)\n"
                  "print(site == os.path.join(os.getcwd(), 'site-packages'))\n"
                  "print(sys.path.count(site))\n"
                  "print(i > sys.path.index(os.path.dirname(os.__file__)))\n"
                  "print(all(i < j for j, p in enumerate(sys.path)\n"
                  "          if p.endswith(('site-packages', 'dist-packages'))\n"
                  "          and p != site))")
        self.assertEqual((r["status"], r["output"]),
                         ("success", "True\n1\nTrue\nTrue\n"), r)

    def test_package_put_there_is_importable_in_the_next_cell(self):
        # what pip --target does, by hand: runs on any python, pip or not
        k = self.kernel()
        r = k.run("import hermes_by_hand")
        self.assertEqual(r["status"], "error", r)
        pkg = os.path.join(self.site(k), "hermes_by_hand")
        os.mkdir(pkg)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write("VALUE = 7\n")
        r = k.run("import hermes_by_hand, os\nprint(hermes_by_hand.VALUE, "
                  "hermes_by_hand.__file__.startswith(os.environ['HERMES_SITE_PACKAGES'] + '/'))")
        self.assertEqual((r["status"], r["output"]), ("success", "7 True\n"), r)

    def test_removed_or_a_link_out_of_d_is_taken_off_sys_path(self):
        k = self.kernel()
        out = tempfile.mkdtemp(prefix="hermes_rout_")
        self.addCleanup(shutil.rmtree, out, True)
        os.mkdir(os.path.join(out, "hermes_outside"))
        open(os.path.join(out, "hermes_outside", "__init__.py"), "w").close()
        r = k.run("import os\nos.rmdir('site-packages')\n"
                  "os.symlink(%r, 'site-packages')" % out)
        self.assertEqual(r["status"], "success", r)
        r = k.run("import sys, os\n"
                  "print(os.environ['HERMES_SITE_PACKAGES'] in sys.path)\n"
                  "import hermes_outside")
        self.assertTrue(r["output"].startswith("False\n"), r)
        self.assertIn("ModuleNotFoundError", r["error"], r)
        r = k.run("import os\nos.unlink('site-packages')\n"
                  "os.mkdir('site-packages')")
        self.assertEqual(r["status"], "success", r)
        r = k.run("import os, sys\n"
                  "print(sys.path.count(os.environ['HERMES_SITE_PACKAGES']))")
        self.assertEqual((r["status"], r["output"]), ("success", "1\n"), r)

    @unittest.skipUnless(_has_pip(PYTHON),
                         "no pip for %s: the wheel's install is not tested" % PYTHON)
    def test_pip_install_target_in_a_cell(self):
        d = tempfile.mkdtemp(prefix="hermes_rwheel_")
        self.addCleanup(shutil.rmtree, d, True)
        whl = _tiny_wheel(d)
        k = self.kernel()
        # the same cell imports it too: the directory was there at start
        code = ("import os, subprocess, sys\n"
                "p = subprocess.run([sys.executable, '-m', 'pip', 'install',"
                " '--no-index', '--no-deps', '--no-cache-dir',"
                " '--disable-pip-version-check', '--quiet',"
                " '--target', os.environ['HERMES_SITE_PACKAGES'], %r],"
                " stdout=subprocess.PIPE, stderr=subprocess.STDOUT)\n"
                "print(p.returncode, p.stdout.decode()[-2000:])\n"
                "import hermes_tiny\nprint(hermes_tiny.VALUE)" % whl)
        r = k.result(k.send(code), timeout=60)
        self.assertEqual(r["status"], "success", r)
        self.assertTrue(r["output"].startswith("0 "), r)
        self.assertTrue(r["output"].endswith("42\n"), r)
        # and the next, with its metadata
        r = k.run("import hermes_tiny, importlib.metadata as m\n"
                  "print(hermes_tiny.VALUE, m.version('hermes_tiny'))")
        self.assertEqual((r["status"], r["output"]), ("success", "42 1.0\n"), r)


class ToolsClientTest(unittest.TestCase):
    """hermes_tools.py alone: its own copy in a temp kernel dir, so its
    seq starts at 1, with the response waiting before the call."""

    def client(self):
        d = tempfile.mkdtemp(prefix="hermes_rtools_")
        self.addCleanup(shutil.rmtree, d, True)
        os.mkdir(os.path.join(d, "rpc"), 0o700)
        shutil.copyfile(os.path.join(HERE, "hermes_tools.py"),
                        os.path.join(d, "hermes_tools.py"))
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "hermes_tools_c", os.path.join(d, "hermes_tools.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod._token = TOKEN
        return mod, os.path.join(d, "rpc")

    def answer(self, raw):
        mod, rpc = self.client()
        _write_atomic(os.path.join(rpc, "res_000001"), raw)
        try:
            return ("ok", mod.call("t", {}, timeout=2))
        except mod.ToolError as e:
            return ("ToolError", str(e))

    def test_response_that_is_a_fifo_or_symlink_is_refused(self):
        import threading
        for kind in ("fifo", "symlink"):
            mod, rpc = self.client()
            res = os.path.join(rpc, "res_000001")
            if kind == "fifo":
                os.mkfifo(res, 0o600)
            else:
                _write_atomic(os.path.join(rpc, "elsewhere"),
                              b'{"seq":1,"ok":true,"result":"followed","error":null}')
                os.symlink(os.path.join(rpc, "elsewhere"), res)
            got = []

            def run():
                try:
                    got.append(("ok", mod.call("t", {}, timeout=2)))
                except mod.ToolError as e:
                    got.append(("ToolError", str(e)))

            t = threading.Thread(target=run, daemon=True)
            t.start()
            t.join(3)
            if t.is_alive():                    # stuck in open(): free it
                os.close(os.open(res, os.O_WRONLY | os.O_NONBLOCK))
                t.join(3)
                self.fail("the client hung on a %s response" % kind)
            self.assertEqual(got, [("ToolError", "malformed tool response")], kind)
            self.assertFalse(os.path.lexists(res))

    def test_the_wait_is_woken_not_polled(self):
        import threading
        mod, rpc = self.client()
        mod.POLL_FIRST = mod.POLL_MAX = 30.0     # a poll would sleep 30 s

        def answer():
            time.sleep(0.2)
            _write_atomic(os.path.join(rpc, "res_000001"),
                          b'{"seq":1,"ok":true,"result":5,"error":null}')

        threading.Thread(target=answer, daemon=True).start()
        t0 = time.monotonic()
        self.assertEqual(mod.call("t", {}, timeout=60), 5)
        self.assertLess(time.monotonic() - t0, 5)

    def test_archived_answer(self):
        mod, rpc = self.client()
        d = os.path.dirname(rpc)
        os.mkdir(os.path.join(d, "tool_results"), 0o700)
        _write_atomic(os.path.join(d, "tool_results", "a.json"), b'{"big": [1, 2]}')
        _write_atomic(os.path.join(rpc, "res_000001"), json.dumps(
            {"seq": 1, "ok": True, "result": None, "error": None,
             "archived": {"path": "tool_results/a.json", "bytes": 15,
                          "head": '{"big"', "tail": "2]}"}}).encode())
        r = mod.call("t", {}, timeout=2)
        self.assertIsInstance(r, mod.LargeResult)
        self.assertEqual(r.path, os.path.join(d, "tool_results", "a.json"))
        self.assertEqual((r["bytes"], r["head"], r["tail"]), (15, '{"big"', "2]}"))
        self.assertEqual(r.load(), {"big": [1, 2]})

    def test_good_responses(self):
        self.assertEqual(self.answer(b'{"seq":1,"ok":true,"result":[1],"error":null}'),
                         ("ok", [1]))
        self.assertEqual(self.answer(b'{"seq":1,"ok":false,"result":null,"error":"no"}'),
                         ("ToolError", "no"))
        self.assertEqual(self.answer(b'{"seq":1,"ok":false}'),
                         ("ToolError", "tool call failed"))

    def test_seq_must_be_this_calls_integer(self):
        bad = ("ToolError", "malformed tool response")
        for seq in ('2', '0', 'true', '1.0', '"1"', 'null', '[1]'):
            raw = ('{"seq":%s,"ok":true,"result":"stolen","error":null}' % seq)
            self.assertEqual(self.answer(raw.encode()), bad, raw)
        raw = b'{"ok":true,"result":"stolen","error":null}'          # no seq
        self.assertEqual(self.answer(raw), bad)

    def test_ok_must_be_a_json_boolean(self):
        bad = ("ToolError", "malformed tool response")
        for ok in ('"false"', '"true"', '1', '0', 'null', '[]', '{}'):
            raw = '{"seq":1,"ok":%s,"result":"r","error":"e"}' % ok
            self.assertEqual(self.answer(raw.encode()), bad, raw)
        self.assertEqual(self.answer(b'{"seq":1,"result":"r","error":"e"}'), bad)
        for err in ('5', '{"a":1}', '["e"]', 'true'):    # error: string or null
            raw = '{"seq":1,"ok":false,"result":null,"error":%s}' % err
            self.assertEqual(self.answer(raw.encode()), bad, raw)
        for raw in (b'[1]', b'"x"', b'{nope', b'\xff'):
            self.assertEqual(self.answer(raw), bad, raw)



class DiskFullTest(unittest.TestCase):
    """The kernel dir on a small tmpfs of its own, filled up (ENOSPC)."""

    SIZE = 4 << 20

    def setUp(self):
        self.mnt = tempfile.mkdtemp(prefix="hermes_rfull_")
        self.addCleanup(os.rmdir, self.mnt)
        p = subprocess.run(["mount", "-t", "tmpfs", "-o",
                            "size=%d,mode=0700" % self.SIZE, "tmpfs", self.mnt],
                           capture_output=True)
        if p.returncode != 0:
            self.skipTest("cannot mount a tmpfs to fill (needs root): %s"
                          % p.stderr.decode(errors="replace").strip())
        self.addCleanup(subprocess.run, ["umount", "-l", self.mnt])

    def kernel(self):
        k = Kernel(root=self.mnt)
        self.addCleanup(k.close)
        self.assertTrue(k.ready, "no ready file; runner.log: " + k.log())
        return k

    def fill(self, name):
        # Like another process on the kernel host: every byte taken.
        fd = os.open(os.path.join(self.mnt, name), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, bytes(65536))
        except OSError as e:
            self.assertEqual(e.errno, errno.ENOSPC)
        finally:
            os.close(fd)
        self.addCleanup(lambda: os.path.exists(os.path.join(self.mnt, name))
                        and os.unlink(os.path.join(self.mnt, name)))

    FILL = ("import os\n"
            "fd = os.open('fill', os.O_WRONLY | os.O_CREAT)\n"
            "try:\n"
            "    while True: os.write(fd, bytes(65536))\n"
            "except OSError as e:\n"
            "    err = e.errno\n"
            "os.close(fd)\n")

    def assertDiskFull(self, r, stopped=True):
        self.assertEqual(r["status"], "error", r)
        self.assertTrue(r["error"].startswith(
            "the kernel host's disk is full (No space left on device): "), r["error"])
        if stopped:
            self.assertTrue(r["error"].endswith(
                "the cell was stopped when its output could not be written"), r["error"])

    def test_full_disk_ends_the_cell_promptly_and_keeps_the_kernel(self):
        k = self.kernel()
        self.assertEqual(k.run("x = 41")["status"], "success")
        t0 = time.monotonic()
        # one write: print's pieces (of an int) are writes of their own,
        # and on a busy machine the flusher may take the first ones (after
        # PARTIAL_DELAY) and fail, before the rest come
        n = k.send(self.FILL + "print('after fill %d' % err)\nprint('not reached')\n")
        r = k.result(n, 10)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertDiskFull(r)
        self.assertTrue(r["output"].startswith("after fill 28\n"), r["output"])
        self.assertIn("OSError: [Errno 28] the kernel host's disk is full", r["output"])
        self.assertTrue(r["output"].endswith('File "<cell>", line 8, in <module>\n'
                                             "OSError: [Errno 28] the kernel host's disk "
                                             "is full (No space left on device): the "
                                             "cell's output cannot be written\n"), r["output"])
        self.assertNotIn("not reached", r["output"])
        k.events(n)                          # whole JSON lines only
        self.assertFalse(os.path.exists(k.res_path(n) + ".tmp"))
        # a disk full before the cell starts: the kept reserve answers
        # (cell 2's files go first, or the runner's cleanup frees space)
        os.unlink(k.path("fill"))
        for name in os.listdir(k.cells):
            if name.startswith("cell_"):
                os.unlink(os.path.join(k.cells, name))
        # the runner keeps its reserve again once there is room
        reserve = os.path.join(k.cells, "reserve.tmp")
        self.assertTrue(_wait_for(lambda: os.path.exists(reserve)
                                  and os.stat(reserve).st_blocks * 512
                                  >= 64 * 1024, 5), "no reserve kept")
        k.n += 1
        _write_atomic(os.path.join(k.cells, "cell_req_%06d.json" % k.n),
                      json.dumps({"id": k.n, "code": "print(x)\n"
                                  "print('not reached')"}).encode())
        self.fill("other")
        t0 = time.monotonic()
        k.wake()
        r = k.result(k.n)
        self.assertLess(time.monotonic() - t0, 3)
        self.assertDiskFull(r)
        self.assertTrue(r["output"].startswith("41\n"), r["output"])
        self.assertNotIn("not reached", r["output"])
        # space again: the same kernel, its globals intact
        os.unlink(os.path.join(self.mnt, "other"))
        r = k.run("print(x + 1)")
        self.assertEqual((r["status"], r["output"], r["execution_count"]),
                         ("success", "42\n", 4), r)
        self.assertEqual(k.events(k.n), [{"type": "stdout", "text": "42\n"}])
        self.assertTrue(k.alive())

    def test_full_disk_result_takes_the_reserve(self):
        # The result is a new file while there is room; on a full disk the
        # kept reserve becomes the result, and is kept again once there is
        # room.  With a directory in its place, a file of the cell's own.
        k = self.kernel()
        reserve = os.path.join(k.cells, "reserve.tmp")
        self.assertEqual(k.run("x = 1")["status"], "success")
        ino = os.stat(reserve).st_ino
        n = k.send(self.FILL + "print('filled', err)")
        r = k.result(n, 10)
        self.assertDiskFull(r)
        self.assertEqual(os.stat(k.res_path(n)).st_ino, ino)
        self.assertFalse(os.path.exists(k.res_path(n) + ".tmp"))
        os.unlink(k.path("fill"))
        self.assertTrue(_wait_for(lambda: os.path.isfile(reserve), 5), "no reserve kept")
        os.unlink(reserve)
        os.mkdir(reserve)
        n = k.send(self.FILL + "print('filled', err)")
        r = k.result(n, 10)
        self.assertDiskFull(r)
        self.assertFalse(os.path.exists(k.res_path(n) + ".tmp"))
        self.assertTrue(os.path.isdir(reserve))
        os.unlink(k.path("fill"))
        os.rmdir(reserve)
        r = k.run("print(x)")
        self.assertEqual((r["status"], r["output"]), ("success", "1\n"))

    def test_a_cell_that_swallows_the_errors_is_still_stopped(self):
        k = self.kernel()
        k.run("import time")
        for loop in ("while True:\n"                  # print in try, no sleep
                     "    try:\n        print('y' * 100)\n"
                     "    except Exception:\n        pass\n",
                     "while True:\n"                  # swallows BaseException too
                     "    try:\n        print('z')\n"
                     "    except BaseException:\n        pass\n"
                     "    time.sleep(0.01)\n",
                     "try:\n    print('once')\n"     # then blocks in sleep
                     "except Exception:\n    pass\n"
                     "time.sleep(60)\n"):
            t0 = time.monotonic()
            r = k.run(self.FILL + loop + "print('not reached')", timeout=10)
            self.assertLess(time.monotonic() - t0, 3, loop)
            self.assertDiskFull(r)
            self.assertIn("HostDiskFull: the kernel host's disk is full", r["output"])
            self.assertNotIn("kernel_runner", r["output"])
            self.assertNotIn("not reached", r["output"])
            os.unlink(k.path("fill"))
        r = k.run("time.__name__")
        self.assertEqual((r["status"], r["output"]), ("success", "'time'\n"))

    def test_half_a_line_never_stays_in_cell_out(self):
        k = self.kernel()
        # leave ~100 KB free, then print 300 KB: some event lines fit
        n = k.send(self.FILL + "os.truncate('fill', os.path.getsize('fill') - 100000)\n"
                   "print('w' * 300000)\nprint('not reached')")
        r = k.result(n, 10)
        self.assertDiskFull(r)
        ev = k.events(n)                     # strict: every line whole JSON
        self.assertTrue(ev, "no event fitted")
        self.assertTrue(all(e == {"type": "stdout", "text": "w" * 65536} for e in ev), ev)
        with open(os.path.join(k.cells, "cell_out_%06d" % n), "rb") as f:
            self.assertTrue(f.read().endswith(b"\n"))
        os.unlink(k.path("fill"))
        self.assertEqual(k.run("print('ok')")["output"], "ok\n")

    def test_result_too_big_for_the_reserve_is_cut_to_fit(self):
        k = self.kernel()
        # 300 KB of control characters: 1.8 MB of JSON, over the 1 MiB
        # reserve; the stream is cut early, so only the result hits ENOSPC
        n = k.send("print('\\x01' * 300000)\n" + self.FILL,
                   max_output=400000, max_stream=1000)
        r = k.result(n, 10)
        self.assertEqual(r["status"], "error")
        self.assertEqual(r["error"], "the kernel host's disk is full (No space "
                         "left on device): the cell's result was cut to fit")
        self.assertLessEqual(os.path.getsize(k.res_path(n)), 1 << 20)
        self.assertTrue(r["stdout_truncated"])
        self.assertRegex(r["output"], r"^\x01+\n\.\.\. \[output truncated: "
                         r"\d+ bytes omitted\] \.\.\.\n\x01+\n$")
        self.assertGreater(len(r["output"]), 100000)
        os.unlink(k.path("fill"))
        self.assertEqual(k.run("print('ok')")["output"], "ok\n")

    def test_reserve_falls_back_to_writing_zeros(self):
        # A filesystem without fallocate (EOPNOTSUPP): zeros are written,
        # as far as the disk allows.
        import importlib.util
        from unittest import mock
        d = tempfile.mkdtemp(prefix="hermes_rkernel_", dir=self.mnt)
        for name in ("kernel_runner.py", "hermes_tools.py"):
            shutil.copyfile(os.path.join(HERE, name), os.path.join(d, name))
        path = list(sys.path)
        self.addCleanup(setattr, sys, "path", path)
        spec = importlib.util.spec_from_file_location(
            "kernel_runner_t", os.path.join(d, "kernel_runner.py"))
        kr = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kr)
        nosup = OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        with mock.patch.object(os, "posix_fallocate", side_effect=nosup) as pf:
            fd = os.open(os.path.join(d, "r"), os.O_WRONLY | os.O_CREAT, 0o600)
            kr._allocate(fd, 200000)
            st = os.fstat(fd)
            self.assertEqual(st.st_size, 200000)
            self.assertGreaterEqual(st.st_blocks * 512, 200000)   # not sparse
            self.fill("fill")
            kr._allocate(fd, self.SIZE * 2)     # stops at ENOSPC, no raise
            self.assertLess(os.fstat(fd).st_size, self.SIZE)
            os.close(fd)
            self.assertTrue(pf.called)
        with open(os.path.join(d, "r"), "rb") as f:
            self.assertEqual(f.read(200000), bytes(200000))


if __name__ == "__main__":
    unittest.main()
