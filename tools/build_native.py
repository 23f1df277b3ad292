"""Builds the engine's layout copy (jax_backend/native/layout_copy.cc, a JAX FFI custom call)
for the jaxlib of the Python that runs this script: `make native` runs it with each venv's.

The library's ABI is the FFI headers of the jaxlib it is compiled against, so each jaxlib gets
its own file, `jax_backend/native/_layout_copy-jaxlib<version>.so`, the one
`jax_backend.ops.layout_copy.library_path()` loads. A library newer than its source is kept.
Without a C++ compiler (`$CXX`, else `c++`) it says so and exits 0: `cpu_half_dots="native"`
then falls back to torch's kernels.

    python tools/build_native.py [--force]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = os.path.join(ROOT, "jax_backend", "native")
SOURCE = os.path.join(NATIVE, "layout_copy.cc")


def library_path(jaxlib_version: str) -> str:
    return os.path.join(NATIVE, f"_layout_copy-jaxlib{jaxlib_version}.so")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="build even if up to date")
    args = parser.parse_args(argv)

    import jax.ffi
    import jaxlib

    out = library_path(jaxlib.__version__)
    if not args.force and os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(SOURCE):
        return 0
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        print(
            f"== no C++ compiler ({compiler}): the layout copy is unavailable; "
            "cpu_half_dots='native' runs as 'torch'"
        )
        return 0
    # -isystem: warnings in jaxlib's headers are theirs; ours are errors.
    command = [
        compiler,
        "-O3",
        "-std=c++17",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-shared",
        "-fPIC",
        "-isystem",
        jax.ffi.include_dir(),
        "-o",
        out + ".tmp",
        SOURCE,
    ]
    print(" ".join(command))
    subprocess.run(command, check=True)
    os.replace(out + ".tmp", out)  # never a half-written library under the loaded name
    return 0


if __name__ == "__main__":
    sys.exit(main())
