#!/usr/bin/env bash
# Written after session 27's table, for the next lease (~8 min): where the two decodes over 2x (glm5-next 2.63x,
# deepseek4 2.29x: both with DeepSeek-V4's hyper-connections) and deepseek4's 255 ms prefill spend their GPU time.
# A one-token fixed-shape step (the kernels a captured decode replays) and a 512-token prefill, by kernel and by
# segment between the forward's named tensors. Carry [".whl"]; run from the repo root.
O=/tmp/o7; mkdir -p $O $OUT; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/site ] || python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl > $O/pip.log 2>&1
for spec in glm5-next:glm-5.3-flash:3 deepseek4:deepseek-v4-flash:3; do IFS=: read -r A P L <<< "$spec"
  timeout 200 python3 benchmarks/profile_prefill.py --arch $A --preset $P --layers $L --dir /tmp/rs --tokens 1 \
    --fixed-shapes --segments --top 25 > $O/decode_$A.log 2>&1
  [ $A = deepseek4 ] && timeout 150 python3 benchmarks/profile_prefill.py --arch $A --preset $P --layers $L \
    --dir /tmp/rs --tokens 512 --segments --top 25 > $O/prefill_$A.log 2>&1
  rm -f /tmp/rs/*.gguf
done
cp $O/*.log $OUT/; grep -h "kernels:\|prefill of" $O/*.log
