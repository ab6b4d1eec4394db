# Orders names longest first by recorded times, for hack/go-test-shards.sh
# (tests) and hack/go-test-longest-first.sh (packages). Input: the recorded
# times, "SECONDS NAME" a line, then the names to order, "- NAME" a line. A
# name without a time counts as the mean of the recorded ones (1 s when
# none is recorded); the given order is kept among equal times (a stable
# insertion sort), so a first run, with none recorded, keeps it whole.
# Output: the names, one a line; with -v groups=N, the names dealt out in
# that order, each to the group with the least time so far and, among
# groups of equal time, the fewest names: with nothing recorded (a fresh
# clone, a new machine) every name weighs the same and the groups get as
# many names each (all at 0 s, they once all went to the first group).
$1 != "-" { d[$2] = $1; next }
!($2 in seen) { seen[$2] = 1; order[++m] = $2 }
END {
	k = 0; sum = 0
	for (x in d) { k++; sum += d[x] }
	mean = k && sum > 0 ? sum / k : 1
	for (i = 1; i <= m; i++) {
		x = order[i]; w[x] = (x in d) ? d[x] : mean
		for (j = i; j > 1 && w[sorted[j-1]] < w[x]; j--) sorted[j] = sorted[j-1]
		sorted[j] = x
	}
	if (!groups) {
		for (i = 1; i <= m; i++) print sorted[i]
		exit
	}
	for (s = 0; s < groups; s++) { load[s] = 0; names[s] = 0 }
	for (i = 1; i <= m; i++) {
		best = 0
		for (s = 1; s < groups; s++) if (load[s] < load[best] || (load[s] == load[best] && names[s] < names[best])) best = s
		load[best] += w[sorted[i]]; names[best]++
		g[best] = g[best] ? g[best] "|" sorted[i] : sorted[i]
	}
	for (s = 0; s < groups; s++) print g[s]
}
