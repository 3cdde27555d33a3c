#!/usr/bin/env bash
# ab.sh compares two builds of the library's test binary on a shared, noisy machine: it runs
# them alternately, ROUNDS times each, so that whatever else the machine does falls on both, and
# writes one file per build for benchstat.
#
#   go test -c -o /tmp/a/sw.test .     # at the old commit
#   go test -c -o /tmp/b/sw.test .     # at the new one
#   bench/scripts/ab.sh /tmp/a/sw.test /tmp/b/sw.test 6 'BenchmarkPair$' -test.count 2
#   benchstat old=/tmp/ab/<tag>.a.txt new=/tmp/ab/<tag>.b.txt
#
# The two files are named after each binary's directory; extra flags go to both binaries.
set -euo pipefail
if [ $# -lt 4 ]; then
	echo "usage: $0 OLD.test NEW.test ROUNDS BENCH-REGEXP [test flags...]" >&2
	exit 2
fi
old=$1 new=$2 rounds=$3 pat=$4
shift 4
out=${AB_OUT:-/tmp/ab}
tag=$(date -u +%Y%m%dT%H%M%S)
mkdir -p "$out"
for _ in $(seq 1 "$rounds"); do
	for b in "$old" "$new"; do
		"$b" -test.run '^$' -test.bench "$pat" -test.benchmem "$@" >>"$out/$tag.$(basename "$(dirname "$b")").txt"
	done
done
echo "$out/$tag"
