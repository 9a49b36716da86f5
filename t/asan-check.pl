#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Reads AddressSanitizer logs (make test-asan) and fails on any memory
# error, and on any leak whose stack passes through the module or the
# libraries it calls. nginx itself does not free its worker arrays at exit;
# those leaks have no module frame and are not ours.

use strict;
use warnings;

my ($errors, $leaks, $ignored) = (0, 0, 0);

for my $file (@ARGV) {
    next unless -f $file;
    open my $fh, "<", $file or die "$file: $!";
    local $/;
    my $log = <$fh>;

    for my $report (split /(?==+\n==\d+==ERROR: )/, $log) {
        next unless $report =~ /==\d+==ERROR: (\S+)/;
        if ($1 ne 'LeakSanitizer:') {
            print "$file:\n$report\n";
            $errors++;
            next;
        }
        for my $leak (split /\n(?=(?:Direct|Indirect) leak of)/, $report) {
            next unless $leak =~ /^(?:Direct|Indirect) leak of/;
            if ($leak =~ /ngx_http_hermes|hermes_module|yajl_|sodium|libssh|ssh_/) {
                print "$file:\n$leak\n\n";
                $leaks++;
            } else {
                $ignored++;
            }
        }
    }
}

print "asan: $errors error(s), $leaks leak(s) in the module,"
    . " $ignored nginx-internal leak(s) ignored\n";
exit(($errors || $leaks) ? 1 : 0);
