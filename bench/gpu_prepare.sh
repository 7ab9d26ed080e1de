#!/bin/bash
# Prepare .gpu/ (ignored by git) for bench/gpu_device.sh on a lent CUDA machine with no internet;
# run here, from the repository root, with the project's venv and the pinned sdist unpacked by
# bench_decode.py (~/.cache/pollama-bench/llama_cpp_python-0.3.36). Then run the device with
# carry [".gpu"] and the command `bash bench/gpu_device.sh`.
set -e
V=0.3.36
SRC=~/.cache/pollama-bench/llama_cpp_python-$V/vendor/llama.cpp
PY=.venv/bin/python
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/.gpu/" >> .git/info/exclude; }
rm -rf .gpu && mkdir -p .gpu/whl .gpu/site .gpu/ext
(cd "$SRC" && tar cJf "$OLDPWD/.gpu/llama.cpp.tar.xz" --exclude=tools/ui --exclude=tools/server \
  --exclude=ggml/src/ggml-et --exclude=ggml/src/ggml-metal --exclude=ggml/src/ggml-hexagon \
  --exclude=ggml/src/ggml-sycl --exclude=ggml/src/ggml-vulkan --exclude=ggml/src/ggml-opencl \
  --exclude=ggml/src/ggml-cann --exclude='*.gguf' CMakeLists.txt cmake ggml src include common tools vendor licenses LICENSE)
pins=""
for p in prompt_toolkit wcwidth gguf fastapi starlette pydantic pydantic_core annotated-types typing-inspection \
         uvicorn opentelemetry-api typing_extensions anyio annotated-doc diskcache; do
  pins="$pins $p==$($PY -m pip show "$p" | sed -n 's/^Version: //p')"
done
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl $pins
cp -r "$($PY -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))')" .gpu/site/llama_cpp
rm -rf .gpu/site/llama_cpp/lib .gpu/site/llama_cpp/__pycache__
# a Python 3.12 that runs (a pyenv shim for a version not selected is found but fails)
P312=""
for c in python3.12 ~/.pyenv/versions/3.12*/bin/python3.12; do
  if "$c" -c pass 2>/dev/null; then P312=$c; break; fi
done
[ -n "$P312" ] || { echo "gpu_prepare.sh: no Python 3.12 here to build best.c for the device" >&2; exit 1; }
gcc -O3 -shared -fPIC -I"$($P312 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
  runner/sample/best.c -o .gpu/ext/_best.cpython-312-x86_64-linux-gnu.so
cp ../shared/models/stories260K.gguf .gpu/
du -sh .gpu
