#!/usr/bin/env bash
# Which model shape learns most per CPU-second (issue 44)? Each shape trains for BUDGET seconds of wall time at a
# constant peak lr (a cosine over far more steps than fit) on DATA (positions of rookworld positions --annotate);
# the figure is the mean training loss of the last 10 logged steps: no sample is seen twice, so in effect a
# held-out loss. Usage: DATA=chess-play-train.jsonl BUDGET=240 bash benches/shapes.sh  (SHAPES="12 4 128;4 4 256")
# SEED seeds the weights and the data order. LEGAL=1 trains with --legal-weight 1 and reports the legality loss
# too, on rows never seen before: a width that the softmax bottleneck holds back would put less of its mass on
# the position's legal moves in the same CPU time.
set -uo pipefail
DATA=${DATA:-chess-play-train.jsonl}
BUDGET=${BUDGET:-240}
OUT=${OUT:-runs/shapes}
DTYPE=${DTYPE:-auto}
LEGAL=${LEGAL:-0}
SEED=${SEED:-0}
IFS=';' read -ra SHAPES <<< "${SHAPES:-12 4 128;8 6 192;8 8 256;4 4 256}"
common=(--init tiny --vocabulary chess --layout compact --data "$DATA" --lr 1e-3 --loss-on target --seq-len 256
        --rows-per-step 16 --eval-every 0 --log-every 10 --dtype "$DTYPE" --steps 100000 --warmup-steps 50
        --save-every 100000 --legal-weight "$LEGAL" --seed "$SEED")
mkdir -p "$OUT"
for shape in "${SHAPES[@]}"; do
  read -r layers heads width <<< "$shape"
  name=L$layers-E$width-s$SEED
  rm -rf "${OUT:?}/$name"
  timeout -s INT "$BUDGET" rookworld sft "${common[@]}" --n-layer "$layers" --n-head "$heads" --n-embd "$width" \
      --output-dir "$OUT/$name" > "$OUT/$name.log" 2>&1
  sleep 5  # the interrupted run saves its step
  python - "$OUT/$name" <<'PY'
import json, sys
m = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl") if '"time/step"' in line]
last = m[-10:]
print(f"{sys.argv[1]}: {m[-1]['step']} steps, {sum(x['tokens_per_s'] for x in last) / len(last):,.0f} tokens/s, "
      f"loss of the last 10 logged {sum(x['loss'] for x in last) / len(last):.4f}"
      + (f", legality loss {sum(x['legal_loss'] for x in last) / len(last):.4f}" if "legal_loss" in last[-1] else ""))
PY
done
