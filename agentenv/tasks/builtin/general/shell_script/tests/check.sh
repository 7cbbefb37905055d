#!/bin/bash
# Hidden check: run the agent's script on fresh files and compare with grep's count.
set -u
script="$1"; word="$2"
[ -x "$script" ] || { echo "not executable: $script"; exit 1; }
dir=$(mktemp -d)
printf 'a %s b\nnothing\n%s%s\nx\n' "$word" "$word" "$word" > "$dir/one.txt"
printf 'none here\n' > "$dir/two.txt"
printf '%s\n' "$word" "$word" "$word" "no" "$word" > "$dir/three.txt"
for f in one two three; do
  want=$(grep -c -- "$word" "$dir/$f.txt")
  got=$("$script" "$dir/$f.txt" 2>/dev/null | tr -d '[:space:]')
  [ "$got" = "$want" ] || { echo "$f: got '$got', want '$want'"; exit 1; }
done
echo ok
