#!/usr/bin/env bash
# Runs every Fuzz* function of the module briefly (default 20000 inputs each;
# pass a count such as 200000x or a duration such as 1m).
# go test -fuzz accepts one fuzz target per package per run, so loop.
set -euo pipefail
fuzztime=${1:-20000x}
cd "$(dirname "$0")/.."
status=0
while IFS= read -r line; do
	file=${line%%:*}
	fn=$(sed -E 's/.*func (Fuzz[A-Za-z0-9_]*).*/\1/' <<<"$line")
	pkg=$(dirname "$file")
	echo "fuzz: $pkg $fn for $fuzztime"
	if ! ${GO:-go} test -run='^$' -fuzz="^${fn}\$" -fuzztime="$fuzztime" "$pkg"; then
		status=1
	fi
done < <(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' . | grep -v '^./bin/' | sort)
exit $status
