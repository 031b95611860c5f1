#!/usr/bin/env bash
# Prints, for every test that failed in the given `go test -v` reports, the
# lines the test itself wrote (file_test.go:N: …), without the node logs an
# e2e failure dumps after them. .ci/run calls it when a step fails, so the
# end of CI's output names what failed and why, not the last node's log.
set -uo pipefail
for report in "$@"; do
	[[ -f $report ]] || continue
	awk -v report="$report" '
		/^=== RUN   / { name = $3; buf[name] = ""; next }
		/^ *--- FAIL: / {
			n = $3
			printf "== %s: %s failed\n", report, n
			printf "%s", buf[n]
			next
		}
		/^ +[A-Za-z0-9_]+_test\.go:[0-9]+: / {
			if ($0 ~ /--- last lines of /) next
			line = substr($0, 1, 400)
			buf[name] = buf[name] line "\n"
		}
	' "$report" | tail -n 60
done
