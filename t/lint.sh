#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# The linters of `make lint` and t/001-lint.t, from Debian's packages
# (LINT_PKGS in the Makefile): shellcheck on every shell script, cppcheck
# on the module's C, pyflakes on every Python file.  Any finding fails.
#
#   t/lint.sh [shellcheck|cppcheck|pyflakes]...     none given: all three
#
# cppcheck reads nginx's headers as `make module` configured them (build/;
# build-asan/ where only `make asan` did).
# A finding that is no bug is suppressed where it is, with its reason
# (/* cppcheck-suppress ID ; why */, # shellcheck disable=SCnnnn  # why),
# or, when it is about the tool rather than a line, in .cppcheck-suppressions.
set -u
cd "$(dirname "$0")/.." || exit 1

# Ours: not the build trees, nor what a package build leaves in debian/.
own_files() {
    find . \( -path ./.git -o -path ./build -o -path ./build-asan \
        -o -path ./run -o -path ./t/unit/build \
        -o -path ./debian/libnginx-mod-http-hermes -o -path ./debian/.debhelper \
        -o -path ./debian/tmp \) -prune -o -type f -print | sed 's|^\./||' | sort
}

shell_scripts() {
    own_files | while IFS= read -r f; do
        case $f in
            *.sh) echo "$f" ;;
            *.t|*.pl|*.pm|*.py|*.c|*.h|*.md|*.png|*.html) ;;
            *) head -n 1 "$f" 2>/dev/null | grep -Eq \
                   '^#![[:space:]]*/(usr/)?bin/(env[[:space:]]+)?(ba|da)?sh([[:space:]]|$)' \
                   && echo "$f" ;;
        esac
    done
}

need() {
    command -v "$1" >/dev/null && return 0
    echo "lint: $1 is not installed (Debian's package $2: make lint installs it)" >&2
    return 1
}

run_shellcheck() {
    need shellcheck shellcheck || return 1
    local files
    mapfile -t files < <(shell_scripts)
    echo "lint: shellcheck, ${#files[@]} scripts"
    shellcheck -- "${files[@]}"
}

run_cppcheck() {
    need cppcheck cppcheck || return 1
    local b
    for b in build build-asan ""; do
        [ -f "$b/nginx/ngx_auto_config.h" ] && [ -d "$b/src/src/core" ] && break
    done
    if [ -z "$b" ]; then
        echo "lint: cppcheck needs nginx configured in build/ (make module)" >&2
        return 1
    fi
    local h=$b/src/src files
    mapfile -t files < <(own_files | grep -E '^(src/[^/]*|ngx_hermes_module)\.c$')
    echo "lint: cppcheck, ${#files[@]} files"
    # One configuration, nginx's as configured (every #ifdef's would take
    # ten times as long); --library=posix knows the calls it makes.
    cppcheck -q -j 2 --error-exitcode=1 --std=c11 --library=posix \
        --enable=warning,performance,portability --max-configs=1 \
        --suppress=toomanyconfigs --inline-suppr \
        --suppressions-list=.cppcheck-suppressions \
        -I src -I "$b/nginx" -I "$h/core" -I "$h/event" \
        -I "$h/os/unix" -I "$h/http" -I "$h/http/modules" -I "$h/http/v2" \
        "${files[@]}"
}

run_pyflakes() {
    need pyflakes3 pyflakes3 || return 1
    local files
    mapfile -t files < <(own_files | grep -E '\.py$')
    echo "lint: pyflakes, ${#files[@]} files"
    pyflakes3 "${files[@]}"
}

[ $# -gt 0 ] || set -- shellcheck cppcheck pyflakes
rc=0
for linter in "$@"; do
    case $linter in
        shellcheck) run_shellcheck || rc=1 ;;
        cppcheck) run_cppcheck || rc=1 ;;
        pyflakes) run_pyflakes || rc=1 ;;
        *) echo "lint: no linter $linter (shellcheck, cppcheck, pyflakes)" >&2
           exit 2 ;;
    esac
done
exit $rc
