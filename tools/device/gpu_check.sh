#!/usr/bin/env bash
# Runs kiln's GPU checks and benchmarks on a CUDA machine, from binaries built elsewhere.
# Usage: tools/device/gpu_check.sh BIN_DIR OUT_DIR MODE... (the modes below)
#   BIN_DIR holds `kiln`, the `gpu` test binary (cargo test --release --no-run --test gpu) and
#   `runtime` (kiln-runtime's unit tests: cargo test --release --no-run -p kiln-runtime --lib),
#   built with --features nccl so the NCCL checks (a world of one on this GPU) run too.
#   A fresh machine compiles every kernel module at the first start (about a minute): a cache
#   filled beside the build (`kiln cache fill --arch sm_90`, with the NVRTC version the device
#   has), carried along and named by KILN_CACHE_DIR, is read instead.
#   tests:    the GPU tests (tests/gpu.rs, the CUDA executable's unit tests) with
#             KILN_REQUIRE_GPU=1 (a skip fails), `kiln demo`, `kiln eval` against the oracle
#   sanitize: compute-sanitizer memcheck and racecheck over the tiny programs, 1 and 2 streams,
#             and memcheck with cuBLASLt's algorithms chosen by timing
#   nan:      one NaN in the tiny model's lm_head.weight: `kiln eval` loss on the CPU and GPU
#   bench:  `kiln bench` rows of BENCHMARKS.md (JSON lines in OUT_DIR/bench.jsonl)
#   fused:  bf16 inference rows (fused, unfused, skinny-kernel limits) and the compiled PyTorch
#           decode peer (BIN_DIR/fast_decode.py)
#   serve:  the schedulers on the GPU: the tiny preset's continuous batching (eager and graph)
#           against the CPU reference, then `kiln bench --program serve` rows of BENCHMARKS.md
#   rows:   bf16 decode of Qwen2.5-0.5B at every batch of 1..32 that a bucket rounds up (the
#           cost of a padding row: exact-size programs against the engine's doublings)
#   pdl:    bf16 decode (B=1, 8, 32) and prefill rows with programmatic dependent launch on
#           and off, alternating, then the compiled PyTorch decode peer (BIN_DIR/fast_decode.py)
#   clusters: bf16 decode (B=1, 8, 32) with split linears finished in thread block clusters
#           and by reduce launches, alternating, two rounds, then the compiled PyTorch decode peer
#   train:  mixed-precision train rows ($TRAIN_ROWS, MODEL:SEQ ...; default 0.5B T=512 and
#           2048, 1.5B T=512) of every build named in $BUILDS (kiln binaries in BIN_DIR;
#           default `kiln`) in every precision named in $PRECISIONS (default bf16-gemm; e.g.
#           "bf16-gemm bf16-swiglu"), alternating, $ROUNDS rounds (default 2), then the train
#           peer (ANCHORS.md's train_anchor.py, given as BIN_DIR/train_anchor.py) for $PEER
#           (presets of train_anchor.py; default none)
#   prefill: bf16 prefill rows (Qwen2.5-0.5B T=512 and 2048, DeepSeek-1.5B T=512) of every
#           build named in $BUILDS (kiln binaries in BIN_DIR; default `kiln`), alternating,
#           $ROUNDS rounds (default 2), each with its `check` to compare between builds
#   decode: the same for bf16 decode rows (Qwen2.5-0.5B B=1, 8 and 32, DeepSeek-1.5B B=1)
#   tune:   cuBLASLt's algorithms chosen by timing (`--gemm-tune on`) against its heuristic's
#           (off), alternating, two rounds: bf16 prefill (0.5B T=512 and 2048, 1.5B T=512), bf16
#           decode B=32 (its linears on cuBLASLt) and bf16-swiglu train (0.5B T=512 and 2048),
#           each with its `check` and the time to bind (the tuning's cost)
#   portable: the HIP backend's lowering on this device (`--portable on`: kiln's tiled GEMM, the
#           portable tensor-core code, no clusters) against the CUDA defaults, alternating:
#           bf16 decode B=1 and 8, prefill T=512, bf16-GEMM train T=512 of Qwen2.5-0.5B, each
#           with its `check` (last loss, max |logit|) to compare between the two (the portable
#           code against the CPU reference is in `tests`)
#   parallel: rank programs through NCCL against the plain ones (a world of one on one GPU;
#           `kiln launch` over every GPU where there are several): JSON lines in parallel.jsonl
#   anchor: the PyTorch anchor (ANCHORS.md's torch_anchor.py, given as BIN_DIR/torch_anchor.py)
#   profile: each kernel's time and DRAM bytes (ncu gpu__time_duration.sum and dram__bytes.sum,
#           clocks and caches not reset) in one eager bf16 decode (B=1) and prefill (T=512)
#           step of Qwen2.5-0.5B, then the bf16-swiglu train step at $PROFILE_TRAIN_SEQ (default
#           2048; 0: none) of every build in $BUILDS (default `kiln`), its kernels those whose
#           names match $PROFILE_KERNELS (an ncu regex; default all), as tables
#           (tools/device/ncu_table.py) in OUT_DIR/ncu_<program>[_<build>].md beside the CSVs
set -uo pipefail
bin=$1; out=$2; shift 2

