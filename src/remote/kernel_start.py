# SPDX-License-Identifier: BSD-2-Clause
"""A kernel's first program: runs kernel_runner.py in this module's place.

From kernel_runner.pyc, its bytecode compiled when the module was built,
where this Python reads that bytecode (the same magic number, the same
minor version); else from kernel_runner.py, compiled here.  A new kernel's
start is then about 30 ms shorter: compiling the runner's source was the
largest part of its own start that is the runner's.  Both files come
from the gateway, like this one, in the kernel's own directory.
"""
import marshal
from _frozen_importlib_external import MAGIC_NUMBER

try:
    with open("kernel_runner.pyc", "rb") as f:
        code = f.read()
except OSError:
    code = b""
if code[:4] == MAGIC_NUMBER:
    # the header's 16 bytes: magic, flags, source hash
    code = marshal.loads(memoryview(code)[16:])
else:
    with open("kernel_runner.py", "rb") as f:
        code = compile(f.read(), "kernel_runner.py", "exec")
del f, marshal, MAGIC_NUMBER
exec(code)
