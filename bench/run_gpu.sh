#!/usr/bin/env bash
# GPU truth in stages. A developer session has 15 minutes of device time, all calls together, and
# one call runs at most 10 minutes; a machine takes 1-2 minutes to start. So a session runs ONE
# call (device tool: timeout_s 600):
#
#     bash bench/run_gpu.sh session    # the suite on CUDA (cut at 330 s), then `limits` until 560 s
#     bash bench/run_gpu.sh limits     # issue 25's rows alone, until 560 s (when the suite is not needed)
#
# Stages (times on an H100 unless said; the stages marked * were never run whole):
#     bash bench/run_gpu.sh tests      # the whole suite on CUDA (gpu tests included)   ~4-6 min (H200,
#                                      # 2460 tests at ceaec11: 301 s)
#     bash bench/run_gpu.sh limits     # issue 25 (H200: 396 s at 952d456), most decisive first: plain decoding's step with the
#                                      # cuBLAS / GEMV / GEMV+PDL layers (B=1), the verify rows of the
#                                      # targets, attention's merge forms, tree_verify N=64 vs chain K=8
#                                      # (and its residual skips), the verify's candidate defaults
#                                      # (bench_verify_latency.py), the verify's time per kernel, the streaming variants, the step
#                                      # at B=8, the GEMV kernel vs cuBLAS, the candidates' tests on
#                                      # CUDA; then bench/issue25_report.py (targets met? levers to flip?)
#     CATCHUP_TESTS=FILE bash bench/run_gpu.sh catchup  # after sessions without a GPU: the CUDA tests of FILE's test
#                                      # files (290 s), the verify's latency rows, the tree's kernels, the report
#     bash bench/run_gpu.sh levers     # the verify's levers' tests and timings, then `-m gpu` tests (H200: 305 s
#                                      # before bench_stream_lanes --quick joined it; <= 560 s)
#     bash bench/run_gpu.sh kernels    # verify, streaming loops, attention, one-step profile, logits copy ~8 min
#     bash bench/run_gpu.sh scale      # 8B-shaped end to end, headline preset         <= 9 min
#     bash bench/run_gpu.sh loop       # graph capture table, scale batch preset        <= 10 min
#     bash bench/run_gpu.sh more       # scale sampling + agreement presets                <= 9 min
#     bash bench/run_gpu.sh trees      # trees vs chains end to end, e2e on the demo pair
#   * bash bench/run_gpu.sh heads      # issues 23 / 28: EAGLE-3 and DFlash shapes at the 8B target, costs ~6 min
#   * bash bench/run_gpu.sh gemv       # issue 25: the Triton skinny linear vs cuBLAS (tile sweep), the step with the GEMV layer ~5 min
#   * bash bench/run_gpu.sh attention  # issue 25: paged attention, split merge as a launch vs in the kernel (est. 4 min)
#   * bash bench/run_gpu.sh moe        # the MoE MLP's three ways (Qwen3-30B-A3B, Mixtral blocks), the windowed
#                                      # layers' rings (a 16k prefill by chunk), then the MoE, window, ring and
#                                      # MTP tests on CUDA (est. 6 min)
#   * bash bench/run_gpu.sh mla        # the MLA Triton kernel vs SDPA on dense latents (DeepSeek-V3, GLM-4.7-Flash
#                                      # shapes), the MLA prefill's two forms, the Gated DeltaNet's ways, DeepSeek
#                                      # Sparse Attention's step, the Mamba2 layer's ways, then the MLA kernel,
#                                      # the MLA / recurrent runners' and MTP tests on CUDA (<= 9.5 min)
#   * bash bench/run_gpu.sh adaptive   # issue 22: the adaptive schedule vs every fixed K
#   * bash bench/run_gpu.sh options    # what processing a tree's nodes costs a step (rep 1.05, no_repeat_ngram) vs a chain (est. 2 min)
#   * bash bench/run_gpu.sh ncu        # issue 25: Nsight Compute on tree_verify's residual masses and the B=64 streaming pass
#   * bash bench/run_gpu.sh ncu_source # issue 25: full Nsight Compute reports (stall reasons, SASS samples) of the B=1
#                                      # emission and finishing launches
#     bash bench/run_gpu.sh all        # tests kernels scale loop more trees (a machine without a time limit)
#
# A stage with a deadline (session, limits; or DEADLINE_S=<seconds from the start> for any stage) starts no part
# once fewer than 30 s are left, and runs each part under `timeout` with the smaller of its own cap
# and the time left; the benchmarks' --budget-s make them stop starting rows and write what they
# measured before that. `bash bench/run_gpu.sh --dry-run STAGE` prints the parts and runs nothing
# (no GPU needed), its clock advanced by each part's cap: the parts a worst case would not start
# are named at the end (tests/test_run_gpu.py checks every flag against its script).
#
# Every benchmark writes JSON (and PNG) with the device name into bench/results/; the suite's log
# goes to bench/results/gpu_tests_<device>.log. When $OUT is set (the device tool), the stage's
# results are packed into ONE archive $OUT/gpu_<stage>_<device>.tgz (the tool brings back at most
# 8 files). The JSONs' commit field is what the device's copy of .git says: it has lagged the
# working tree that ran (bench/results/h100_2026-11-24/README.md); name the commit sent beside them.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
stage=${1:-all}
results=bench/results
status=0
not_run=()
if [ "$dry" = 1 ]; then
  dev=dry_run
  # A dry run's clock is virtual: SECONDS unset loses bash's wall-clock meaning and becomes a plain
  # counter from 0 that only the parts' caps advance (the wall clock could tick a second during
  # set-up on a loaded machine: CI saw "at 1 s" once).
  unset SECONDS; SECONDS=0
