# Helpers shared by benchmarks/gpu_check.sh and benchmarks/gpu_check_compile.sh (sourced, not run).
# Expects REPO, OUT, SUMMARY and BUDGET_S; each step's log, last JSON line and status go under $OUT, and the summary
# ($SUMMARY) is rewritten after every step, so a killed run still leaves partial results.
START=$(date +%s)
STEPS=()

elapsed() { echo $(( $(date +%s) - START )); }

# record NAME STATUS SECONDS: append to the summary (a JSON object of steps) and rewrite it
record() {
  STEPS+=("\"$1\": {\"status\": \"$2\", \"seconds\": $3, \"log\": \"$1.log\", \"json\": \"$1.json\"}")
  { echo "{\"repo_commit\": \"$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)\","
    echo " \"elapsed_s\": $(elapsed), \"steps\": {"
    local i; for i in "${!STEPS[@]}"; do
      [ "$i" -gt 0 ] && echo ","
      echo "  ${STEPS[$i]}"
    done
    echo " }}"; } > "$SUMMARY"
}

# step NAME TIMEOUT_S COMMAND...: run with a timeout (capped by the remaining budget), keep the last JSON line
step() {
  local name="$1" limit="$2"; shift 2
  local left=$(( BUDGET_S - $(elapsed) ))
  if [ "$left" -lt 30 ]; then
    echo "== $name: skipped (budget spent)"; record "$name" "skipped_budget" 0; return
  fi
  [ "$limit" -gt "$left" ] && limit="$left"
  echo "== $name (timeout ${limit}s, elapsed $(elapsed)s)"
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep '^{' "$OUT/$name.log" | tail -n 1 > "$OUT/$name.json" || true
  [ -s "$OUT/$name.json" ] || rm -f "$OUT/$name.json"
  local status="ok"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status="timeout"; elif [ "$rc" -ne 0 ]; then status="failed_rc$rc"; fi
  tail -n 4 "$OUT/$name.log"
  record "$name" "$status" $(( $(date +%s) - t0 ))
}
