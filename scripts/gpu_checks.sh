#!/usr/bin/env bash
# The GPU checks, on a machine with CUDA and a torch already installed (no venv, no
# downloads: it runs the checkout through PYTHONPATH with that machine's python3, the
# torch the device image has: 2.11 at the time of writing):
#   1. cuda_tests: the CUDA tests (CUDA graphs, the wrapper's own graphs=True replay,
#      the triton padding kernel on a GPU, reduce-overhead prewarm, the memory
#      calibration on the CUDA allocator, and the
#      bench's CUDA-graph strategies recorded at prewarm with the memory they keep);
#   2. profile: the benchmark's GPU profile (--profile gpu: 16k tokens a step, lengths up
#      to 2,048, 4 blocks of width 1,024, bf16; the peers, the limit row, shapebucket's
#      buckets, packing, calibrated rows within --rows-budget-mb, and the CUDA-graph
#      strategies), writing $OUT/profile_gpu.json and .png, which docs/benchmarks.md reads;
#   3. profile_flex: packing through flex_attention (--attention flex), packed and
#      packed-graphs, to $OUT/profile_gpu_flex.json;
#   4. bucketed_calls: the wrapper's call benchmark (benchmarks/bucketed_calls.py): the
#      realistic model (4 blocks of width 1,024, vocab 16k, bf16) on both streams (1-64
#      rows to 1,024 and 1-8 rows to 256, fresh calls every round): the padding and the
#      packing wrapper, each also with its own CUDA graphs (graphs=True), against
#      dynamic=True, the default compile and reduce-overhead,
#      writing $OUT/bucketed_calls.json (estimated at about 4 minutes on an H100, never
#      run: PARTS=bucketed_calls gives it its whole 240 s cap).
# Older parts, by name in PARTS only: smoke, calibrate, bench_w256, bench_w1024,
# gpu_bench_tests.
# Each part has its own time limit inside BUDGET_S (default 570 s, under 10 minutes) and
# writes its log and JSON to $OUT (default results/gpu); a part that fails or runs out of
# time does not stop the next; the caps add up to more than BUDGET_S, so the last parts
# get what is left. shapebucket's floor is torch 2.11 (shapebucket/_torch/version.py),
# the image's: it runs on the image as it is (the import check below stops an older torch).
# PARTS picks some (default: cuda_tests profile profile_flex bucketed_calls).
set -u
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
deadline=$(($(date +%s) + ${BUDGET_S:-570}))
PARTS=${PARTS:-cuda_tests profile profile_flex bucketed_calls}

part() { # part NAME CAP_SECONDS COMMAND...: run with the smaller of CAP and the time left
    local name=$1 cap=$2 left t start rc
    shift 2
    [[ " $PARTS " == *" ${name%%_w*} "* || " $PARTS " == *" $name "* ]] || return 0
    left=$((deadline - $(date +%s)))
    t=$((cap < left ? cap : left))
    if ((t < 30)); then
        echo "== $name: skipped, $left s left"
        return
    fi
    echo "== $name (limit $t s): $*"
    start=$(date +%s)
    timeout -k 5 "$t" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc after $(($(date +%s) - start)) s"
    grep -v -e USDT -e '%|' "$OUT/$name.log" | tail -n "${TAIL:-30}"
}

nvidia-smi -L
"$PY" -c 'import sys, torch, shapebucket; print(sys.version.split()[0], torch.__version__,
torch.cuda.get_device_name(0), "shapebucket", shapebucket.__version__)' || exit 1

part cuda_tests 100 "$PY" -m pytest -q -rs -p no:cacheprovider \
    "tests/test_bucketed.py::test_cuda_graphs_are_recorded_for_the_planned_shapes_only" \
    "tests/test_bucketed_graphs.py::test_real_capture_of_a_compiled_model_replays_the_unwrapped_outputs" \
    "tests/test_device_pad.py::test_cuda_finish_with_triton_equals_the_collator" \
    "tests/test_prewarm_modes.py::test_reduce_overhead_prewarm_records_every_bucket_and_training_never_recompiles" \
    "tests/test_calibrate.py::test_on_cuda_the_allocator_peaks_stay_within_and_state_is_put_back" \
    "tests/test_bench_graphs.py::test_graph_strategies_record_at_prewarm_and_report_their_memory"
profile=("$PY" -m shapebucket bench --profile gpu --device cuda --rounds 3 --epoch-samples 2000)
TAIL=40 part profile 300 "${profile[@]}" --rows-budget-mb "${ROWS_BUDGET_MB:-40000}" \
    --json "$OUT/profile_gpu.json"
TAIL=20 part profile_flex 150 "${profile[@]}" --attention flex --no-limit \
    --strategies fixed-packed-compile,shapebucket-packed,shapebucket-packed-graphs \
    --json "$OUT/profile_gpu_flex.json"
TAIL=40 part bucketed_calls 240 "$PY" benchmarks/bucketed_calls.py --device cuda \
    --model realistic --stream large,small --calls 24 --rounds 3 --warm-calls 16 \
    --strategies dynamic,compile,reduce-overhead,bucketed,bucketed-packed,bucketed-graphs,bucketed-packed-graphs \
    --json "$OUT/bucketed_calls.json"
part smoke 120 "$PY" -m shapebucket bench --quick --device cuda --no-limit \
    --strategies grouped-eager,shapebucket-packed,shapebucket-calibrated --json "$OUT/smoke.json"
TAIL=45 part calibrate_w256 60 "$PY" benchmarks/calibrate_rows.py --device cuda --dim 256 \
    --model both --json "$OUT/calibrate_w256.json"
TAIL=25 part calibrate_w1024 50 "$PY" benchmarks/calibrate_rows.py --device cuda --dim 1024 \
    --model gpt --json "$OUT/calibrate_w1024.json"
bench=("$PY" -m shapebucket bench --device cuda --k 4 --rounds 3 --epoch-samples 3000)
part bench_w256 240 "${bench[@]}" --model-dim 256 --no-limit \
    --strategies grouped-eager,grouped-compile,fixed-packed-compile,shapebucket-packed,shapebucket-calibrated \
    --json "$OUT/bench_w256.json"
part bench_w1024 150 "${bench[@]}" --model-dim 1024 --no-limit \
    --strategies grouped-eager,shapebucket-packed,shapebucket-calibrated \
    --json "$OUT/bench_w1024.json"
part gpu_bench_tests 200 "$PY" -m pytest -q -rs -p no:cacheprovider \
    "tests/test_bench.py::test_quick_run_on_gpu"
exit 0
