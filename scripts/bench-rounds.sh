# Sourced by the CPU benchmark scripts (bench-validate.sh,
# cpu-validate-cold.sh): runs in rounds whose order rotates, and their table.

# bench_build sets mp to $MOEPREP_BIN, or else to this tree's moeprep built
# into $work, and base to $MOEPREP_BASE (an older build to run beside it,
# or none).
bench_build() {
	mp=${MOEPREP_BIN:-}
	if [ -z "$mp" ]; then
		go build -o "$work/moeprep" ./cmd/moeprep
		mp="$work/moeprep"
	fi
	base=${MOEPREP_BASE:-}
}

# bench_run RUN: one run's "wall user sys rss_MB", timed by the caller's
# measure CMD...: cat (the first run, the yardstick) of the caller's files,
# or validate --device cpu of its src and dst by this build ($mp) or, as
# validate@base, an older one ($base); VALIDATE_ARGS replaces --device cpu
# (VALIDATE_ARGS=--bytes: the byte proof alone).
bench_run() {
	local args
	read -r -a args <<<"${VALIDATE_ARGS:---device cpu}"
	case $1 in
	cat) measure cat "${files[@]}" ;;
	validate) measure "$mp" validate -q "${args[@]}" "$src" "$dst" ;;
	validate@base) measure "$base" validate -q "${args[@]}" "$src" "$dst" ;;
	esac
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# bench_rounds ROUNDS RUN...: runs every RUN (the first is the one the
# others are compared with, cat) ROUNDS times, the order rotated each round,
# through bench_run RUN, which prints "wall user sys rss_MB";
# then prints a row a RUN: the median wall, its ratio to the first run's
# median (x_cat), the median of the per-round ratios (paired: the shared
# disk's speed drifts over minutes), peak RSS and every raw figure. A row
# starts with $BENCH_ROW where that is set.
bench_rounds() {
	local rounds=$1 run r i s u y m med pr first
	shift
	local runs=("$@")
	first=${runs[0]}
	local -A secs=() raw=() rss=() ratios=() round=()
	for r in $(seq "$rounds"); do
		round=()
		for i in $(seq 0 $((${#runs[@]} - 1))); do
			run=${runs[$(((i + r) % ${#runs[@]}))]}
			read -r s u y m < <(bench_run "$run")
			secs[$run]+="$s "
			round[$run]=$s
			raw[$run]+="$s/$u/$y "
			rss[$run]=$((${rss[$run]:-0} > m ? ${rss[$run]:-0} : m))
		done
		for run in "${runs[@]}"; do
			ratios[$run]+="$(awk -v a="${round[$run]}" -v b="${round[$first]}" 'BEGIN { printf "%.4f", a/b }') "
		done
	done
	local cat_med
	cat_med=$(tr ' ' '\n' <<<"${secs[$first]}" | grep . | median)
	for run in "${runs[@]}"; do
		med=$(tr ' ' '\n' <<<"${secs[$run]}" | grep . | median)
		pr=$(tr ' ' '\n' <<<"${ratios[$run]}" | grep . | median)
		[ -n "${BENCH_ROW:-}" ] && printf '%-14s ' "$BENCH_ROW"
		awk -v n="$run" -v s="$med" -v c="$cat_med" -v p="$pr" -v m="${rss[$run]}" -v raw="${raw[$run]}" \
			'BEGIN { printf "%-14s %8.2f %6.2f %7.2f %7d   %s\n", n, s, s/c, p, m, raw }'
	done
}
