#!/usr/bin/env bash
# GPU truth in stages, each sized for one device call of at most 10 minutes (a developer
# session has 30 minutes of device time; a machine takes 1-2 minutes to start). For the GPU
# machine, whose python3 has CUDA torch + triton and which reaches no registry:
#
#     bash bench/run_gpu.sh tests      # the whole suite on CUDA (gpu tests included)   ~4-6 min
#     bash bench/run_gpu.sh kernels    # verify, streaming loops, attention, one-step profile, logits copy ~8 min
#     bash bench/run_gpu.sh scale      # 8B-shaped end to end, headline preset         <= 9 min
#     bash bench/run_gpu.sh loop       # graph capture table, scale batch preset        <= 10 min
#     bash bench/run_gpu.sh more       # scale sampling + agreement presets                <= 9 min
#     bash bench/run_gpu.sh trees      # trees vs chains end to end, e2e on the demo pair
#     bash bench/run_gpu.sh heads      # issues 23 / 28: EAGLE-3 and DFlash shapes at the 8B target, costs ~6 min
#     bash bench/run_gpu.sh limits     # issue 25's rows: verify B 1/64, streaming variants, tree N=64 vs chain K=8, plain decoding ~8 min
#     bash bench/run_gpu.sh gemv       # issue 25: the Triton skinny linear vs cuBLAS (tile sweep), the step with the GEMV layer ~5 min
#     bash bench/run_gpu.sh attention  # issue 25: paged attention, split merge as a launch vs in the kernel (est. 4 min, never run)
#     bash bench/run_gpu.sh all        # every stage in order (a machine without a time limit)
#
# In that order of priority: the first three fit one session. Every benchmark writes JSON (and
# PNG) with the device name into bench/results/; the suite's log goes to
# bench/results/gpu_tests_<device>.log. When $OUT is set (the device tool), the stage's results
# are packed into ONE archive $OUT/gpu_<stage>_<device>.tgz (the tool brings back at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
stage=${1:-all}
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
dev=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '_'))") || exit 1
results=bench/results
status=0
run() { echo "+ $*"; "$@" || { echo "FAILED: $*"; status=1; }; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv 2>/dev/null

stage_tests() {
  # 16 cores on the GPU machine: 8 workers share the one GPU well (3 min for ~540 tests at 3dca4fa).
  python3 -m pytest -q -n 8 -p no:cacheprovider --benchmark-disable tests 2>&1 | tee "$results/gpu_tests_$dev.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
}
stage_kernels() {
  run python3 bench/bench_verify.py --gpu --out "$results/verify_$dev.json"
  run python3 bench/bench_verify.py --gpu --data peaked --out "$results/verify_peaked_$dev.json"
  run python3 bench/bench_stream_lanes.py --out "$results/stream_lanes_$dev.json"
  run python3 bench/bench_attention.py --gpu --out "$results/attention_$dev.json"
  run python3 bench/profile_step.py --out "$results/profile_step_$dev.json"
  run python3 bench/bench_logits_copy.py --device cuda --out "$results/logits_copy_$dev.json"
}
stage_scale() {
  # The 8B-shaped scale benchmark (issue 11). --budget-s: no new group after that many seconds;
  # the JSON is rewritten after every group. Writes bench/results/scale_${dev}_<preset>.json + .png.
  run python3 bench/bench_scale.py --preset headline --budget-s 480
}
stage_loop() {
  # The engine's two CUDA graphs over K 1..8 x batch {1,3,8,32,64}, both drafters: tokens vs eager
  # (also a gpu test, tests/engine/test_graph_capture_table.py; this keeps a JSON record).
  run python3 bench/graph_capture_table.py --device cuda --mode graphs --batches 1,3,8,32,64 --out "$results/graph_capture_table_$dev.json"
  run python3 bench/bench_scale.py --preset batch --budget-s 420
}
stage_more() {
  for preset in sampling agreement; do
    run python3 bench/bench_scale.py --preset "$preset" --budget-s 240
  done
}
stage_trees() {
  # ~5 min at these sizes on an H100 (2026-11-23: the full default grid does not fit one call)
  run python3 bench/bench_tree.py --gpu --chain-ks 2,3,4,5,6,7 --tree-sizes 16,32,64 --tree-depths 4,8 --budget-s 300
  run python3 bench/bench_e2e.py --device cuda --batch-sizes 1,8,32 --cuda-graphs both --out "$results/e2e_$dev.json"
}

stage_limits() {
  # Issue 25 (the GPU at its limits), in one call: the verify table (B 1/8/64, every mode, graph
  # replays), the streaming kernel's variants side by side (per-lane 1/2/4 blocks per step, the
  # select code compiled in or out), tree_verify N=64 vs chain_verify K=8, plain decoding's step.
  run python3 bench/bench_verify.py --gpu --out "$results/verify_$dev.json"
  run python3 bench/bench_stream_lanes.py --out "$results/stream_lanes_$dev.json"
  run python3 bench/bench_tree.py --gpu --kernels-only --out "$results/tree_kernels_$dev.json"
  run python3 bench/profile_step.py --out "$results/profile_step_$dev.json"
}

stage_attention() {
  # Issue 25: the decode attention with its split partials merged by a second launch (today) or by
  # the split that finishes last (kernels/attention/triton.py MERGE_IN_KERNEL, whose plan also
  # splits tables of <= 1024 tokens), B 1/8/32 x 1k-32k, N 1 and 5, forced split sweeps up to 8k.
  # Flip MERGE_IN_KERNEL only where in_kernel_vs_launch is below 1 without a row above it.
  run python3 bench/bench_attention.py --gpu --out "$results/attention_$dev.json"
}

stage_gemv() {
  # Issue 25, plain decoding at 85%: the GEMV layer's kernel against cuBLAS per 8B product and row
  # count (every candidate tile config: decides kernels/linear/triton.py's defaults), its fused
  # prologues against the launches they replace, and the whole step both ways (profile_step's
  # "gemv_layer" rows), then with programmatic dependent launches ("gemv_layer_pdl", never run
  # before: an error there is recorded and ends the profile early). Flip runners/paged_llama.py
  # GEMV_LAYER / GEMV_PDL only where the step is faster.
  run python3 bench/bench_gemv.py --gpu --out "$results/gemv_$dev.json"
  run python3 bench/profile_step.py --out "$results/profile_step_$dev.json"
}

stage_heads() {
  # Issues 23 / 28: the 8B-shaped target with an EAGLE-3 head and a DFlash drafter of the published
  # shapes (random weights): draft and target ms per iteration, c, tok/s at equal acceptance (Thm 3.8).
  run python3 bench/bench_heads_gpu.py --out "$results/heads_gpu_$dev.json"
}

stage_adaptive() {
  # Issue 22's open question: the adaptive schedule against every fixed K, and "adaptive pinned"
  # (its machinery at the best fixed K): what the mechanics cost apart from the choices.
  run python3 bench/bench_adaptive_k.py --gpu --budget-s 480 --out "$results/adaptive_k_$dev.json"
}

case "$stage" in
  tests|kernels|scale|loop|more|trees|limits|attention|gemv|heads|adaptive) "stage_$stage" ;;
  all) for s in tests kernels scale loop more trees; do "stage_$s"; done ;;
  *) echo "usage: bash bench/run_gpu.sh tests|kernels|scale|loop|more|trees|limits|attention|gemv|heads|adaptive|all"; exit 2 ;;
esac
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/gpu_${stage}_$dev.tgz" $(ls "$results"/*"$dev"* 2>/dev/null) 2>/dev/null
fi
exit $status
