#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Prints src/ngx_hermes_registry.c with the body of
# ngx_http_hermes_registry_lookup() replaced by a linear walk of the LRU
# queue: the same answers, O(n) per lookup.  registry_scale over this copy
# must fail its "lookup cost flat" test; that shows the test can fail.
# Exits non-zero if the function is not found (the source changed shape).

use strict;
use warnings;

local $/;
my $src = <>;

my $linear = <<'EOF';
{
    ngx_queue_t             *q;
    ngx_http_hermes_node_t  *kn;

    /* MUTANT (t/unit/mutant_linear.pl): linear, not the tree */

    for (q = ngx_queue_head(&zone->sh->lru);
         q != ngx_queue_sentinel(&zone->sh->lru);
         q = ngx_queue_next(q))
    {
        kn = ngx_queue_data(q, ngx_http_hermes_node_t, queue);

        if (kn->node.key == hash
            && ngx_memn2cmp(key->data, kn->data, key->len, kn->key_len) == 0)
        {
            return kn;
        }
    }

    return NULL;
}
EOF

my $n = ($src =~ s{
    (\nngx_http_hermes_registry_lookup\(ngx_http_hermes_zone_t\s*\*zone,
     \s*ngx_str_t\s*\*key,\s*\w+\s+hash\)\n)
    \{\n.*?\n\}\n
}{$1$linear}sx);

die "mutant_linear.pl: ngx_http_hermes_registry_lookup() not found\n"
    unless $n == 1;

print $src;
