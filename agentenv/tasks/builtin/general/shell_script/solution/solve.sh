cat > /workspace/{{ script }} <<'SH'
#!/bin/sh
grep -c -- '{{ word }}' "$1" || true
SH
chmod +x /workspace/{{ script }}
