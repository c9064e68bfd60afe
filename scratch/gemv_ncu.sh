#!/usr/bin/env bash
# One GPU call's Nsight Compute part: m13's batch-1 GEMVs (scratch/gemv_ncu.py launches each shape 3 times) with
# the SM clock free and locked at its base, and the warps' stall reasons per issued instruction.
#   OUT=/dir bash scratch/gemv_ncu.sh     -> $OUT/gemv_ncu_free.txt, gemv_ncu_base.txt
set -uo pipefail
SECTIONS=(--section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy)
STALLS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
for clock in none base; do
    name=$([ "$clock" = none ] && echo free || echo base)
    timeout 80 ncu --clock-control "$clock" "${SECTIONS[@]}" --metrics "$STALLS" -k "regex:quantized_gemv|stream" \
        --launch-count 20 "${PY:-python3}" scratch/gemv_ncu.py > "$OUT/gemv_ncu_$name.txt" 2>&1
    echo "ncu, clock $clock: exit $?"
    grep -E "launches in order" "$OUT/gemv_ncu_$name.txt"
    grep -E "^    (Duration|SM Frequency)" "$OUT/gemv_ncu_$name.txt" | paste - - | cat
done
