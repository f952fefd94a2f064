#!/usr/bin/env bash
# Run the doc-drift tests against the docs of another commit, to show what they catch there:
#
#   tests/unit/docs_drift_at.sh d5bde57            # that commit's README.md and docs/, today's code
#   tests/unit/docs_drift_at.sh --old-code d5bde57  # that commit's docs and code together
#
# The tree is exported with `git archive` into a scratch directory (removed afterwards) and
# the tests read it through DOCS_DRIFT_ROOT; nothing in the checkout changes. The doctor
# sample test runs the installed doctor against createos-local either way. Exit status: 0 when
# some test failed (the drift was caught), 1 when every test passed on those docs.
set -euo pipefail
cd "$(dirname "$0")/../.."
old_code=0
if [ "${1:-}" = --old-code ]; then old_code=1; shift; fi
commit=${1:?usage: $0 [--old-code] COMMIT}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if [ "$old_code" = 1 ]; then
  git archive "$commit" | tar -x -C "$scratch"
else
  git archive HEAD | tar -x -C "$scratch"
  rm -rf "$scratch/docs" "$scratch/README.md"
  git archive "$commit" README.md docs | tar -x -C "$scratch"
fi
echo "docs of $(git rev-parse --short "$commit"), code of $([ "$old_code" = 1 ] && git rev-parse --short "$commit" || echo "HEAD ($(git rev-parse --short HEAD))")"
set +e
DOCS_DRIFT_ROOT=$scratch "${PYTHON:-.venv/bin/python}" -m pytest -q -p no:cacheprovider -o addopts= -rf --tb=no \
  tests/unit/test_docs_messages.py tests/unit/test_docs_settings.py tests/cli/test_doctor_sample.py
rc=$?
set -e
if [ "$rc" = 1 ]; then echo "the drift tests caught the docs of $commit (failures above)"; exit 0; fi
echo "the drift tests did not fail on the docs of $commit (pytest exit $rc)"
exit 1