else
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
  dev=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '_'))") || exit 1
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv 2>/dev/null
  python3 -m specdec_fast env  # the versions, the device's capability / SMs / shared memory and the backend it takes
fi
deadline=${DEADLINE_S:-1000000}  # seconds from the script's start (bash's SECONDS), set-up included

# budget B CAP: a benchmark's --budget-s: B, or less where the part's cap (CAP, or the time left)
# would cut it before it writes (40 s kept for its last row and the JSON).
budget() {
  local left=$((deadline - SECONDS)) cap=$2
  [ "$cap" -gt "$left" ] && cap=$left
  local b=$(($1 < cap - 40 ? $1 : cap - 40))
  echo $((b > 1 ? b : 1))
}

# run [--cap S] CMD...: CMD under `timeout` with min(S, seconds left before the deadline); not
# started when fewer than 30 s are left (named in the NOT RUN line at the end).
run() {
  local cap=$((deadline - SECONDS))
  if [ "$1" = "--cap" ]; then cap=$(($2 < cap ? $2 : cap)); shift 2; fi
  if [ "$cap" -lt 30 ]; then echo "not started (deadline): $*"; not_run+=("$*"); return 0; fi
  echo "+ [cap ${cap} s, at ${SECONDS} s] $*"
  if [ "$dry" = 1 ]; then SECONDS=$((SECONDS + cap)); return 0; fi  # the worst case: every part takes its cap
  timeout -k 10 "$cap" "$@"
  local rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo "CUT at its cap (${cap} s): $*"; status=1
  elif [ "$rc" != 0 ]; then echo "FAILED (rc $rc): $*"; status=1; fi
}

