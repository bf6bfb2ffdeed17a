"""Builds sdpa's compiled extension (sdpa._sdpa) with the project's CMake for pip / setuptools.

The configuration is the project's own (Release, the Python that runs this script); only the
target sdpa_python is built, in build-python/ (kept between installs, so a second install is
incremental). SDPA_CMAKE_ARGS adds options, e.g. SDPA_CMAKE_ARGS="-G Ninja".
"""
import os
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = ROOT / "build-python"
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        jobs = os.environ.get("SDPA_JOBS", str(os.cpu_count() or 1))
        configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython_EXECUTABLE={sys.executable}", "-DSDPA_BUILD_TESTS=OFF",
                     "-DSDPA_BUILD_BENCH=OFF"] + shlex.split(os.environ.get("SDPA_CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "sdpa_python", "-j", jobs],
                       check=True)
        built = next((build / "python" / "sdpa").glob("_sdpa*.so"))
        target.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file(str(built), str(target))


# setuptools' own staging goes to build-python/ too: build/ is the usual CMake build folder.
setup(ext_modules=[Extension("sdpa._sdpa", sources=[])], cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": "build-python/setuptools"}})
