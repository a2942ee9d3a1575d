#!/usr/bin/env bash
# pkglayers.sh: the packages' layers, from their imports (tests excluded).
# Fails, naming each import, when
#  - the libraries (userfaultfd/, rdma/, pool/, pager/, swapfs/, client/,
#    spin/, procinfo/) import the daemons' assembly or the command lines (rmem/internal/…,
#    rmem/cmd/…): process-wide state and wiring belong to the daemons;
#  - a leaf (spin, pager/remote, procinfo) imports another rmem package;
#  - the stores and consumers under the pager (pager/slabio, pager/poolstore,
#    pager/pagertest, swapfs) import rmem/pager for its types (pager/remote
#    has them);
#  - anything imports rmem/cmd/….
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
bad=$($GO list -f '{{.ImportPath}} {{join .Imports " "}}' ./... | awk '
  function lib(p) { return p ~ /^rmem\/(userfaultfd|rdma|pool|pager|swapfs|client|spin|procinfo)(\/|$)/ }
  function leaf(p) { return p == "rmem/spin" || p == "rmem/pager/remote" || p == "rmem/procinfo" }
  function under(p) { return p ~ /^rmem\/(pager\/(slabio|poolstore|pagertest)|swapfs)$/ }
  { for (i = 2; i <= NF; i++) { d = $i
      if (d !~ /^rmem\//) continue
      if (d ~ /^rmem\/cmd\//) print $1 " -> " d "  (a command line)"
      else if (lib($1) && d ~ /^rmem\/internal\//) print $1 " -> " d "  (a library into internal/)"
      else if (leaf($1)) print $1 " -> " d "  (a leaf imports rmem)"
      else if (under($1) && d == "rmem/pager") print $1 " -> " d "  (types are in rmem/pager/remote)"
  } }')
if [ -n "$bad" ]; then
	echo "pkglayers: imports that break the packages' layers:"
	echo "$bad"
	exit 1
fi
