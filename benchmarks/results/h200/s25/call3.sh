#!/usr/bin/env bash
# Session 25, call 3: tcq's latency variants (register cap MR, weight burst PW, activation prefetch PF), then a
# deepseek2 / glm-dsa prefill with the routed experts on the best one (KernelPolicy tcq=True) against the default.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/rs
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1
timeout 240 python3 benchmarks/expert_prefill.py --shapes 64x4x1x32 --kernels "" \
  --tcq 4x2x32,4x2x32x0x1x0,4x2x32x0x0x1,4x2x32x0x1x1,2x4x32x0x1x1,2x4x32x128x1x1,2x4x32x168x1x1,4x2x32x168x1x1,2x2x32x128x1x1,4x1x32x0x1x1,2x4x32x128x0x1 \
  --json "$OUT/expert3.json" > "$OUT/expert3.log" 2>&1; echo "rc=$?" >> "$OUT/expert3.log"
BEST=$(python3 - "$OUT/expert3.json" <<'PY'
import json, sys
r = [x for x in json.load(open(sys.argv[1]))["results"] if x["config"].startswith("tcq") and isinstance(x.get("gate"), dict)]
b = min(r, key=lambda x: x["gate"]["ms"] + x["down"]["ms"])
v = [int(s) for s in b["config"].split()[1].split("x")]
print(repr(dict(zip(("MT", "WM", "BN", "MR", "PW", "PF"), v))).replace(" ", ""))
PY
)
echo "best tcq shape: $BEST" | tee -a "$OUT/expert3.log"
for A in deepseek2:deepseek-v3 glm-dsa:glm-5.2; do IFS=: read -r AR P <<< "$A"
  timeout 150 python3 benchmarks/profile_prefill.py --arch $AR --preset $P --layers 2 --tokens 512 --dir /tmp/rs --top 12 \
    > "$OUT/prefill_${AR}_default.log" 2>&1; echo "rc=$?" >> "$OUT/prefill_${AR}_default.log"
  timeout 150 python3 benchmarks/profile_prefill.py --arch $AR --preset $P --layers 2 --tokens 512 --dir /tmp/rs --top 12 \
    --policy tcq=True --policy "tcq_shape=$BEST" > "$OUT/prefill_${AR}_tcq.log" 2>&1; echo "rc=$?" >> "$OUT/prefill_${AR}_tcq.log"
  rm -f /tmp/rs/*.gguf
done
