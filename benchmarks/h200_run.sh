#!/usr/bin/env bash
# What a run on an H200 checks and measures, every file into OUTDIR; PARTS, comma-separated:
#   tests    the cuBLASLt declarations against its headers; the whole suite on the CPU
#            platform, beside it the GPU tests; the cold/warm experiment
#   retest   the GPU kernel and export tests, and the CPU-platform tests named in RETEST_CPU
#   gpu      the cuBLASLt declarations against its headers and the GPU tests alone, on
#            GPU_TEST_WORKERS processes (default 4)
#   models   the model conformance suite (tests/models) at real sizes
#   cold     cold tuned GPT-2-small bf16 training runs (benchmarks/cold_runs.py), COLD_RUNS of them
#   bench    the GPU suite with its peers
#   context  the context suite's plain and tuned side (context_suite.py --phase jax)
#   inductor the context suite's Inductor side, one child per case and variant
#   model    the model steps (MODELS: gpt2, llama, vit, decode; PARAM_DTYPE float32 or bfloat16;
#            VARIANTS, default plain,layers,autotune; MODEL_ARGS, more of model_step.py's flags,
#            e.g. "--beside-layers --steps 50")
#   moe      the grouped-matmul suite (MOE_CASES, MOE_MODES default bare,backward; torch beside)
#   profile  a training step's device time by kernel class (PROFILE_MODELS, PROFILE_VARIANTS)
#     bash benchmarks/h200_run.sh OUTDIR tests
# The package is built and installed once per run. Wheels put in .whl/ (packages the machine
# lacks, e.g. platformdirs) are installed first, offline.
set -u
out=$(mkdir -p "${1:?OUTDIR}" && cd "$1" && pwd)
parts=${2:-tests}
repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if ls "$repo"/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$repo"/.whl/*.whl && export PYTHONPATH=/tmp/site
fi
start=$(date +%s)
if ! python3 -m pip install -q --no-build-isolation --no-deps "$repo" > "$out/install.log" 2>&1; then
  tail -40 "$out/install.log"; exit 1
