# SPDX-License-Identifier: BSD-2-Clause
"""Tests for hermes_files.py, run as the module runs it: the script on
stdin after its length, its arguments on argv, a piece of a file at a time.

    cd src/remote && /usr/bin/python3 -m unittest -v test_files
"""

import os
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"
LOADER = ("import sys;i=sys.stdin.buffer;"
          "exec(compile(i.read(int(i.readline())),\"hermes_files.py\",\"exec\"))")
NONCE = "0123456789abcdef"

with open(os.path.join(HERE, "hermes_files.py"), "rb") as _f:
    SCRIPT = _f.read()


class FilesTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hermes-files-")
        self.dir = os.path.join(self.tmp, "k")
        os.mkdir(self.dir, 0o700)
        self.canary = os.path.join(self.tmp, "canary")
        with open(self.canary, "wb") as f:
            f.write(b"canary")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def run_files(self, *args, data=b""):
        stdin = b"%d\n" % len(SCRIPT) + SCRIPT + data
        p = subprocess.run([PYTHON, "-I", "-c", LOADER] + [str(a) for a in args],
                           input=stdin, capture_output=True, timeout=30)
        return p.returncode, p.stdout, p.stderr

    def get(self, path, offset, count, limit=1 << 20):
        return self.run_files("get", self.dir, path, -1, limit, offset, count)

    def put(self, path, offset, total, data, limit=1 << 20, nonce=NONCE):
        return self.run_files("put", self.dir, path, -1, limit, offset, total,
                              nonce, data=data)

    def test_get_in_pieces_each_after_the_same_line(self):
        body = bytes(range(256)) * 40
        with open(os.path.join(self.dir, "f"), "wb") as f:
            f.write(body)
        got, heads = b"", set()
        for off in range(0, len(body), 3000):
            rc, out, err = self.get("f", off, 3000)
            self.assertEqual(rc, 0, err)
            head, _, piece = out.partition(b"\n")
            heads.add(head)
            got += piece
        self.assertEqual(got, body)
        self.assertEqual(len(heads), 1)
        self.assertTrue(heads.pop().startswith(b"%d:" % len(body)))

    def test_get_over_the_bound_is_3_and_no_bytes(self):
        with open(os.path.join(self.dir, "f"), "wb") as f:
            f.write(b"x" * 101)
        rc, out, _ = self.get("f", 0, 1000, limit=100)
        self.assertEqual((rc, out), (3, b""))

    def test_get_refuses_links_and_fifos(self):
        os.symlink(self.canary, os.path.join(self.dir, "l"))
        os.mkfifo(os.path.join(self.dir, "p"))
        for name in ("l", "p"):
            rc, out, _ = self.get(name, 0, 10)
            self.assertEqual((rc, out), (4, b""), name)

    def test_put_in_pieces_renames_with_the_last(self):
        body = os.urandom(10000)
        for off in range(0, len(body), 4096):
            rc, _, err = self.put("sub/f", off, len(body), body[off:off + 4096])
            self.assertEqual(rc, 0, err)
            done = off + 4096 >= len(body)
            self.assertEqual(os.path.exists(os.path.join(self.dir, "sub", "f")), done)
        with open(os.path.join(self.dir, "sub", "f"), "rb") as f:
            self.assertEqual(f.read(), body)
        self.assertEqual(os.listdir(os.path.join(self.dir, "sub")), ["f"])
        self.assertEqual(os.stat(os.path.join(self.dir, "sub", "f")).st_mode & 0o777, 0o600)

    def test_put_pieces_only_in_order(self):
        rc, _, _ = self.put("f", 0, 30, b"a" * 10)
        self.assertEqual(rc, 0)
        rc, _, _ = self.put("f", 20, 30, b"c" * 10)      # a gap
        self.assertEqual(rc, 4)
        rc, _, _ = self.put("f", 10, 30, b"b" * 10)
        self.assertEqual(rc, 0)

    def test_put_over_the_bound_leaves_nothing(self):
        rc, _, _ = self.put("f", 0, 101, b"x" * 101, limit=100)
        self.assertEqual(rc, 3)
        rc, _, _ = self.put("f", 0, 50, b"x" * 60)       # more than said
        self.assertEqual(rc, 3)
        self.assertEqual(os.listdir(self.dir), [])

    def test_abort_removes_a_half_put(self):
        self.put("f", 0, 20, b"x" * 10)
        self.assertEqual(len(os.listdir(self.dir)), 1)
        rc, _, _ = self.run_files("abort", self.dir, "f", -1, 100, NONCE)
        self.assertEqual(rc, 0)
        self.assertEqual(os.listdir(self.dir), [])

    def test_a_bad_nonce_or_a_planted_temp_is_refused(self):
        rc, _, _ = self.put("f", 0, 3, b"abc", nonce="../../canary.tmp0")
        self.assertEqual(rc, 4)
        os.symlink(self.canary, os.path.join(self.dir, "f.%s.tmp" % NONCE))
        rc, _, _ = self.put("f", 0, 3, b"abc")
        self.assertNotEqual(rc, 0)
        rc, _, _ = self.put("f", 6, 9, b"abc")
        self.assertNotEqual(rc, 0)
        with open(self.canary, "rb") as f:
            self.assertEqual(f.read(), b"canary")

    def test_paths_that_leave_the_dir_are_refused(self):
        os.symlink(self.tmp, os.path.join(self.dir, "up"))
        for path in ("../canary", "/etc", "up/canary", "a//b", "./x"):
            rc, out, _ = self.get(path, 0, 10)
            self.assertEqual((rc, out), (4, b""), path)


if __name__ == "__main__":
    unittest.main()
