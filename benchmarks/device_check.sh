#!/usr/bin/env bash
# One call of the device tool on a GPU machine (an H200 with python3, torch, Triton, transformers, pytest; no
# registry): `make test-gpu` then `make bench-gpu` with that machine's own python3, logs and the JSON under $OUT.
#   run(command="bash benchmarks/device_check.sh", timeout_s=600)              # peers that do not import are skipped
#   run(command="bash benchmarks/device_check.sh", carry=[".whl"], ...)        # with wheels carried (e.g. Liger:
#     liger-kernel==0.8.5 is pure Python; see the device README for `pip download` into .whl/)
# test-gpu gets at most 240 s and bench-gpu the rest; each writes its log even when stopped at its limit.
set -u
OUT=${OUT:-_build/device-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}   # posenc from this tree (the machine has no editable install)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  for peer in liger_kernel flashinfer flash_attn; do python3 -c "import $peer" 2>/dev/null && echo "$peer: imports" || echo "$peer: missing (skipped)"; done
} 2>&1 | tee "$OUT/environment.log"
start=$(date +%s)
timeout 240 make test-gpu PY=python3 2>&1 | tee "$OUT/test-gpu.log"
test_status=${PIPESTATUS[0]}
left=$(( 570 - ($(date +%s) - start) ))
budget=$(( left > 390 ? 330 : (left > 120 ? left - 60 : 60) ))   # bench-gpu: at most 5.5 min
timeout $(( budget + 50 )) make bench-gpu PY=python3 BENCH_ARGS="--budget $budget --output $OUT/bench-gpu.json" 2>&1 | tee "$OUT/bench-gpu.log"
bench_status=${PIPESTATUS[0]}
echo "test-gpu exit $test_status, bench-gpu exit $bench_status" | tee -a "$OUT/environment.log"
exit $(( test_status != 0 ? test_status : bench_status ))
