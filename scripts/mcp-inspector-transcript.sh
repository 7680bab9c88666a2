#!/bin/sh
# Drive `airlock mcp` with an MCP client nobody on this project wrote (the
# MCP inspector's CLI mode, from npm) and record what it says, for
# test/e2e/testdata/mcp-inspector-transcript.txt. Needs root, node and npm.
#   sudo ./scripts/mcp-inspector-transcript.sh [AIRLOCK_BINARY]
set -eu
cd "$(dirname "$0")/.."
bin=${1:-/usr/local/bin/airlock}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The sessions' logs go with the rest, not into the user's state directory.
export XDG_STATE_HOME="$work/state"
mkdir "$work/proj"
printf 'def add(a, b):\n    return a - b\n' > "$work/proj/calc.py"
printf 'from calc import add\nassert add(2, 3) == 5, "add(2, 3) should be 5"\nprint("all tests pass")\n' > "$work/proj/test_calc.py"
out=test/e2e/testdata/mcp-inspector-transcript.txt
call() {
	echo
	echo "\$ npx @modelcontextprotocol/inspector@2.12.0 --cli airlock mcp --workspace PROJECT $*"
	npx -y @modelcontextprotocol/inspector@2.12.0 --cli "$bin" mcp --workspace "$work/proj" "$@" 2>/dev/null | sed "s#$work#PROJECT#g"
}
{
	echo "# airlock mcp driven by the MCP inspector's CLI mode (npm @modelcontextprotocol/inspector@2.12.0), $(date -u +%Y-%m-%d)"
	echo "# each call is a session of its own: a sandbox is made for it and destroyed after"
	call --method tools/list
	call --method resources/templates/list
	call --method tools/call --tool-name run_command --tool-arg "command=python3 -B test_calc.py"
	call --method tools/call --tool-name read_file --tool-arg path=calc.py
	call --method tools/call --tool-name read_file --tool-arg path=missing.py
	call --method tools/call --tool-name edit_file --tool-arg path=calc.py --tool-arg old_string=a --tool-arg new_string=b
} > "$out"
echo "wrote $out" >&2