fi
echo "installed in $(( $(date +%s) - start )) s" >> "$out/install.log"
cd /tmp || exit 1
python3 -c "import sys, jax, jaxlib, numpy, jax_autotune, jax_autotune.kernels.cpu.native as n; \
print('python', sys.version.split()[0], 'jax', jax.__version__, 'jaxlib', jaxlib.__version__, \
'numpy', numpy.__version__, 'jax_autotune', jax_autotune.__version__, 'native isa', n.isa(), \
'devices', jax.devices())" > "$out/versions.txt" 2>&1
pytest=(python3 -m pytest -q -p no:cacheprovider)
for part in ${parts//,/ }; do
  case "$part" in
    tests)
      python3 "$repo/benchmarks/check_cublaslt_abi.py" > "$out/cublaslt_abi.json" 2>&1
      ( JAX_PLATFORMS=cpu JAX_AUTOTUNE_CACHE_DIR=/tmp/cpu_suite_cache timeout 400 \
          "${pytest[@]}" -n 8 "$repo/tests" > "$out/tests_cpu_platform.log" 2>&1
        echo "exit $?" >> "$out/tests_cpu_platform.log" ) &
      JAX_AUTOTUNE_CACHE_DIR=/tmp/gpu_tests_cache timeout 400 "${pytest[@]}" --durations=12 -m gpu \
        "$repo/tests" > "$out/tests_gpu.log" 2>&1
      echo "exit $?" >> "$out/tests_gpu.log"
      wait
      timeout 80 jax-autotune shapes 1024 768 1000 2048 --json "$out/shapes.json" > "$out/shapes.txt" 2>&1
      echo "exit $?" >> "$out/shapes.txt"
      ;;
    gpu)
      python3 "$repo/benchmarks/check_cublaslt_abi.py" > "$out/cublaslt_abi.json" 2>&1
      # -v: a test the timeout stops is named (the one started and never reported)
      JAX_AUTOTUNE_CACHE_DIR=/tmp/gpu_tests_cache timeout "${GPU_TESTS_TIMEOUT:-300}" "${pytest[@]}" -vv \
        -n "${GPU_TEST_WORKERS:-4}" --durations=12 -m gpu "$repo/tests" > "$out/tests_gpu.log" 2>&1
      echo "exit $?" >> "$out/tests_gpu.log"
      ;;
    models)
      JAX_AUTOTUNE_MODEL_SIZE=real JAX_AUTOTUNE_CACHE_DIR=/tmp/models_cache timeout "${MODELS_TIMEOUT:-300}" \
        "${pytest[@]}" -n "${MODEL_TEST_WORKERS:-2}" --durations=12 "$repo/tests/models" > "$out/tests_models_real.log" 2>&1
      echo "exit $?" >> "$out/tests_models_real.log"
      ;;
    cold)
      ( cd "$repo/benchmarks" && timeout "${COLD_TIMEOUT:-540}" python3 cold_runs.py --out "$out" \
          --runs "${COLD_RUNS:-10}" --parallel "${COLD_PARALLEL:-2}" > "$out/cold_runs.log" 2>&1
        echo "exit $?" >> "$out/cold_runs.log" )
      ;;
    context)
      ( cd "$repo/benchmarks" && timeout "${CONTEXT_TIMEOUT:-330}" python3 context_suite.py --out "$out" \
          --phase jax > "$out/context_jax.log" 2>&1
        echo "exit $?" >> "$out/context_jax.log" )
      ;;
    inductor)
      ( cd "$repo/benchmarks" && timeout "${INDUCTOR_TIMEOUT:-540}" python3 context_suite.py --out "$out" \
          --phase inductor --inductor-case-budget-s "${INDUCTOR_CASE_S:-60}" > "$out/context_inductor.log" 2>&1
        echo "exit $?" >> "$out/context_inductor.log" )
      ;;
    retest)
      ( JAX_PLATFORMS=cpu JAX_AUTOTUNE_CACHE_DIR=/tmp/cpu_retest_cache timeout 200 "${pytest[@]}" -n 4 \
          $(for f in ${RETEST_CPU:-}; do echo "$repo/tests/$f"; done) > "$out/retest_cpu_platform.log" 2>&1
        echo "exit $?" >> "$out/retest_cpu_platform.log" ) &
      JAX_AUTOTUNE_CACHE_DIR=/tmp/gpu_retest_cache timeout 150 "${pytest[@]}" \
        "$repo/tests/test_gpu_kernels.py" "$repo/tests/test_export.py" > "$out/retest_gpu.log" 2>&1
      echo "exit $?" >> "$out/retest_gpu.log"
      wait
      ;;
    bench)
      ( cd "$repo/benchmarks" && timeout 450 python3 gpu_suite.py --out "$out" --subset all --budget-s 120 \
          --inductor-budget-s 70 --exhaustive-budget-s 35 > "$out/gpu_suite.log" 2>&1
        echo "exit $?" >> "$out/gpu_suite.log" )
      ;;
    model)
      ( cd "$repo/benchmarks" && timeout "${MODEL_TIMEOUT:-560}" python3 model_step.py --out "$out" \
          --models "${MODELS:-gpt2,llama}" --variants "${VARIANTS:-plain,layers,autotune}" \
          --param-dtype "${PARAM_DTYPE:-float32}" \
          --timeout-s "${VARIANT_TIMEOUT:-150}" ${MODEL_ARGS:-} > "$out/model_step.log" 2>&1
        echo "exit $?" >> "$out/model_step.log" )
      ;;
    moe)
      ( cd "$repo/benchmarks" && timeout "${MOE_TIMEOUT:-540}" python3 moe_suite.py --out "$out" \
          --cases "${MOE_CASES:-deepseek_up,qwen_moe_up,qwen_moe_down}" --modes "${MOE_MODES:-bare,backward}" \
          --peers torch --peer-timeout-s 80 > "$out/moe_suite.log" 2>&1
        echo "exit $?" >> "$out/moe_suite.log" )
      ;;
    profile)
      ( cd "$repo/benchmarks" && timeout "${PROFILE_TIMEOUT:-300}" python3 step_profile.py --out "$out" \
          --models "${PROFILE_MODELS:-gpt2}" --variants "${PROFILE_VARIANTS:-plain,layers,autotune}" \
          > "$out/step_profile.log" 2>&1
        echo "exit $?" >> "$out/step_profile.log" )
      ;;
  esac
done
echo "done in $(( $(date +%s) - start )) s"
