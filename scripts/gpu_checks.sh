#!/usr/bin/env bash
# The GPU checks, on a machine with CUDA and a torch already installed (no venv, no
# downloads: it runs the checkout through PYTHONPATH with that machine's python3):
#   1. the CUDA tests (CUDA graphs, the triton padding kernel on a GPU, reduce-overhead
#      prewarm, the memory calibration on the CUDA allocator);
#   2. the memory calibration of the bench GPT at widths 256 and 1024 (and the small
#      Llama at 256) against the token budget's rows (benchmarks/calibrate_rows.py);
#   3. the steps/sec benchmark on cuda (bf16 autocast) at width 256: the peers,
#      shapebucket-packed (token-budget rows) and shapebucket-calibrated (rows from
#      memory), in one process; then at width 1024, packed against calibrated and
#      grouped-eager;
#   4. the benchmark's own GPU smoke tests (--quick on cuda, default and reduce-overhead).
# Each part has its own time limit inside BUDGET_S (default 540 s) and writes its log and
# JSON to $OUT (default results/gpu); a part that fails or runs out of time does not stop
# the next; the caps add up to more than BUDGET_S, so the last parts get what is left.
# The GPU runs use k=4 fitted shapes (CLI default 8) to fit a 15-minute lease.
# Needs torch >= 2.11, shapebucket's floor (shapebucket/_torch/version.py) and the GPU
# image's torch: it runs on the image as it is; on an older torch the import check below
# stops it.
# PARTS picks some (default: all but smoke, a --quick run on cuda): cuda_tests smoke calibrate
# bench_w256 bench_w1024 gpu_bench_tests.
set -u
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
deadline=$(($(date +%s) + ${BUDGET_S:-540}))
PARTS=${PARTS:-cuda_tests calibrate bench_w256 bench_w1024 gpu_bench_tests}

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
    "tests/test_device_pad.py::test_cuda_finish_with_triton_equals_the_collator" \
    "tests/test_prewarm_modes.py::test_reduce_overhead_prewarm_records_every_bucket_and_training_never_recompiles" \
    "tests/test_calibrate.py::test_on_cuda_the_allocator_peaks_stay_within_and_state_is_put_back"
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
