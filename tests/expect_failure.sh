#!/bin/sh
# expect_failure.sh REGEX CMD [ARGS...]
# Passes when CMD exits non-zero and its stderr matches the extended REGEX.
regex=$1
shift
err=$("$@" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -eq 0 ]; then
  echo "expected a failure, but '$*' exited 0" >&2
  exit 1
fi
if ! printf '%s\n' "$err" | grep -Eq -- "$regex"; then
  printf 'exit %s, but stderr does not match /%s/:\n%s\n' "$rc" "$regex" "$err" >&2
  exit 1
fi
exit 0
