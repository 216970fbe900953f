#!/bin/bash
# Every check that needs a CUDA GPU, in one go, for a lent GPU machine that has torch but not
# this project (docs/benchmarks.md, "GPU"): the GPU overhead benchmark, the cuda-marked tests,
# and the public programs that can use a GPU run on it, plain and under torchdoctor, healthy
# and with their planted bugs (realworld.py --device cuda).
#
#     benchmarks/gpu_check.sh OUT_DIR
#
# BENCH=0 leaves the benchmark out, TESTS=0 the tests; PROGRAMS="dcgan nanogpt,vae_lr_too_high" runs those groups of
# programs and bugs (realworld.py --only, one process each, side by side) instead of all.
#
# It makes the interpreter `python3` see this source tree (a .pth file in its site-packages,
# so that every child process does) and installs the wheels found in .whl/ (packages that
# machine lacks, duckdb say). The programs come from TORCHDOCTOR_REALWORLD_CACHE (default:
# .rwcache, a copy of realworld.py's cache). Meant for a throwaway machine: it changes that
# interpreter's site-packages.
set -u
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export TORCHDOCTOR_REALWORLD_CACHE=${TORCHDOCTOR_REALWORLD_CACHE:-$PWD/.rwcache}
py=python3
site=$($py -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if compgen -G ".whl/*.whl" >/dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
fi
echo "$PWD/src" >"$site/torchdoctor-src.pth"
cp pth/torchdoctor.pth "$site/"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $py -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
    nproc
} | tee "$out/env.txt"
$py -m torchdoctor.native 2>&1 | tail -1

if [ "${BENCH:-1}" != 0 ]; then
    echo "== the GPU overhead (alone on the machine)"
    timeout 240 $py benchmarks/gpu_overhead.py --blocks 12 --profile >"$out/bench.txt" 2>&1
    head -6 "$out/bench.txt"
fi

echo "== the cuda-marked tests, beside the public programs on the GPU"
rw() {  # one group of programs (with their bugs): its JSON and log in /tmp
    timeout 330 $py benchmarks/realworld.py --device cuda --no-live --only "$1" \
        --json "/tmp/rw_$2.json" >"/tmp/rw_$2.log" 2>&1
    echo "realworld group $2 exited $?" >>"/tmp/rw_$2.log"
}
n=0
for group in ${PROGRAMS:-mnist,vae dcgan,word_language_model nanogpt nanogpt_compile \
    mingpt_adder,hf_trainer_gpt2,lightning_transformer gcn,mnist_rnn,siamese_network,imagenet}; do
    n=$((n + 1))
    rw "$group" "$n" &
done
if [ "${TESTS:-1}" != 0 ]; then
    timeout 300 $py -m pytest -p no:cacheprovider -n 4 -m cuda tests/integration/test_cuda.py \
        tests/integration/test_memory_cuda.py tests/unit/test_readback.py >"$out/pytest.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.log" | tail -15
fi
wait
cat /tmp/rw_*.log >"$out/rw.log"
$py - "$out/rw.json" /tmp/rw_*.json <<'PY'
import json, sys
merged = {}
for name in sys.argv[2:]:
    for key, value in json.load(open(name)).items():
        merged[key] = merged.get(key, []) + value if isinstance(value, list) else value
json.dump(merged, open(sys.argv[1], "w"), indent=1)
PY
grep -E "^[a-z0-9_]+: |^bug |^real bug |exited" "$out/rw.log"
