#!/usr/bin/env bash
# Browser check of the static HTML golden report (harness/parity/render/html.py).
#
# Renders a report from a seeded synthetic verdict with findings (fail, stale,
# info, a hostile key), opens it in headless Chromium from file:// (no server),
# takes a screenshot and dumps the DOM, and checks that the key elements are
# there. Installs Debian's chromium when it is missing (needs root + apt).
#
#   ci/check_html_report.sh [OUT_DIR]      # default OUT_DIR: a fresh temp dir
#
# Leaves OUT_DIR/report.html, report.png, report.dom.html; exit 0 when all checks pass.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
OUT=${1:-$(mktemp -d -t html-report.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
    echo "[html-report] installing chromium (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
    CHROMIUM=$(command -v chromium)
fi

"$PY" - "$OUT/report.html" <<'EOF'
import copy, sys
from harness.parity import compare
from harness.parity.render import render
from harness.parity.synthetic import Scale, synthetic_surfaces

scale = Scale(policy_ranks=4, rollout_ranks=2, iterations=8, operators_per_phase=6, collectives_per_step=5,
              metrics=4, prompts=2, generations=2, layout=(("tp", 2), ("cp", 1), ("dp", 1), ("pp", 2)))
golden = synthetic_surfaces("html_demo", scale=scale, seed=7)
for n, body in enumerate(golden["training"]["sections"].values()):
    body["metrics"].update({"loss": 1.2 * 0.8 ** n - 0.05, "reward": 0.2 + 0.07 * n, "grad_norm": 3.0 / (1 + 0.4 * n)})
actual = copy.deepcopy(golden)
steps = actual["training"]["sections"]
for n, sid in enumerate(sorted(steps)):
    m = steps[sid]["metrics"]
    if n >= 4:
        m["loss"] += 0.15 * (n - 3)            # diverges: fail
    m["reward"] *= 1 + 2e-6                    # inside the default band: probable stale golden
ops = actual["operators"]["sections"]["policy/rank00001"]["phases"]["train/step2"]["operators"]
ops["aten::op_002"] += 3
ops["<script>alert('x')</script>"] = 1         # hostile key: must come out escaped
coll = actual["collectives"]["sections"]["policy/rank00003"]["phases"]["train/step1"]["collectives"]
coll[1] = ["all_to_all_single", "ep", "bfloat16", 12]
actual["memory"]["sections"]["policy/rank00000"]["phases"]["train/step1"]["peak_bytes"] *= 1.5   # info
del actual["lifecycle"]["sections"]["rollout/rank00001"]
verdict = compare(golden, actual)
assert verdict.status == "fail", verdict.status
html = render(verdict, "html", title="html_demo [cpu] <synthetic>", surfaces_actual=actual, surfaces_golden=golden)
open(sys.argv[1], "w").write(html)
print(f"[html-report] wrote {sys.argv[1]}: {verdict.status}, counts {verdict.counts()}")
EOF

flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update
       --disable-sync --no-first-run --hide-scrollbars)
url="file://$OUT/report.html"
"$CHROMIUM" "${flags[@]}" --user-data-dir="$(mktemp -d)" --screenshot="$OUT/report.png" \
    --window-size=1280,2000 "$url" >"$OUT/chromium.log" 2>&1 || { cat "$OUT/chromium.log"; exit 1; }
"$CHROMIUM" "${flags[@]}" --user-data-dir="$(mktemp -d)" --dump-dom "$url" \
    >"$OUT/report.dom.html" 2>>"$OUT/chromium.log" || { cat "$OUT/chromium.log"; exit 1; }

fail=0
check() {  # check DESCRIPTION PATTERN FILE
    if grep -Eq -- "$2" "$3"; then echo "[html-report] ok   $1"; else echo "[html-report] FAIL $1 ($2)"; fail=1; fi
}
DOM=$OUT/report.dom.html
[ -s "$OUT/report.png" ] && echo "[html-report] ok   screenshot $(stat -c %s "$OUT/report.png") bytes" \
    || { echo "[html-report] FAIL no screenshot"; fail=1; }
check "verdict status"          'id="verdict-status"[^>]*data-status="fail"[^>]*>FAIL<' "$DOM"
check "a finding row"           '<tr class="finding fail">' "$DOM"
check "a stale finding row"     '<tr class="finding stale">' "$DOM"
check "an svg polyline"         '<polyline[^>]*class="actual"' "$DOM"
check "golden curve"            '<polyline[^>]*class="golden"' "$DOM"
check "three curves"            'data-metric="grad_norm"' "$DOM"
check "hostile key escaped"     '&lt;script&gt;alert' "$DOM"
if grep -q "<script" "$DOM"; then echo "[html-report] FAIL a <script> element in the DOM"; fail=1; fi
if grep -Eq 'https?://' "$OUT/report.html"; then echo "[html-report] FAIL external URL in the report"; fail=1; fi
echo "[html-report] report: $url"
echo "[html-report] screenshot: $OUT/report.png"
exit $fail
