# Sourced by the set-up scripts (bootstrap, ensure-*): one line per step, a progress indicator while it runs,
# and the step's full output (installer warnings and all) only when it fails; it is kept in var/setup/ either
# way. QBROKER_VERBOSE=1 shows every command's output as it comes instead.
# Usage: run_step "installing RabbitMQ with apt-get" apt-get install -y rabbitmq-server
# Status lines go to stderr, so a script's stdout stays its answer (bin/ensure-osm-data prints a directory).

STEPS_LOG_DIR="${QBROKER_SETUP_LOGS:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/var/setup}"

run_step() {
  local what=$1 status=0 started=$SECONDS pid tick=0 spinner='|/-\' log head
  shift
  if [ -n "${QBROKER_VERBOSE:-}" ]; then
    echo "$what" >&2
    "$@"
    return
  fi
  mkdir -p "$STEPS_LOG_DIR"
  log="$STEPS_LOG_DIR/$(printf '%s' "$what" | tr -c 'A-Za-z0-9' '-' | cut -c1-60).log"
  "$@" >"$log" 2>&1 </dev/null &
  pid=$!
  if [ -t 2 ]; then  # a terminal: a spinner and the seconds so far, on the step's own line
    while kill -0 "$pid" 2>/dev/null; do
      printf '\r%s %s (%ds)' "${spinner:tick++%4:1}" "$what" $((SECONDS - started)) >&2
      sleep 0.2
    done
    printf '\r\033[K' >&2
    head="$what:"
  else  # a log or a pipe: the step's name, then a dot every 5 seconds until it ends
    printf '%s ' "$what" >&2
    while kill -0 "$pid" 2>/dev/null; do
      sleep 0.2
      if [ $((++tick % 25)) = 0 ]; then printf '.' >&2; fi
    done
    head=""
  fi
  wait "$pid" || status=$?
  if [ "$status" = 0 ]; then
    printf '%s done (%ds)\n' "$head" $((SECONDS - started)) >&2
    return 0
  fi
  printf '%s FAILED (exit status %d); its output:\n' "$head" "$status" >&2
  cat "$log" >&2
  printf '%s: FAILED (exit status %d); the output above is kept in %s\n' "$what" "$status" "$log" >&2
  return "$status"
}
