"""Tests for hermes_relay.py beyond one clean channel (see RelayTest in
test_remote.py): what the relay does when its channel goes away.

    cd src/remote && /usr/bin/python3 -m unittest -v test_relay
"""

import os
import signal
import subprocess
import time
import unittest

from test_remote import Kernel, PYTHON, _wait_for


def _exited(pid):
    """Gone, or a zombie its new parent has not reaped."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


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
        sh = subprocess.Popen(
            ["sh", "-c", "%s '%s' %d %d 0 >'%s' </dev/null & echo $!; wait"
             % (PYTHON, k.path("hermes_relay.py"), n, k.pid, out)],
            stdout=subprocess.PIPE)
        self.addCleanup(sh.wait)
        self.addCleanup(sh.stdout.close)
        relay = int(sh.stdout.readline())
        self.addCleanup(lambda: _exited(relay) or os.kill(relay, signal.SIGKILL))
        self.assertTrue(_wait_for(lambda: os.path.exists(out)
                                  and os.path.getsize(out) > 0),
                        "the relay streams the cell")
        time.sleep(0.2)
        self.assertFalse(_exited(relay), "the relay waits for the quiet cell")
        sh.kill()
        self.assertTrue(_wait_for(lambda: _exited(relay), timeout=2.0),
                        "the relay exits once its parent is gone")
        self.assertTrue(k.alive(), "the kernel runs on")
        with open(out, "rb") as f:
            self.assertIn(b'"start\\n"', f.read())


if __name__ == "__main__":
    unittest.main()
