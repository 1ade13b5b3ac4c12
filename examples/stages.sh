# Sourced by the example scripts: `stage NAME COMMAND...` runs COMMAND with its output in
# $ROOT/NAME.log (shown, and the script stopped, when it fails) and appends its wall time
# to $ROOT/times.txt.
now() { python -c 'import time; print(time.time())'; }

stage() {
  local name=$1 start
  shift
  start=$(now)
  "$@" > "$ROOT/$name.log" 2>&1 || { cat "$ROOT/$name.log"; exit 1; }
  python -c 'import sys, time; print(f"{sys.argv[1]:<18} {time.time() - float(sys.argv[2]):6.1f} s")' \
    "$name" "$start" | tee -a "$ROOT/times.txt"
}
