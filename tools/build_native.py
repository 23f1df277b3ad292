"""Builds the engine's JAX FFI libraries (`jax_backend/ffi_libraries.py`: the layout copy,
torch's convolution kernels and the fused optimizer update, `jax_backend/native/<name>.cc`)
for the jaxlib and torch of the Python that runs this script: `make native` runs it with each
venv's.

A library's ABI is the FFI headers of the jaxlib it is compiled against (and, for the one that
links torch, torch's C++ headers and libraries), so each gets its own file,
`jax_backend/native/_<name>-jaxlib<version>[-torch<version>].so`, the one
`FfiLibrary.path()` names. A library newer than its source is kept. Without a C++ compiler
(`$CXX`, else `c++`), or where a build fails, it says so and exits 0: the settings that use
them then fall back (`cpu_half_dots` and `cpu_convolutions` "native" run as "torch").

    python tools/build_native.py [--force]
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jax_backend.ffi_libraries import LIBRARIES, FfiLibrary


def _torch_flags() -> list:
    """Compile and link flags for a library that calls torch's C++ API: its headers, its C++
    ABI, and its libraries (found at run time where torch's own are, by the rpath)."""
    import torch

    root = os.path.dirname(torch.__file__)
    lib = os.path.join(root, "lib")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        "-std=c++20",  # torch 2.14's headers need it (a later -std wins)
        "-isystem",
        os.path.join(root, "include"),
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-L{lib}",
        "-ltorch_cpu",
        "-lc10",
        f"-Wl,-rpath,{lib}",
    ]


def build(library: FfiLibrary, compiler: str, force: bool) -> None:
    import jax.ffi

    out = library.path()
    # its source and the headers beside it (any library may include them)
    inputs = [library.source] + glob.glob(os.path.join(os.path.dirname(library.source), "*.h"))
    if (
        not force
        and os.path.exists(out)
        and os.path.getmtime(out) >= max(os.path.getmtime(path) for path in inputs)
    ):
        return
    # -isystem: warnings in jaxlib's and torch's headers are theirs; ours are errors.
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
        library.source,
    ]
    command += list(library.flags)
    if library.links_torch:
        command += _torch_flags()
    print(" ".join(command))
    if subprocess.run(command).returncode != 0:
        # The set-up goes on: the settings that use the library fall back, and the tests that
        # ask for it (test_layout_copy, test_torch_kernels) fail, naming it.
        print(f"== building {os.path.basename(out)} failed (above): {library.name} is unavailable")
        return
    os.replace(out + ".tmp", out)  # never a half-written library under the loaded name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="build even if up to date")
    args = parser.parse_args(argv)
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        print(
            f"== no C++ compiler ({compiler}): the engine's FFI libraries are unavailable; "
            "cpu_half_dots and cpu_convolutions 'native' run as 'torch'"
        )
        return 0
    for library in LIBRARIES:
        build(library, compiler, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
