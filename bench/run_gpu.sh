#!/usr/bin/env bash
# GPU truth in one call (issue: GPU validation): the whole test suite on CUDA (tests marked
# gpu included), then every GPU benchmark, each writing JSON to bench/results/ with the device
# name in the file name. For the GPU machine, whose python3 has CUDA torch + triton and which
# reaches no registry:  bash bench/run_gpu.sh   (copies results to $OUT when that is set)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
dev=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '_'))") || exit 1
results=bench/results
status=0
run() { echo "+ $*"; "$@" || { echo "FAILED: $*"; status=1; }; }

python3 -m pytest -q -p no:cacheprovider --benchmark-disable tests 2>&1 | tee "$results/gpu_tests_$dev.log" || status=1
run python3 bench/bench_verify.py --gpu --out "$results/verify_$dev.json"
run python3 bench/bench_verify.py --gpu --data peaked --out "$results/verify_peaked_$dev.json"
run python3 bench/bench_attention.py --gpu --out "$results/attention_$dev.json"
run python3 bench/bench_e2e.py --device cuda --batch-sizes 1,8,32 --cuda-graphs both --out "$results/e2e_$dev.json"
if [ -n "${OUT:-}" ]; then cp "$results"/*"$dev"* "$OUT"/ 2>/dev/null; fi
exit $status
