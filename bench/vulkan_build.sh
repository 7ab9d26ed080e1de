#!/bin/bash
# A GPU backend on a machine without a GPU (issue 27): the pinned llama.cpp (llama-cpp-python's
# sdist, vendor/llama.cpp) built with GGML's Vulkan backend, which runs on Mesa's lavapipe (a
# Vulkan driver on the CPU), so GPU offload runs end to end here and in CI. From the repository
# root, as root on Debian bookworm (apt), with the project's venv:
#
#   bash bench/vulkan_build.sh [BUILD_DIR]        # default ~/.cache/pollama-bench/vulkan-<version>
#
# then point pollama (both engines) and tests/test_gpu_offload.py at it:
#
#   export LLAMA_CPP_LIB_PATH=BUILD_DIR/bin MTMD_CPP_LIB=BUILD_DIR/bin GGML_VK_VISIBLE_DEVICES=0
#   export POLLAMA_TEST_GPU_LIB=BUILD_DIR/bin      # the test's served offload runs on it
#
# GGML_VK_VISIBLE_DEVICES=0: GGML's Vulkan backend leaves out devices of type CPU (lavapipe) unless
# they are named. The build is libllama, libggml*, libmtmd and llama-bench: 326 steps, about 10
# minutes on 2 loaded cores (JOBS=2, nice 19); most of it is compiling the Vulkan shaders.
#
# bookworm's Vulkan headers (1.3.239) predate VK_EXT_layer_settings (1.3.261), which this llama.cpp
# names when it creates its Vulkan instance; where the headers are older, a wrapper vulkan.hpp put
# first on the include path declares those three types (the spec's layout) after the real header.
set -euo pipefail
PY=${PY:-.venv/bin/python}
JOBS=${JOBS:-2}
V=$($PY -c 'import llama_cpp; print(llama_cpp.__version__)')
CACHE=${POLLAMA_BENCH_CACHE:-$HOME/.cache/pollama-bench}
SRC=$CACHE/llama_cpp_python-$V/vendor/llama.cpp
BUILD=${1:-$CACHE/vulkan-$V}

if ! command -v glslc >/dev/null || [ ! -e /usr/include/vulkan/vulkan.hpp ] || [ ! -d /usr/share/cmake/SPIRV-Headers ]; then
  apt-get install -y mesa-vulkan-drivers libvulkan-dev glslc spirv-headers vulkan-tools cmake ninja-build g++
fi
if [ ! -d "$SRC/ggml/src/ggml-vulkan" ]; then  # the sdist, found or downloaded as bench_decode.py does
  $PY - "$V" <<'EOF'
import sys, tarfile
sys.path.insert(0, "bench")
from bench_decode import CACHE, find_sdist
CACHE.mkdir(parents=True, exist_ok=True)
with tarfile.open(find_sdist(sys.argv[1])) as tar:
    tar.extractall(CACHE, filter="data")
EOF
fi

include=()
header=$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\)$/\1/p' /usr/include/vulkan/vulkan_core.h)
if [ "$header" -lt 261 ]; then
  mkdir -p "$BUILD/compat/vulkan"
  cat > "$BUILD/compat/vulkan/vulkan.hpp" <<'EOF'
// bench/vulkan_build.sh: the system's vulkan.hpp, and on headers older than 1.3.261 the
// VK_EXT_layer_settings types ggml-vulkan.cpp names (used only with GGML_VULKAN_VALIDATE).
#pragma once
#include_next <vulkan/vulkan.hpp>
#if VK_HEADER_VERSION < 261
#include <cstdint>
#include <vector>
namespace vk {
enum class LayerSettingTypeEXT : int32_t {
  eBool32 = 0, eInt32 = 1, eInt64 = 2, eUint32 = 3, eUint64 = 4, eFloat32 = 5, eFloat64 = 6, eString = 7
};
struct LayerSettingEXT {  // VkLayerSettingEXT
  const char* pLayerName;
  const char* pSettingName;
  LayerSettingTypeEXT type;
  uint32_t valueCount;
  const void* pValues;
};
struct LayerSettingsCreateInfoEXT {  // VkLayerSettingsCreateInfoEXT
  VkStructureType sType = static_cast<VkStructureType>(1000496000);  // ..._LAYER_SETTINGS_CREATE_INFO_EXT
  const void* pNext = nullptr;
  uint32_t settingCount = 0;
  const LayerSettingEXT* pSettings = nullptr;
  explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT>& settings)
      : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
};
}  // namespace vk
#endif
EOF
  include=(-DVulkan_INCLUDE_DIR="$BUILD/compat")
  echo "Vulkan headers $header < 261: building with the wrapper in $BUILD/compat"
fi

start=$(date +%s)
nice -n 19 cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_VULKAN=ON "${include[@]}" \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON >/dev/null
nice -n 19 cmake --build "$BUILD" -j "$JOBS" --target llama mtmd llama-bench
echo "built in $(( $(date +%s) - start )) s: $BUILD/bin"
GGML_VK_VISIBLE_DEVICES=0 timeout 120 "$BUILD/bin/llama-bench" --list-devices