# The driver, NVRTC and cuBLASLt: the CUDA toolkit's or the Python wheels' copies.
libs=$(find /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/lib/x86_64-linux-gnu \
  $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
  -maxdepth 5 \( -name 'libnvrtc.so*' -o -name 'libcublasLt.so*' \) 2>/dev/null | grep -v /stubs/ | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:-}"
# NCCL for a build with --features nccl: cudarc asks for libnccl.so; the wheel ships
# libnccl.so.2, so a link to it goes into a directory of its own on the path.
nccl=$(find $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
  /usr/lib/x86_64-linux-gnu -maxdepth 5 -name 'libnccl.so*' 2>/dev/null | head -1)
if [ -n "$nccl" ]; then
  ncclink=$(mktemp -d)
  ln -s "$nccl" "$ncclink/libnccl.so"
  export LD_LIBRARY_PATH="$ncclink:$LD_LIBRARY_PATH"
fi
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# The last JSON line of FILE printed as LABEL and the named fields it has.
last_row() {
  local file=$1 label=$2
  shift 2
  python3 -c "import json, sys; r = json.loads(open(sys.argv[1]).readlines()[-1]); \
    print(sys.argv[2], {k: r[k] for k in sys.argv[3:] if k in r})" "$file" "$label" "$@"
}

