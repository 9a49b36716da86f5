# SPDX-License-Identifier: BSD-2-Clause
"""What runs in a kernel's python (kernel_runner.py, hermes_tools.py) must
work on any CPython >= 3.8 (an environment's image brings its own): a
static check, without vermin.  Its grammar is parsed as 3.8's, and the
names of the stdlib that came after 3.8, or went by 3.13, are refused.
Not everything (dict | dict needs types): test_remote.py run on the old
python itself is the proof; this catches the usual slips at lint time.

    python3 t/lib/check-py38.py FILE...     prints each finding, exits 1
"""

import ast
import sys

# modules added after 3.8, or removed by 3.13 (PEP 594, PEP 632, imp)
MODULES = {
    "zoneinfo", "graphlib", "tomllib",
    "imp", "distutils", "asynchat", "asyncore", "smtpd", "cgi", "cgitb",
    "crypt", "pipes", "telnetlib", "imghdr", "sndhdr", "nntplib", "spwd",
    "sunau", "uu", "xdrlib", "mailcap", "msilib", "nis", "ossaudiodev",
    "chunk", "audioop", "aifc", "lib2to3",
}

# attributes added after 3.8 (mod.attr, or any object's method)
ATTRS = {
    "removeprefix", "removesuffix", "bit_count", "pairwise", "batched",
    "lcm", "to_thread", "TaskGroup", "unparse", "orig_argv",
    "stdlib_module_names", "waitstatus_to_exitcode", "pidfd_open",
    "eventfd", "splice", "get_annotations", "is_relative_to",
    "randbytes", "file_digest", "add_note", "set_int_max_str_digits",
    "ParamSpec", "TypeAlias", "TypeGuard", "Self", "LiteralString",
    "Never", "Unpack", "TypeVarTuple", "override", "reveal_type",
}
MOD_ATTRS = {
    ("functools", "cache"), ("sys", "exception"), ("asyncio", "timeout"),
    ("asyncio", "Runner"), ("operator", "call"), ("inspect", "markcoroutinefunction"),
}
BUILTINS = {"aiter", "anext", "EncodingWarning", "ExceptionGroup",
            "BaseExceptionGroup", "PythonFinalizationError"}
GENERIC = {"list", "dict", "tuple", "set", "frozenset", "type"}


def check(path):
    with open(path, encoding="utf-8") as f:
        src = f.read()
    try:
        tree = ast.parse(src, path, feature_version=(3, 8))
    except SyntaxError as e:
        return ["%s:%s: not 3.8's grammar: %s" % (path, e.lineno, e.msg)]
    found = []

    def bad(node, what):
        found.append("%s:%d: %s (newer than 3.8, or gone by 3.13)"
                     % (path, node.lineno, what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in MODULES:
                    bad(node, "import " + a.name)
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            if node.level == 0 and top in MODULES:
                bad(node, "from %s import" % node.module)
            for a in node.names:
                if a.name in ATTRS or (top, a.name) in MOD_ATTRS:
                    bad(node, "from %s import %s" % (node.module, a.name))
        elif isinstance(node, ast.Attribute):
            base = node.value.id if isinstance(node.value, ast.Name) else None
            if node.attr in ATTRS or (base, node.attr) in MOD_ATTRS:
                bad(node, "." + node.attr)
        elif isinstance(node, ast.Name) and node.id in BUILTINS:
            bad(node, node.id)
        elif isinstance(node, ast.Subscript):
            # list[int]: a TypeError on 3.8, in annotations too (evaluated)
            if isinstance(node.value, ast.Name) and node.value.id in GENERIC:
                bad(node, "%s[...]" % node.value.id)
        elif isinstance(node, ast.Call):
            for k in node.keywords:
                if (k.arg == "strict" and isinstance(node.func, ast.Name)
                        and node.func.id == "zip"):
                    bad(node, "zip(strict=)")
    return found


def main():
    found = [f for path in sys.argv[1:] for f in check(path)]
    for f in found:
        print(f)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
