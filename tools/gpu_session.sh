#!/usr/bin/env bash
# One GPU session's measurements, in order of importance, each with its own time limit so that
# a hang or a failure costs only its own slot: the gpt2s bf16 step (cstorch, eager torch,
# torch.compile), the profile of cstorch's bf16 step by op class (and eager's, for comparison),
# CPU/GPU parity (tools/gpu_check.py), then the fp32 step. Runs from the source tree with the
# machine's own python3; results (JSON and the log) go to $OUT (default artifacts/gpu_session).
#
#     bash tools/gpu_session.sh            # on a GPU machine, about 8 minutes on an H100
#     SLOTS="bench_bf16 profile" bash tools/gpu_session.sh   # only these slots
#     SMOKE=1 bash tools/gpu_session.sh    # tiny sizes, on a CPU, to check the script itself
# The results are packed into $OUT/gpu_session.tgz after every slot, so a run stopped from
# outside still brings back what it finished.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-artifacts/gpu_session}
mkdir -p "$OUT"
WORK=$(mktemp -d)
export PYTHONPATH=.:compat${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false CSTORCH_GRAPH_CACHE=off
PY=${PYTHON:-python3}
if [ -n "${SMOKE:-}" ]; then
    WL=tiny; STEPS=3; SCALE=1; PROFILE_WL=tiny; CHECK=--quick
else
    WL=gpt2s; STEPS=10; SCALE=1; PROFILE_WL=gpt2s; CHECK=
fi
SLOTS=${SLOTS:-bench_bf16 profile parity bench_fp32}
slot() {  # slot GROUP SECONDS NAME COMMAND...: one measurement, its log kept whatever it does
    local group=$1 limit=$2 name=$3; shift 3
    case " $SLOTS " in *" $group "*) ;; *) return;; esac
    echo "=== $name (limit ${limit}s) $(date +%T)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$WORK/$name.log" | tail -40
    echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
    cp "$WORK"/check/*.json "$WORK"/ 2>/dev/null
    tar -C "$WORK" -czf "$OUT/gpu_session.tgz" --exclude=check .
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$WORK/gpu.txt"
slot bench_bf16 230 bench_bf16 "$PY" benchmarks/bench_gpu.py --workloads "$WL" --precisions bf16 \
    --engines cstorch,eager,compile --steps "$STEPS" --timeout 150 --json "$WORK/bench_bf16.json"
slot profile 110 profile_cstorch_bf16 "$PY" benchmarks/profile_ops.py --workload "$PROFILE_WL" \
    --precision bf16 --steps 3 --top 25 --json "$WORK/profile_cstorch_bf16.json"
slot profile 40 profile_eager_bf16 "$PY" benchmarks/profile_ops.py --engine eager \
    --workload "$PROFILE_WL" --precision bf16 --steps 3 --top 25 \
    --json "$WORK/profile_eager_bf16.json"
slot parity 420 parity "$PY" tools/gpu_check.py --out "$WORK/check" --no-bench --timeout 200 $CHECK
slot bench_fp32 150 bench_fp32 "$PY" benchmarks/bench_gpu.py --workloads "$WL" --precisions fp32 \
    --engines cstorch,eager --steps "$STEPS" --timeout 140 --json "$WORK/bench_fp32.json"
echo "results: $OUT/gpu_session.tgz"