# ncu's time and DRAM bytes of each kernel (those whose names match the ncu regex KERNELS) of
# one eager step of `kiln bench ARGS...`, into OUT_DIR/ncu_NAME.csv, then as a table into
# ncu_NAME.md. The clocks left as replay runs them, and each kernel's caches as its predecessor
# left them (ncu's defaults, base clocks and flushed caches, overstate short kernels).
ncu_step() {
  local name=$1 kernels=$2
  shift 2
  ncu --clock-control none --cache-control none -k "regex:$kernels" \
    --metrics gpu__time_duration.sum,dram__bytes.sum --csv \
    "$@" --mode eager --warmup 0 --steps 1 \
    >"$out/ncu_$name.csv" 2>"$out/ncu_$name.err" || echo "ncu $name FAILED (see ncu_$name.err)"
  python3 "$(dirname "$0")/ncu_table.py" "$out/ncu_$name.csv" | tee "$out/ncu_$name.md"
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv

for what in "$@"; do
  case $what in
    tests)
      KILN_REQUIRE_GPU=1 "$bin/gpu" --test-threads=1 --nocapture 2>&1 | tee "$out/gpu_tests.log"
      echo "gpu tests exit: ${PIPESTATUS[0]}"
      # The device executable's unit tests (kiln-runtime's gpu:: module) and the GEMM
      # tuner's; a filter that selects none is a failure, not a pass.
      for filter in gpu:: cuda::gemm_tuning; do
        log="$out/runtime_cuda_tests_${filter//:/_}.log"
        KILN_REQUIRE_GPU=1 "$bin/runtime" --test-threads=1 --nocapture "$filter" 2>&1 | tee "$log"
        echo "runtime $filter tests exit: ${PIPESTATUS[0]}"
        grep -q "^test result: ok. 0 passed" "$log" \
          && echo "FAILED: no runtime $filter test ran (the filter matches none)"
      done
      "$bin/kiln" demo 2>&1 | tee "$out/demo.log"
      echo "demo exit: ${PIPESTATUS[0]}"
      # kiln eval on the GPU (planned and replayed) against the oracle on the CPU.
      scratch=$(mktemp -d)
      python3 -c "import numpy as np; from safetensors.numpy import save_file; \
        save_file({'tokens': np.random.default_rng(7).integers(0, 97, (3, 9)).astype(np.int64)}, '$scratch/tokens.safetensors')"
      for model in tiny; do
        "$bin/kiln" eval --model $model --tokens "$scratch/tokens.safetensors" --grads --mode oracle --out "$scratch/oracle.safetensors"
        for mode in planned graph; do
          "$bin/kiln" eval --model $model --tokens "$scratch/tokens.safetensors" --grads --mode $mode --device cuda \
            --out "$scratch/$mode.safetensors" && \
          python3 "$(dirname "$0")/compare_safetensors.py" "$scratch/oracle.safetensors" "$scratch/$mode.safetensors" 1e-5 \
            | sed "s/^/eval --device cuda --mode $mode vs oracle: /"
        done
      done
      ;;
    sanitize)
      for tool in memcheck racecheck; do
        for program in prefill decode train; do
          for streams in 1 2; do
            for mode in eager graph; do
              compute-sanitizer --tool $tool --error-exitcode 9 "$bin/kiln" bench --model tiny \
                --program $program --batch 2 --seq 8 --context 8 --streams $streams --mode $mode \
                --warmup 0 --steps 1 >"$out/sanitize_last.log" 2>&1
              code=$?
              echo "compute-sanitizer $tool $program streams=$streams $mode: exit $code, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_last.log" | tr '\n' ' ')"
              [ $code -ne 0 ] && cp "$out/sanitize_last.log" "$out/sanitize_${tool}_${program}_${streams}_${mode}.log"
            done
          done
        done
      done
      # cuBLASLt's algorithms chosen by timing: its scratch memory and captured graphs, every
      # linear on cuBLASLt.
      for program in prefill train; do
        compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/kiln" bench --model tiny \
          --program $program --precision bf16-gemm --batch 2 --seq 8 --linear-rows 0 \
          --gemm-tune on --warmup 0 --steps 1 >"$out/sanitize_last.log" 2>&1
        code=$?
        echo "compute-sanitizer memcheck $program --gemm-tune on: exit $code, $(grep -E 'ERROR SUMMARY' "$out/sanitize_last.log" | tr '\n' ' ')"
        [ $code -ne 0 ] && cp "$out/sanitize_last.log" "$out/sanitize_tune_${program}.log"
      done
      ;;
    nan)
      scratch=$(mktemp -d)
      "$bin/kiln" init-model --preset tiny --seed 3 --out "$scratch/model" >/dev/null
      python3 - "$scratch" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file, save_file
