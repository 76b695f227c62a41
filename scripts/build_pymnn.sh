#!/usr/bin/env bash
# Build the part of pymnn that pocket_agent uses (MNN.expr, MNN.llm) from MNN's sources with
# MNN's AVX-512 kernels compiled in.
#
# The MNN wheel on PyPI (3.6.1) carries no AVX-512 code; on CPUs that have AVX-512 (AMD Zen 4,
# Intel Skylake-SP and later) a build with it evaluates prompts about 1.7x as fast
# (bench/extract.md, bench/mnn_options.md). MNN picks its kernels by the CPU at run time, so
# the build also runs on CPUs without AVX-512.
#
#   usage: bash scripts/build_pymnn.sh [MNN_SOURCE_DIR] [OUT_DIR]
#     MNN_SOURCE_DIR  an MNN 3.6.x source tree; without it, tag 3.6.1 is cloned from GitHub
#     OUT_DIR         where the package goes (default ~/.cache/pocket_agent/pymnn-avx512)
#   then: PYTHONPATH=OUT_DIR python ...   (OUT_DIR/MNN shadows the wheel's MNN package)
#
# Needs cmake, a C++17 compiler and the project's .venv (for Python's and numpy's headers).
# About 6 minutes on 2 cores (AMD EPYC). MNN_BUILD_DIR overrides the CMake build folder (OUT_DIR/build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="${2:-${POCKET_AGENT_CACHE:-$HOME/.cache/pocket_agent}/pymnn-avx512}"
SRC="${1:-}"
if [ -z "$SRC" ]; then
  SRC="$OUT/src"
  [ -d "$SRC/.git" ] || git clone --depth 1 --branch 3.6.1 https://github.com/alibaba/MNN "$SRC"
fi
SRC="$(cd "$SRC" && pwd)"
for need in CMakeLists.txt pymnn/src/MNN.cc pymnn/pip_package/MNN/llm/__init__.py; do
  [ -e "$SRC/$need" ] || { echo "build_pymnn: $SRC is not an MNN source tree (no $need)" >&2; exit 2; }
done
BUILD="${MNN_BUILD_DIR:-$OUT/build}"
mkdir -p "$OUT" "$BUILD"
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DMNN_AVX512=ON -DMNN_BUILD_LLM=ON -DMNN_LOW_MEMORY=ON -DMNN_SUPPORT_TRANSFORMER_FUSE=ON \
  -DMNN_BUILD_SHARED_LIBS=ON -DMNN_SEP_BUILD=OFF -DMNN_BUILD_CONVERTER=OFF -DMNN_KLEIDIAI=OFF >"$BUILD/cmake.log"
cmake --build "$BUILD" --target MNN -j "$(nproc)"

# The extension: pymnn's single source with only the expression and LLM APIs (the wheel
# also compiles training, OpenCV and audio APIs, which need MNN's converter and more).
PYINC="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
NPINC="$("$PY" -c 'import numpy; print(numpy.get_include())')"
EXT="$("$PY" -c 'import sysconfig; print("_mnncengine" + sysconfig.get_config_var("EXT_SUFFIX"))')"
cp "$BUILD/libMNN.so" "$OUT/libMNN.so"
"${CXX:-g++}" -O2 -shared -fPIC -std=c++17 -DPYMNN_EXPR_API -DPYMNN_LLM_API -DPYMNN_NUMPY_USABLE -DBUILD_OPTYPE \
  -I"$PYINC" -I"$NPINC" -I"$SRC/include" -I"$SRC/express" -I"$SRC/source" -I"$SRC/tools" \
  -I"$SRC/transformers/llm/engine/include" -I"$SRC/pymnn/src" -I"$SRC/3rd_party/flatbuffers/include" \
  -I"$SRC/schema/current" "$SRC/pymnn/src/MNN.cc" -o "$OUT/$EXT" -L"$OUT" -lMNN -Wl,-rpath,'$ORIGIN'

# The Python package: MNN.expr and MNN.llm as the wheel ships them, nothing else.
rm -rf "$OUT/MNN"
mkdir -p "$OUT/MNN"
cp -r "$SRC/pymnn/pip_package/MNN/expr" "$SRC/pymnn/pip_package/MNN/llm" "$OUT/MNN/"
VERSION="$(sed -n 's/^#define MNN_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$SRC/include/MNN/MNNDefine.h" | paste -sd.)"
cat >"$OUT/MNN/__init__.py" <<PYEOF
# pymnn built by pocket_agent's scripts/build_pymnn.sh: MNN.expr and MNN.llm only, AVX-512 kernels in.
from _mnncengine import *  # noqa: F403

from . import expr, llm  # noqa: F401

POCKET_AGENT_BUILD = "MNN $VERSION built by scripts/build_pymnn.sh (AVX-512 kernels)"
PYEOF
PYTHONPATH="$OUT" "$PY" -c 'import MNN, MNN.llm; assert MNN.__file__.startswith("'"$OUT"'"), MNN.__file__' 2>/dev/null
echo "built $OUT; use it with: PYTHONPATH=$OUT"