stage_tests() {
  # 16 cores on the GPU machine: 14 workers share the one GPU (1812 tests in 248 s on an H100 at
  # 02c2d95). -v: a line per test as it ends, so a run cut at its cap still names every failure so
  # far; SIGINT at the cap lets pytest print its summary. $2: a marker (`gpu`: only the tests that
  # need CUDA, 144 at f107ac2), its log named after it. --durations: the log ends with the 40 slowest
  # tests that finished (a cut run's too: the summary is printed on SIGINT), what the next session trims.
  # On a GPU machine the `gpu` tests are collected first (tests/conftest.py); --maxschedchunk 8 hands
  # them out 8 at a time, over all 14 workers (xdist's default first chunk, a quarter of a worker's
  # share, would put all 144 on the first three workers).
  local cap=$((deadline - SECONDS)) marker=${2:-} log="$results/gpu_tests_$dev.log"
  [ -n "${1:-}" ] && cap=$(($1 < cap ? $1 : cap))
  local select=() paths=(tests)
  [ -n "$marker" ] && select=(-m "$marker") && log="$results/gpu_tests_${marker}_$dev.log"
  # TEST_FILES: a file naming the test files to run, one a line (the catchup stage's); TEST_KEYWORDS: pytest's -k
  if [ -n "${TEST_FILES:-}" ]; then mapfile -t paths < "$TEST_FILES"; log="$results/gpu_tests_catchup_$dev.log"; fi
  [ -n "${TEST_KEYWORDS:-}" ] && select+=(-k "$TEST_KEYWORDS")
  echo "+ [cap ${cap} s, at ${SECONDS} s] pytest ${paths[*]:0:3}$([ "${#paths[@]}" -gt 3 ] && echo " (${#paths[@]} paths)") ${select[*]}"
  if [ "$dry" = 1 ]; then SECONDS=$((SECONDS + cap)); return 0; fi
  timeout -s INT -k 30 "$cap" python3 -m pytest -v -rfE -n 14 -p no:cacheprovider --benchmark-disable \
    --durations=40 --maxschedchunk 8 "${select[@]}" "${paths[@]}" 2>&1 \
    | tee "$log" | grep -v " PASSED \| SKIPPED "
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
}
stage_kernels() {
  run python3 bench/bench_verify.py --gpu --out "$results/verify_$dev.json"
  run python3 bench/bench_verify.py --gpu --data peaked --out "$results/verify_peaked_$dev.json"
  run python3 bench/bench_stream_lanes.py --out "$results/stream_lanes_$dev.json"
  run python3 bench/bench_attention.py --gpu --out "$results/attention_$dev.json"
  run python3 bench/profile_step.py --out "$results/profile_step_$dev.json"
  run python3 bench/bench_logits_copy.py --device cuda --out "$results/logits_copy_$dev.json"
  run python3 bench/bench_noise.py --out "$results/noise_$dev.json"
  run python3 bench/bench_verify_latency.py --out "$results/verify_latency_$dev.json"
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

candidate_tests() {
  # the levers' exactness tests on the compiled kernels (the interpreter ran them; the latency bench checks the
  # reference's tokens at V = 128256 itself): the fused finishing search, the emission's and the residual
  # masses' identity skips (all three on since an H200 timed them, 2026-11-28), the rungs launch, the
  # emission's own block, the greedy stream without its sums (STREAM_GREEDY_ARGMAX_ONLY, on since 2026-11-28), the
  # Gumbel noise's four words a Philox call (kernels/rng, since 2026-11-28: test_rng_triton's tiles on the device),
  # the residual masses in one launch (RESIDUAL_FUSED, off: test_tree_residual's fused cases run its grid barrier,
  # which the interpreter's one program never waits at, cooperative (FUSED_COOPERATIVE), eager and captured in a
  # CUDA graph)
  run --cap 100 python3 -m pytest -q -rfE -n 8 -p no:cacheprovider --benchmark-disable \
    --junitxml "$results/gpu_candidates_$dev.xml" tests/kernels/test_verify_finish_search.py \
    tests/kernels/test_verify_emit_skips.py tests/kernels/test_verify_rungs_launch.py tests/kernels/test_tree_residual.py \
    tests/kernels/test_verify_emit_lanes.py tests/kernels/test_verify_argmax_only.py tests/kernels/test_rng_triton.py
}

stream_lanes_greedy() {
  # the argmax-only stream's blocks a step (STREAM_ARGMAX_UNROLL) where its lanes are 8 / 16 / 64 blocks, which the
  # H200 run that turned it on (2026-11-28, lanes of 4 and 32 blocks) did not time
  run --cap 80 python3 bench/bench_stream_lanes.py --greedy-batches 16,32,128 --budget-s "$(budget 40 80)" \
    --out "$results/stream_lanes_greedy_$dev.json"
}

stage_limits() {
  # Issue 25 (the GPU at its limits), most decisive first; every part writes its JSON as it goes or
  # stops on its --budget-s. Reported together by bench/issue25_report.py at the end. (The emission's noise
  # forms, bench_noise.py, were timed on an H200 on 2026-11-27, h200_2026-11-27c: `kernels` still runs them.)
  run --cap 170 python3 bench/profile_step.py --quick --out "$results/profile_step_$dev.json"
  run --cap 150 python3 bench/bench_verify.py --gpu --quick --budget-s "$(budget 90 150)" --out "$results/verify_$dev.json"
  run --cap 110 python3 bench/bench_attention.py --gpu --quick --budget-s "$(budget 60 110)" --out "$results/attention_$dev.json"
  # tree N=64 vs chain K=8, the tree's kernels by device time, its walk both ways (WALK_PARALLEL) and the sampled
  # row with its residual masses in one launch (RESIDUAL_FUSED, predicted ~82 -> ~60 us)
  run --cap 80 python3 bench/bench_tree.py --kernels-only --quick --out "$results/tree_kernels_$dev.json"
  # the verify's levers, each flipped beside the defaults (issue25_report's FINISH_SEARCH_TILE=1024, EMIT_SKIP_IDENTITIES,
  # EMIT_ONE_ROW_BLOCK_V=256 and DEFAULTS_OF_2026_11_28); the B = 1 rows first
  run --cap 170 python3 bench/bench_verify_latency.py --budget-s "$(budget 120 170)" --out "$results/verify_latency_$dev.json"
  # the verify's device time per kernel, B 1 / 8 / 64 x greedy / T=1 / top_k / top_p / min_p (B = 64 top_p = 0.9:
  # 2230 us against 791 for top_k = 50 on the H200, h200_2026-11-28c: which launch)
  run --cap 90 python3 bench/verify_kernel_split.py --budget-s "$(budget 60 90)" --out "$results/verify_kernels_$dev.json"
  run --cap 100 python3 bench/bench_stream_lanes.py --quick --budget-s "$(budget 50 100)" --out "$results/stream_lanes_$dev.json"
  stream_lanes_greedy
  run --cap 120 python3 bench/profile_step.py --quick --batch 8 --ns 1 --out "$results/profile_step_b8_$dev.json"
  run --cap 120 python3 bench/bench_gemv.py --gpu --no-sweep --rows 1,5 --out "$results/gemv_nosweep_$dev.json"
  candidate_tests
  # the report reads the files only (a second or two): past the deadline too
  echo "+ python3 bench/issue25_report.py --device $dev --out $results/issue25_$dev.json"
  [ "$dry" = 1 ] || python3 bench/issue25_report.py --device "$dev" --out "$results/issue25_$dev.json" || status=1
}

stage_levers() {
  # The verify's and the tree's levers (issue25_report's FINISH_SEARCH_TILE=1024, EMIT_SKIP_IDENTITIES,
  # EMIT_ONE_ROW_BLOCK_V=256, RESIDUAL_SKIP_IDENTITIES: each way flips one; STREAM_GREEDY_ARGMAX_ONLY:
  # bench_stream_lanes' greedy rows, both loops with the sums pinned on and off): their exactness tests on the
  # compiled kernels, their timings, then the tests that need CUDA (`-m gpu`) with the time left, and the
  # report. H200 (2026-11-28, e4f1563): 305 s, the `gpu` tests 76 s of it; without them (LEVERS_GPU_TESTS=0,
  # 3bf3b96) 212 s.
  candidate_tests
  run --cap 170 python3 bench/bench_verify_latency.py --budget-s "$(budget 120 170)" --out "$results/verify_latency_$dev.json"
  run --cap 80 python3 bench/bench_tree.py --kernels-only --quick --out "$results/tree_kernels_$dev.json"
  # the streaming variants, the greedy rows without their sums among them (STREAM_GREEDY_ARGMAX_ONLY) and that
  # loop 2 / 4 blocks a step (STREAM_ARGMAX_UNROLL: 4 where a lane takes two steps, since 2026-11-28)
  run --cap 100 python3 bench/bench_stream_lanes.py --quick --budget-s "$(budget 50 100)" --out "$results/stream_lanes_$dev.json"
  stream_lanes_greedy
  # LEVERS_GPU_TESTS=0: leave them to a whole-suite call that follows (`tests` runs them too)
  if [ "${LEVERS_GPU_TESTS:-1}" = 1 ]; then stage_tests "" gpu; fi
  echo "+ python3 bench/issue25_report.py --device $dev --out $results/issue25_$dev.json"
  [ "$dry" = 1 ] || python3 bench/issue25_report.py --device "$dev" --out "$results/issue25_$dev.json" || status=1
}

stage_session() {
  # One 15-minute device session: correctness of what runs by default first, then issue 25.
  stage_tests 330  # H200: 301 s whole at ceaec11; cut at 315 s with ~36 tests left at 5c2fdbc
  stage_limits
}

stage_catchup() {
  # The first device call after sessions without one (nothing after 952d456 had run on a GPU until 2026-11-30):
  # the tests that do CUDA work (those marked gpu, and the triton / cuda parameters: the others run on the CPU as CI
  # runs them) of the files CATCHUP_TESTS names (one path a line: the test files changed since the last GPU run and
  # those with gpu tests), cut at 290 s; then the verify's defaults and levers against the reference's tokens at
  # V = 128256 (the Gumbel keys in ratio form, 5ed9a3c, never timed) and the tree's kernels (RESIDUAL_FUSED and
  # stats_chunks, prepared for a GPU), and the report.
  TEST_FILES=${CATCHUP_TESTS:?CATCHUP_TESTS names a file of test paths} TEST_KEYWORDS="gpu or triton or cuda" stage_tests 290
  run --cap 150 python3 bench/bench_verify_latency.py --budget-s "$(budget 110 150)" --out "$results/verify_latency_$dev.json"
  run --cap 80 python3 bench/bench_tree.py --kernels-only --quick --out "$results/tree_kernels_$dev.json"
  echo "+ python3 bench/issue25_report.py --device $dev --out $results/issue25_$dev.json"
  [ "$dry" = 1 ] || python3 bench/issue25_report.py --device "$dev" --out "$results/issue25_$dev.json" || status=1
}

stage_attention() {
  # Issue 25: the decode attention with its split partials merged by a second launch (today) or by
  # the split that finishes last (kernels/attention/triton.py MERGE_IN_KERNEL, whose plan also
  # splits tables of <= 1024 tokens), B 1/8/32 x 1k-32k, N 1 and 5, forced split sweeps up to 8k.
  # Flip MERGE_IN_KERNEL only where in_kernel_vs_launch is below 1 without a row above it.
  run python3 bench/bench_attention.py --gpu --out "$results/attention_$dev.json"
}

stage_moe() {
  # Mixture-of-experts (runners/_moe.py, 2026-11-30, never run on a GPU): kernels/moe's two schedules (a GEMV
  # per pair; pairs grouped by expert) against the torch gathered path and every expert, Qwen3-30B-A3B's and
  # Mixtral's blocks, T 1-128 tokens (~1-2 min): decides where runners/_moe.py switches schedules. Then
  # its tests on CUDA (the MoE runner on every path, the kernel's table, the windows' and chunks' tables, Llama 4,
  # Gemma 4 and its assistant, the attention's head dims up to 512, AFMoE / Laguna and MiMo-V2-Flash's runners)
  run --cap 200 python3 bench/bench_moe.py --gpu --budget-s "$(budget 150 200)" --out "$results/moe_$dev.json"
  # The windowed layers' rings (2026-11-30, never run on a GPU): a 16k prompt's prefill at ring_chunk 1024 /
  # 2048 / 4096 against rings off, and the KV each holds (decides paged_base.ring_chunk)
  run --cap 150 python3 bench/bench_ring_prefill.py --gpu --budget-s "$(budget 110 150)" --out "$results/ring_prefill_$dev.json"
  run --cap 200 python3 -m pytest -q -rfE -n 8 -p no:cacheprovider --benchmark-disable tests/kernels/test_moe_pairs.py \
    tests/engine/test_paged_moe.py tests/kernels/test_paged_attention_window.py tests/engine/test_sliding_window_models.py \
    tests/engine/test_ring_windows.py tests/engine/test_mtp.py tests/kernels/test_paged_attention_chunk.py \
    tests/engine/test_paged_llama4.py tests/engine/test_paged_gemma4.py tests/engine/test_gemma4_assistant.py \
    tests/kernels/test_paged_attention.py tests/engine/test_paged_gated_attention.py tests/engine/test_paged_mimo.py
}

stage_mla() {
  # Multi-head latent attention (DeepSeek-V3 / V3.2, GLM-4.7-Flash) and the recurrent layers (Qwen3-Next, Mamba2) of 2026-11-30,
  # never run on a GPU: the MLA Triton kernel against SDPA on dense latents, 128 / 20 heads x B 1/8/32 x 1k-16k x
  # N 1/4, its tiles swept; the MLA prefill absorbed vs expanded at full width (decides expand_prefill_min); the
  # Gated DeltaNet's prefill chunks and score block against token steps at Qwen3-Next-80B's widths (and the Triton
  # path's fused score call, kernels/recurrent, in the score rows of both recurrent benches, and its prefill carry,
  # kernels/chunk_scan, in their prefill rows); then the MLA
  # kernel's table, DeepSeek Sparse Attention's torch-ops step against the dense kernel (DeepSeek-V3.2's widths), the
  # Mamba2 layer's prefill and score block (Nemotron-H 8B's widths),
  # the MLA / Qwen3-Next / Nemotron-H / Granite 4.0-H / Falcon-H1 / OLMo Hybrid / LFM2 / Mamba / Jamba / MiniMax / Kimi Linear
  # runners' and the MTP
  # tests on CUDA
  # (<= 570 s)
  run --cap 110 python3 bench/bench_mla.py --gpu --budget-s "$(budget 70 110)" --out "$results/mla_$dev.json"
  run --cap 80 python3 bench/bench_mla_prefill.py --gpu --budget-s "$(budget 40 80)" --out "$results/mla_prefill_$dev.json"
  run --cap 80 python3 bench/bench_delta_rule.py --gpu --budget-s "$(budget 40 80)" --out "$results/delta_rule_$dev.json"
  run --cap 80 python3 bench/bench_dsa.py --gpu --budget-s "$(budget 40 80)" --out "$results/dsa_$dev.json"
  run --cap 70 python3 bench/bench_mamba2.py --gpu --budget-s "$(budget 30 70)" --out "$results/mamba2_$dev.json"
  run --cap 150 python3 -m pytest -q -rfE -n 8 -p no:cacheprovider --benchmark-disable tests/kernels/test_mla_attention.py \
    tests/kernels/test_recurrent_steps.py tests/kernels/test_conv_steps.py tests/kernels/test_chunk_scan.py \
    tests/engine/test_paged_mla.py tests/engine/test_mtp.py tests/engine/test_paged_qwen3_next.py \
    tests/engine/test_paged_nemotron_h.py tests/engine/test_paged_granite_hybrid.py tests/engine/test_paged_falcon_h1.py \
    tests/engine/test_paged_olmo_hybrid.py tests/engine/test_paged_lfm2.py tests/engine/test_paged_mamba_lm.py \
    tests/engine/test_paged_jamba.py tests/engine/test_paged_minimax.py tests/engine/test_paged_kimi_linear.py
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

stage_ncu() {
  # Issue 25's unexplained times, read by Nsight Compute (hardware counters; Firecracker machines
  # only, H200.md; --clock-control none: METHOD.md leaves the clocks alone): tree_verify's five
  # residual_mass launches (98 us each on the H200 where their bytes take 1-2 us) and the B = 64
  # streaming pass (36% of the roofline where a Little's-law model said 90%). One eager call per
  # case (ncu flushes the caches before each kernel it replays). CSV per case.
  local ncu_bin
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$ncu_bin" ] || ncu_bin=ncu
  local sections="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats"
  sections="$sections --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
  # NCU_CASES="name:kernel-regex ..." picks other cases (bench/ncu_cases.py names them), e.g. the B = 1 rows:
  #   NCU_CASES="chain_b1_t1:select|emit chain_b1_topk50:select|emit chain_b1_topp09:select|emit tree_b8_t1:residual"
  # or B = 64 top_p against top_k (2230 against 791 us on the H200, 2026-11-28):
  #   NCU_CASES="chain_b64_topp09:select_finish|select_rungs chain_b64_topk50:select_finish|select_rungs"
  local case_ kernels
  for case_ in ${NCU_CASES:-tree_t1:residual_mass chain_b64_greedy:select chain_b64_t1:select|emit}; do
    kernels=${case_#*:}
    # shellcheck disable=SC2086
    run --cap 100 "$ncu_bin" --clock-control none -k "regex:$kernels" --launch-count 8 $sections --csv --page details \
      --log-file "$results/ncu_${case_%%:*}_$dev.csv" python3 bench/ncu_cases.py --case "${case_%%:*}" --calls 1
  done
}

stage_ncu_source() {
  # Where the B = 1 launches wait (issue 25: the emission's 18 us at B = 1, 6% occupancy, for one
  # 1024-value block a program; the finishing launch's 31-51 us): Nsight Compute's full set with
  # per-instruction sampling, one launch per case, saved as a report; then its raw metrics (the warp
  # stall reasons among them) and its source page (SASS with the samples; written only where this
  # ncu's CLI has --page source) as CSV. NCU_CASES as for `ncu`. The third default case: the finishing
  # launch with the earlier search (FINISH_SEARCH_TILE = 0; the fused search is the default since 2026-11-28).
  local ncu_bin case_ kernels rep
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$ncu_bin" ] || ncu_bin=ncu
  for case_ in ${NCU_CASES:-chain_b1_t1:emit chain_b1_topk50:select_finish chain_b1_topk50_search0:select_finish}; do
    kernels=${case_#*:}
    rep="$results/ncu_src_${case_%%:*}_$dev"
    run --cap 150 "$ncu_bin" --clock-control none -k "regex:$kernels" --launch-count 1 --set full --import-source yes \
      -f -o "$rep" python3 bench/ncu_cases.py --case "${case_%%:*}" --calls 1
    [ "$dry" = 1 ] && continue
    "$ncu_bin" -i "$rep.ncu-rep" --page raw --csv > "$rep.raw.csv" 2>&1 || echo "ncu raw page failed: $rep"
    "$ncu_bin" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.source.csv" 2>&1 \
      || echo "ncu source page failed (this ncu may lack it): $rep"
  done
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

stage_options() {
  # Processing on the GPU: generate(tree=True) processes every node with its ancestor path (processing/prefix.py
  # tree_prefixes: each row's sequence repeated per node, the penalty's gather over all columns per node row),
  # the drafts' levels too. Timed with repetition_penalty 1.05 (Qwen2.5 Instruct's) and no_repeat_ngram_size 3
  # against none, tree and chain K = 4, greedy and sampled, on the demo pair (tiny models: a step costs little, so
  # the ratios show what the processing adds to each step). Decides whether the tree's per-node processing is worth
  # restructuring (paths kept by the drafter level by level instead of rebuilt: notes of 2026-11-29). Not run yet.
  local sets="repetition_penalty=1.05,no_repeat_ngram_size=3"
  run --cap 200 python3 bench/bench_options.py --device cuda --tree --sets "$sets" --rounds 3 \
    --out "$results/options_tree_$dev.json"
  run --cap 150 python3 bench/bench_options.py --device cuda --sets "$sets" --rounds 3 --out "$results/options_$dev.json"
}

case "$stage" in  # a device call ends at 600 s: 560 leaves the last part's kill grace and the archive
  session|limits|levers|catchup) [ -z "${DEADLINE_S:-}" ] && deadline=560 ;;
esac
case "$stage" in
  session|tests|kernels|scale|loop|more|trees|limits|levers|catchup|attention|gemv|moe|mla|heads|adaptive|options|ncu|ncu_source) "stage_$stage" ;;
  all) for s in tests kernels scale loop more trees; do "stage_$s"; done ;;
  *) echo "usage: bash bench/run_gpu.sh [--dry-run] session|tests|kernels|scale|loop|more|trees|limits|levers|catchup|attention|gemv|moe|mla|heads|adaptive|options|ncu|ncu_source|all"; exit 2 ;;
esac
[ "${#not_run[@]}" = 0 ] || printf 'NOT RUN (deadline): %s\n' "${not_run[@]}"
echo "stage $stage done at ${SECONDS} s, status $status"
if [ "$dry" = 0 ] && [ -n "${OUT:-}" ]; then
  tar czf "$OUT/gpu_${stage}_$dev.tgz" $(ls "$results"/*"$dev"* 2>/dev/null) 2>/dev/null
fi
exit $status
