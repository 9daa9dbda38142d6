#!/usr/bin/env bash
# Everything the project checks on a GPU machine, in one call, with logs under $OUT (default: ./gpu-checks):
#   build (one architecture by default), the GPU half of the test suite, compute-sanitizer memcheck and racecheck on
#   tests/gpu_sanitizer_matrix.py (also under JAX_FLASH_KERNELS=sm86), the standalone decode harness (and its checks
#   under memcheck), and a benchmark grid beside cuDNN (and flash-attn3-jax when importable).
#
#   bash tests/gpu_checks.sh                      # all steps
#   STEPS="build tests" bash tests/gpu_checks.sh  # a subset; STEPS="build fuzz" adds tests/fuzz_attention.py
#   WHEEL=dist/jax_flash-*.whl STEPS=wheel bash tests/gpu_checks.sh
#                                                 # a built wheel in a fresh venv: the GPU tests from outside the tree
#
# Knobs: CUTLASS_WHEEL (see below), FA3_WHEEL (a flash-attn3-jax wheel, unpacked so the benchmark runs it as a peer),
# WHEEL (the wheel step), JAX_FLASH_CUDA_ARCHITECTURES (default 90a-real), GRID (default anchors), SEQS (benchmark
# sequence lengths, default all), TEST_WORKERS (default 8), TEST_SECONDS (default 480), and the usual
# JAX_FLASH_HEAD_DIMS / JAX_FLASH_DTYPES pruning.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$repo/gpu-checks}
target=${TARGET:-/tmp/jax_flash_gpu_checks}
steps=${STEPS:-build tests sanitizer decode benchmark}
mkdir -p "$out"
export JAX_FLASH_CUDA_ARCHITECTURES=${JAX_FLASH_CUDA_ARCHITECTURES:-90a-real} JAX_FLASH_PTXAS_VERBOSE=ON
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} XLA_PYTHON_CLIENT_PREALLOCATE=false
# A machine without network or CUTLASS: CUTLASS_WHEEL=path/to/nvidia_cutlass-*.whl is unpacked for the build.
if [[ -n "${CUTLASS_WHEEL:-}" ]]; then
  python3 -m pip install -q --no-deps --target /tmp/jax_flash_cutlass "$CUTLASS_WHEEL"
  export PYTHONPATH=/tmp/jax_flash_cutlass${PYTHONPATH:+:$PYTHONPATH}
fi
if [[ -n "${FA3_WHEEL:-}" ]]; then
  python3 -m pip install -q --no-deps --target /tmp/jax_flash_fa3 "$FA3_WHEEL"
  export PYTHONPATH=/tmp/jax_flash_fa3${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$target${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - start )) s] $*"; }
has() { [[ " $steps " == *" $1 "* ]]; }

if has build; then
  (cd "$repo" && python3 -m pip install -v --no-build-isolation --no-deps --target "$target" .) >"$out/build.log" 2>&1 \
    || { tail -n 40 "$out/build.log"; exit 1; }
  python3 "$repo/csrc/cuda/tensor_core/ptxas_table.py" "$out/build.log" >"$out/ptxas_table.md"
  elapsed "built; $(grep -c 'Used [0-9]* registers' "$out/build.log") kernels, spills: $(grep -Eo '[1-9][0-9]* bytes spill stores' "$out/build.log" | wc -l)"
fi
# Run from outside the checkout, whose jax_flash folder has no compiled extension.
cd /tmp
if has tests; then
  # -v names each result as it lands, so a run cut short by the call's time limit still says what failed.
  timeout "${TEST_SECONDS:-480}" python3 -m pytest "$repo/tests" -v -n "${TEST_WORKERS:-8}" -p no:cacheprovider \
    -rfE --tb=short -k "not cpu" >"$out/tests.log" 2>&1
  elapsed "tests: $(grep -c ' PASSED ' "$out/tests.log") passed, $(grep -c ' FAILED ' "$out/tests.log") failed; $(tail -n 1 "$out/tests.log")"
  grep -E ' FAILED ' "$out/tests.log" | sed 's/.* FAILED //' | head -n 20