d = sys.argv[1]
w = load_file(f"{d}/model/model.safetensors")
w["lm_head.weight"] = w["lm_head.weight"].copy()
w["lm_head.weight"].flat[123] = np.nan
save_file(w, f"{d}/model/model.safetensors")
save_file({"tokens": np.random.default_rng(5).integers(0, 97, (2, 9)).astype(np.int64)}, f"{d}/tokens.safetensors")
PY
      for run in "oracle cpu" "planned cpu" "planned cuda" "graph cuda"; do
        read -r mode device <<<"$run"
        "$bin/kiln" eval --model "$scratch/model" --tokens "$scratch/tokens.safetensors" --mode $mode \
          --device $device --out "$scratch/$mode-$device.safetensors" 2>&1 \
          | sed "s/^/NaN in lm_head: eval --mode $mode --device $device: /"
      done
      ;;
    bench)
      for model in qwen2.5-0.5b deepseek-r1-distill-qwen-1.5b; do
        rows=("decode --mode graph" "decode --mode eager"
              "prefill --mode graph" "prefill --mode graph --precision bf16-gemm"
              "train --mode graph" "train --mode graph --precision bf16-gemm")
        for args in "${rows[@]}"; do
          echo "== $model $args"
          "$bin/kiln" bench --model $model --program $args --json >>"$out/bench.jsonl" 2>>"$out/bench.log" \
            || echo "FAILED: $model $args (see bench.log)"
          tail -n 1 "$out/bench.jsonl"
        done
      done
      ;;
    fused)
      # bf16 inference rows (the defaults, and the unfused reference at B=1); the compiled-
      # PyTorch decode peer (ANCHORS.md's fast_decode.py, given as BIN_DIR/fast_decode.py) after.
      for model in qwen2.5-0.5b deepseek-r1-distill-qwen-1.5b; do
        for args in "--batch 1" "--batch 2" "--batch 8" "--batch 32" "--batch 1 --fusion off" \
                    "--batch 2 --linear-rows 32" "--batch 8 --linear-rows 32" \
                    "--batch 32 --linear-rows 32"; do
          echo "== $model decode bf16 $args"
          "$bin/kiln" bench --model $model --program decode --precision bf16 $args \
            --json >>"$out/fused.jsonl" 2>>"$out/fused.log" || echo "FAILED (see fused.log)"
          tail -n 1 "$out/fused.jsonl"
        done
        echo "== $model prefill bf16"
        "$bin/kiln" bench --model $model --program prefill --precision bf16 --json \
          >>"$out/fused.jsonl" 2>>"$out/fused.log" || echo "FAILED (see fused.log)"
        tail -n 1 "$out/fused.jsonl"
      done
      PYTHONUNBUFFERED=1 python3 "$bin/fast_decode.py" qwen2.5-0.5b 1 8 32 2>&1 | tee "$out/peer.log"
      PYTHONUNBUFFERED=1 python3 "$bin/fast_decode.py" ds-r1-qwen-1.5b 1 2>&1 | tee -a "$out/peer.log"
      ;;
    serve)
      scratch=$(mktemp -d)
      python3 -c "import json, random; r = random.Random(3); \
        print('\n'.join(json.dumps({'prompt_ids': [r.randrange(97) for _ in range(r.randrange(1, 14))]}) for _ in range(11)))" \
        >"$scratch/prompts.jsonl"
      common=(generate --model tiny --prompts "$scratch/prompts.jsonl" --temperature 0 --max-new-tokens 9)
      "$bin/kiln" "${common[@]}" --json "$scratch/cpu.json"
      for mode in eager graph; do
        "$bin/kiln" "${common[@]}" --device cuda --mode $mode --scheduler continuous --slots 4 \
          --json "$scratch/cuda-$mode.json"
        python3 -c "import json, sys; a, b = (json.load(open(f))['requests'] for f in sys.argv[1:]); \
          same = sum(x['tokens'] == y['tokens'] for x, y in zip(a, b)); \
          print(f'tiny continuous cuda $mode vs reference cpu: same tokens for {same} of {len(a)} requests')" \
          "$scratch/cpu.json" "$scratch/cuda-$mode.json"
      done
      "$bin/kiln" bench --model tiny --program serve --requests 12 --seq 12 --new-tokens 8 --slots 4 \
        --arrival-every 1 2>&1 | tee "$out/serve_tiny.log"
      for args in "--arrival-every 0" "--arrival-every 2"; do
        echo "== qwen2.5-0.5b serve bf16 $args"
        "$bin/kiln" bench --model qwen2.5-0.5b --program serve --precision bf16 --requests 32 \
          --seq 64 --new-tokens 64 --slots 32 $args --json >>"$out/serve.jsonl" 2>>"$out/serve.log" \
          || echo "FAILED (see serve.log)"
        tail -n 1 "$out/serve.jsonl"
      done
      ;;
    rows)
      for batch in 1 2 3 4 5 6 8 9 12 16 17 20 24 28 32; do
        "$bin/kiln" bench --model qwen2.5-0.5b --program decode --precision bf16 --batch $batch \
          --json >>"$out/rows.jsonl" 2>>"$out/rows.log" || echo "FAILED: batch $batch (see rows.log)"
        last_row "$out/rows.jsonl" "decode bf16 batch $batch" median_ms p95_ms launches_per_step hbm_floor_ms
      done
      ;;
    pdl)
      for model in qwen2.5-0.5b deepseek-r1-distill-qwen-1.5b; do
        for args in "--program decode --batch 1" "--program decode --batch 8" \
                    "--program decode --batch 32" "--program prefill"; do
          for pdl in on off; do
            "$bin/kiln" bench --model $model --precision bf16 $args --pdl $pdl \
              --json >>"$out/pdl.jsonl" 2>>"$out/pdl.log" || echo "FAILED: $model $args (see pdl.log)"
            last_row "$out/pdl.jsonl" "$model $args --pdl $pdl" median_ms p95_ms launches_per_step hbm_floor_ms pdl
          done
        done
      done
      PYTHONUNBUFFERED=1 python3 "$bin/fast_decode.py" qwen2.5-0.5b 1 8 32 2>&1 | tee "$out/peer.log"
      PYTHONUNBUFFERED=1 python3 "$bin/fast_decode.py" ds-r1-qwen-1.5b 1 2>&1 | tee -a "$out/peer.log"
      ;;
    clusters)
      for round in 1 2; do
        for model in qwen2.5-0.5b deepseek-r1-distill-qwen-1.5b; do
          for batch in 1 8 32; do
            for clusters in on off; do
              "$bin/kiln" bench --model $model --program decode --precision bf16 --batch $batch \
                --clusters $clusters --json >>"$out/clusters.jsonl" 2>>"$out/clusters.log" \
                || echo "FAILED: $model B=$batch --clusters $clusters (see clusters.log)"
              last_row "$out/clusters.jsonl" "round $round $model B=$batch --clusters $clusters" \
                median_ms p95_ms launches_per_step clusters
            done
          done
        done
      done
      PYTHONUNBUFFERED=1 python3 "$bin/fast_decode.py" qwen2.5-0.5b 1 8 32 2>&1 | tee "$out/peer.log"
      PYTHONUNBUFFERED=1 python3 "$bin/fast_decode.py" ds-r1-qwen-1.5b 1 2>&1 | tee -a "$out/peer.log"
      ;;
    train)
      train_rows=${TRAIN_ROWS:-qwen2.5-0.5b:512 qwen2.5-0.5b:2048 deepseek-r1-distill-qwen-1.5b:512}
      for round in $(seq "${ROUNDS:-2}"); do
        for row in $train_rows; do
          IFS=: read -r model seq <<<"$row"
          if ! [[ $seq =~ ^[0-9]+$ ]]; then
            echo "FAILED: TRAIN_ROWS entry '$row' is no MODEL:SEQ"
            continue
          fi
          for build in ${BUILDS:-kiln}; do
            for precision in ${PRECISIONS:-bf16-gemm}; do
              rows="$out/train_${build}_$precision.jsonl"
              "$bin/$build" bench --model $model --program train --precision $precision \
                --seq $seq --json >>"$rows" 2>>"$out/train.log" \
                || echo "FAILED: $build $precision $model T=$seq (see train.log)"
              last_row "$rows" "round $round $build $precision $model T=$seq" median_ms p95_ms \
                launches_per_step beyond_params_and_state_bytes arena_bytes lower_bound_bytes check
            done
          done
        done
      done
      for preset in ${PEER:-}; do
        PYTHONUNBUFFERED=1 python3 "$bin/train_anchor.py" $preset 512 2048 2>&1 | tee -a "$out/train_peer.log"
      done
      ;;
    prefill|decode)
      # Prefill T=512 and 2048 (1.5B T=512), or decode B=1, 8 and 32 (1.5B B=1), bf16.
      case $what in
        prefill) rows="qwen2.5-0.5b:--seq:512 qwen2.5-0.5b:--seq:2048 deepseek-r1-distill-qwen-1.5b:--seq:512" ;;
        decode) rows="qwen2.5-0.5b:--batch:1 qwen2.5-0.5b:--batch:8 qwen2.5-0.5b:--batch:32 deepseek-r1-distill-qwen-1.5b:--batch:1" ;;
      esac
      for round in $(seq "${ROUNDS:-2}"); do
        for row in $rows; do
          IFS=: read -r model flag size <<<"$row"
          for build in ${BUILDS:-kiln}; do
            jsonl="$out/${what}_$build.jsonl"
            "$bin/$build" bench --model $model --program $what --precision bf16 $flag $size \
              --json >>"$jsonl" 2>>"$out/$what.log" \
              || { echo "FAILED: $build $model $flag $size (see $what.log)"; continue; }
            last_row "$jsonl" "round $round $build $model $flag $size" median_ms p95_ms launches_per_step check
          done
        done
      done
      ;;
    tune)
      for round in 1 2; do
        for args in "--model qwen2.5-0.5b --program prefill --precision bf16 --seq 512" \
                    "--model qwen2.5-0.5b --program prefill --precision bf16 --seq 2048" \
                    "--model deepseek-r1-distill-qwen-1.5b --program prefill --precision bf16 --seq 512" \
                    "--model qwen2.5-0.5b --program decode --precision bf16 --batch 32" \
                    "--model qwen2.5-0.5b --program train --precision bf16-swiglu --seq 512" \
                    "--model qwen2.5-0.5b --program train --precision bf16-swiglu --seq 2048"; do
          for tune in off on; do
            "$bin/kiln" bench $args --gemm-tune $tune --json >>"$out/tune.jsonl" 2>>"$out/tune.log" \
              || { echo "FAILED: $args --gemm-tune $tune (see tune.log)"; continue; }
            python3 -c "import json, sys; r = json.loads(open(sys.argv[1]).readlines()[-1]); \
              print(sys.argv[2], {k: r[k] for k in ('median_ms', 'p95_ms', 'check', 'gemm_tune') if k in r}, \
              'bind_ms', round(r['startup']['bind_ms']))" \
              "$out/tune.jsonl" "round $round $args --gemm-tune $tune"
          done
        done
      done
      ;;
    portable)
      for row in "decode bf16 1" "decode bf16 8" "prefill bf16 1" "train bf16-gemm 1"; do
        read -r program precision batch <<<"$row"
        for portable in off on; do
          "$bin/kiln" bench --model qwen2.5-0.5b --program $program --precision $precision \
            --batch $batch --seq 512 --portable $portable --json \
            >>"$out/portable.jsonl" 2>>"$out/portable.log" \
            || echo "FAILED: $program $precision B=$batch portable=$portable (see portable.log)"
          last_row "$out/portable.jsonl" "$program $precision B=$batch portable=$portable" median_ms launches_per_step check
        done
      done
      ;;
    parallel)
      # Rows of a rank's program through NCCL against the plain program, alternating: on one
      # GPU a world of one (what the collectives cost); with N GPUs, `kiln launch --nproc N`
      # (data-parallel train: N x the rows in the time of one rank; tensor-parallel decode).
      gpus=$(nvidia-smi --list-gpus | wc -l)
      row() { # label, then kiln bench arguments
        local label=$1; shift
        "$@" --json >>"$out/parallel.jsonl" 2>>"$out/parallel.log" || echo "FAILED: $label (see parallel.log)"
        last_row "$out/parallel.jsonl" "$label" median_ms tokens_per_second ranks launches_per_step check
      }
      train="--model qwen2.5-0.5b --program train --precision bf16-gemm --batch 1 --seq 512"
      decode="--model qwen2.5-0.5b --program decode --precision bf16 --context 512"
      for round in 1 2; do
        row "train plain" "$bin/kiln" bench $train
        row "train data-parallel x1" "$bin/kiln" bench $train --data-parallel 25MiB
        for b in 1 8; do
          row "decode B=$b plain" "$bin/kiln" bench $decode --batch $b
          row "decode B=$b tensor-parallel x1" "$bin/kiln" bench $decode --batch $b --tensor-parallel 1
        done
        if [ "$gpus" -ge 2 ]; then
          row "train data-parallel x$gpus" "$bin/kiln" launch --nproc $gpus -- kiln bench $train --data-parallel 25MiB
          for b in 1 8; do
            row "decode B=$b tensor-parallel x$gpus" "$bin/kiln" launch --nproc $gpus -- kiln bench $decode --batch $b --tensor-parallel $gpus
          done
        fi
      done
      ;;
    profile)
      for program in "decode --batch 1" "prefill --seq 512"; do
        ncu_step "${program%% *}" . "$bin/kiln" bench --model qwen2.5-0.5b --program $program \
          --precision bf16
      done
      train_seq=${PROFILE_TRAIN_SEQ:-2048}
      if [ "$train_seq" != 0 ]; then
        for build in ${BUILDS:-kiln}; do
          ncu_step "train_$build" "${PROFILE_KERNELS:-.}" "$bin/$build" bench \
            --model qwen2.5-0.5b --program train --precision bf16-swiglu --seq "$train_seq"
        done
      fi
      ;;
    anchor)
      PYTHONUNBUFFERED=1 python3 "$bin/torch_anchor.py" qwen2.5-0.5b ds-r1-qwen-1.5b 2>&1 | tee "$out/anchor.log"
      python3 "$(dirname "$0")/bench_table.py" "$out" | tee "$out/tables.md"
      ;;
  esac
done
