"""runner/native.py: the C++ runtime enters the process's global symbol scope before any library
of llama.cpp's, so that the C++ symbols those libraries share bind to libstdc++.

A CUDA build's libggml-cuda.so (nvcc's) and libllama.so carried their own copies of libstdc++'s
templates and did not link libstdc++; loaded with RTLD_GLOBAL by a Python process, libllama bound
``std::ostream::_M_insert<long>`` to libggml-cuda's copy and died in ``llama_model::print_info``
at every offloaded load (bench/gpu_device.sh on an H200: a segmentation fault before; with
runner/native.py, `num_gpu` -1, 0 and 10 answered). Here a library built the same way (its own
copy of the C++ runtime, no libstdc++ needed) stands in for libggml-cuda.so: loaded first, it
owns the symbol; after ``import runner``, libstdc++ does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYMBOL = "_ZNSo9_M_insertIlEERSoT_"  # std::ostream::_M_insert<long>, the one print_info died in

SOURCE = """
#include <sstream>
extern "C" int digits(long v) { std::ostringstream os; os << v; return (int)os.str().size(); }
"""

PROBE = """
import ctypes, sys
sys.path.insert(0, sys.argv[2])
if sys.argv[3] == "runner first":
    import runner
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
assert lib.digits(ctypes.c_long(-1234)) == 5


class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]


scope = ctypes.CDLL(None)  # the global scope, in load order
address = ctypes.cast(getattr(scope, sys.argv[4]), ctypes.c_void_p)
info = DlInfo()
assert scope.dladdr(address, ctypes.byref(info))
print(info.fname.decode())
"""


@pytest.fixture(scope="module")
def own_runtime(tmp_path_factory) -> Path:
    """A shared library with its own copy of the C++ runtime (``-static-libstdc++``), as nvcc's
    libggml-cuda.so has."""
    where = tmp_path_factory.mktemp("native")
    (where / "own.cpp").write_text(SOURCE)
    lib = where / "libown.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-static-libstdc++", str(where / "own.cpp"), "-o", str(lib)],
                   check=True, capture_output=True, timeout=120)
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    exported = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    assert "libstdc++" not in needed and SYMBOL in exported.stdout
    return lib


def _owner(lib: Path, order: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE, str(lib), str(ROOT), order, SYMBOL],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(done.stdout.strip().splitlines()[-1]).name


def test_after_import_runner_the_cxx_symbols_bind_to_libstdcxx(own_runtime):
    assert _owner(own_runtime, "library first") == "libown.so"  # what the CUDA build's libraries met
    assert _owner(own_runtime, "runner first").startswith("libstdc++.so")