fi
if has wheel; then
  # A fresh venv holding only the wheel; jax and the test dependencies come from this machine's own Python through a
  # .pth file (a GPU machine without network cannot install them). Tests run with the venv's Python from /tmp.
  venv=/tmp/jax_flash_wheel_venv
  rm -rf "$venv" && python3 -m venv "$venv"
  # The wheel goes in before the .pth exists, so pip cannot mistake a jax_flash of the machine's for it.
  "$venv/bin/python" -m pip install -q --no-deps --no-index "${WHEEL:?WHEEL=path/to/jax_flash-*.whl}"
  venv_site=$("$venv/bin/python" -c "import site; print(site.getsitepackages()[0])")
  python3 -c "import site; print(site.getsitepackages()[0])" >"$venv_site/machine.pth"
  (cd /tmp && env -u PYTHONPATH "$venv/bin/python" -c "import jax_flash; print('imported from', jax_flash.__file__)" \
     && env -u PYTHONPATH "$venv/bin/python" -m jax_flash.info) >"$out/wheel_info.log" 2>&1
  grep -q "imported from $venv_site" "$out/wheel_info.log" || { echo "jax_flash did not import from the wheel's venv"; exit 1; }
  timeout "${TEST_SECONDS:-480}" env -u PYTHONPATH "$venv/bin/python" -m pytest "$repo/tests" -v -n "${TEST_WORKERS:-8}" \
    -p no:cacheprovider -rfE --tb=short -k "not cpu" >"$out/tests_wheel.log" 2>&1
  elapsed "wheel tests: $(grep -c ' PASSED' "$out/tests_wheel.log") passed, $(grep -c ' FAILED' "$out/tests_wheel.log") failed; $(tail -n 1 "$out/tests_wheel.log")"
fi
if has sanitizer; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 python3 "$repo/tests/gpu_sanitizer_matrix.py" \
      >"$out/sanitizer_$tool.log" 2>&1
    elapsed "$tool exit $?: $(grep -E 'SUMMARY' "$out/sanitizer_$tool.log")"
  done
  # The small tiles and decode plans of GPUs whose blocks get 99 KB of shared memory (sm86, sm89).
  for tool in memcheck racecheck; do
    JAX_FLASH_KERNELS=sm86 compute-sanitizer --tool "$tool" --error-exitcode 9 python3 \
      "$repo/tests/gpu_sanitizer_matrix.py" --groups dense,tokens,decode >"$out/sanitizer_sm86_$tool.log" 2>&1
    elapsed "sm86 $tool exit $?: $(grep -E 'SUMMARY' "$out/sanitizer_sm86_$tool.log")"
  done
fi
if has decode; then
  # Built by the one recipe the copy A/B uses too (its "main" variant: the tree unchanged).
  harness=/tmp/decode_harness_build/decode_harness_main
  python3 "$repo/tests/cuda/decode_copy_variants.py" build "$(dirname "$harness")" main \
    && "$harness" >"$out/decode_harness.log" 2>&1
  elapsed "decode harness exit $?: $(tail -n 1 "$out/decode_harness.log")"
  # Its correctness cases again, under memcheck (the decode cases of the sanitizer step go through JAX).
  compute-sanitizer --tool memcheck --error-exitcode 9 "$harness" --check-only \
    >"$out/decode_harness_memcheck.log" 2>&1
  elapsed "decode harness memcheck exit $?: $(grep -E 'SUMMARY' "$out/decode_harness_memcheck.log")"
fi
if has fuzz; then  # not among the default steps: FUZZ_CASES random cases (default 200), a few minutes
  PYTHONPATH=$repo/tests:$PYTHONPATH python3 "$repo/tests/fuzz_attention.py" --platform gpu \
    --cases "${FUZZ_CASES:-200}" >"$out/fuzz.log" 2>&1
  elapsed "fuzz exit $?: $(tail -n 1 "$out/fuzz.log")"
  grep FAILED "$out/fuzz.log" | head -n 20
fi
if has benchmark; then
  python3 -m jax_flash.benchmark --grid "${GRID:-anchors}" ${SEQS:+--seqs "$SEQS"} --json "$out/benchmark.json" \
    --plot "$out/benchmark.png" >"$out/benchmark.log" 2>&1
  elapsed "benchmark exit $?"
  grep -E '^\|' "$out/benchmark.log"
fi
