#!/bin/bash
# The GPU check on a lent CUDA machine with no internet (issue 27), from the repository root:
#
#   bash bench/gpu_device.sh        # with .gpu/ prepared as below and carried
#
# .gpu/ (ignored by git) holds what cannot be fetched there:
#   llama.cpp.tar.xz   the pinned sdist's vendor/llama.cpp without other backends, tools/ui, tools/server
#   whl/*.whl          cp312 wheels of the dependencies the machine lacks (prompt_toolkit, wcwidth,
#                      gguf, fastapi, starlette, pydantic(+core), annotated-types, typing-inspection,
#                      uvicorn, opentelemetry-api, typing_extensions, anyio, annotated-doc, diskcache)
#   site/llama_cpp/    llama-cpp-python's Python package without its lib/ (the libraries are built there)
#   ext/_best.cpython-312-x86_64-linux-gnu.so   runner/sample/best.c built for 3.12 (no Python.h there)
#   stories260K.gguf   the tokenizer bench/gpu_model.py borrows
# It builds llama.cpp with CUDA for sm_90 (about 2.5 minutes on 16 cores, flash-attention kernels off),
# writes a 1.4 GB random-weight model, runs bench/gpu_probe.py (an offloaded old-engine load, in process,
# under faulthandler; a hang gets cuda-gdb's native stacks, a crash a second run under cuda-gdb) and
# bench/gpu_check.py (GPU_BENCH=1: llama-bench too). Everything it prints also goes to $OUT/log.txt.
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
REPO=$PWD
LOG=${OUT:-/tmp}/log.txt
step() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
step start
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl >>"$LOG" 2>&1
cp -r .gpu/site/llama_cpp /tmp/site/
cp .gpu/ext/_best.cpython-312-x86_64-linux-gnu.so runner/sample/
export PYTHONPATH=/tmp/site:$REPO
mkdir -p /tmp/lc && tar xJf .gpu/llama.cpp.tar.xz -C /tmp/lc
cmake -S /tmp/lc -B /tmp/lcb -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON >>"$LOG" 2>&1 || { step configure failed; exit 1; }
timeout 120 python3 bench/gpu_model.py /tmp/gm.gguf --tokenizer .gpu/stories260K.gguf > /tmp/gm.log 2>&1 &
model=$!
step build
cmake --build /tmp/lcb -j16 --target llama mtmd ${GPU_BENCH:+llama-bench} >>"$LOG" 2>&1 || { step build failed; tail -40 "$LOG"; exit 1; }
step built
wait $model || { step model failed; cat /tmp/gm.log; exit 1; }
cat /tmp/gm.log | tee -a "$LOG"
export LLAMA_CPP_LIB_PATH=/tmp/lcb/bin MTMD_CPP_LIB=/tmp/lcb/bin LD_LIBRARY_PATH=/tmp/lcb/bin:$LD_LIBRARY_PATH
step probe
# in the background, so that a hang can be looked into: after 80 s, cuda-gdb attaches for the
# native stacks of every thread, then SIGABRT makes faulthandler print the Python ones
timeout 150 python3 bench/gpu_probe.py /tmp/gm.gguf -1 > /tmp/probe.txt 2>&1 &
probe=$!
for i in $(seq 80); do kill -0 $probe 2>/dev/null || break; sleep 1; done
if kill -0 $probe 2>/dev/null; then
  step "probe still running after 80 s: native stacks"
  pid=$(pgrep -f "gpu_probe.py /tmp/gm.gguf" | head -1)
  timeout 60 cuda-gdb -q -batch -p "$pid" -ex "set pagination off" -ex "thread apply all bt 25" 2>&1 | grep -v "^\[New LWP" | tail -120 | tee -a "$LOG"
  kill -ABRT "$pid"; sleep 2
fi
wait $probe; rc=$?
echo "probe rc=$rc" | tee -a "$LOG"
grep -v " DEBUG \|llama_model_loader: - \|print_info" /tmp/probe.txt | tail -60 | tee -a "$LOG"
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 134 ]; then
  step "probe crashed: again under cuda-gdb for the native stack"
  timeout 100 cuda-gdb -q -batch -ex "set pagination off" -ex run -ex "bt 40" -ex "info threads" \
    --args python3 bench/gpu_probe.py /tmp/gm.gguf -1 2>&1 | grep -v "^\[New \|^\[Thread .* exited\]" | tail -80 | tee -a "$LOG"
fi
if [ -n "$GPU_BENCH" ]; then
  step llama-bench
  timeout 120 /tmp/lcb/bin/llama-bench -m /tmp/gm.gguf -ngl 0,8,99 -fa 0 -p 512 -n 128 -r 2 2>&1 | tee -a "$LOG" | tail -10
fi
step gpu_check
timeout 200 python3 bench/gpu_check.py --model /tmp/gm.gguf 2>&1 | tee -a "$LOG" | tail -30
step done
