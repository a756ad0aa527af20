"""Builds the package with its protobuf / gRPC modules generated from the repository's
proto/retrybudget/v1/budget.proto by `protoc` and `grpc_python_plugin` (Debian:
protobuf-compiler, protobuf-compiler-grpc) into the build directory, never into the source.

Nothing is written into this directory: setuptools' build tree and egg-info go to a temporary
directory of their own, removed when the build ends. So `pip wheel --no-build-isolation
--no-deps ./client/python` (or `pip install`) leaves the checkout as it was.

The .proto is looked for in $RETRYBUDGET_PROTO_DIR, then ../../proto (this directory inside the
repository). Tools: $PROTOC or `protoc`, $GRPC_PYTHON_PLUGIN or `grpc_python_plugin`."""

import atexit
import os
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join("retrybudget", "v1", "budget.proto")


def proto_dir() -> str:
    for candidate in (os.environ.get("RETRYBUDGET_PROTO_DIR", ""),
                      os.path.join(HERE, "..", "..", "proto")):
        if candidate and os.path.isfile(os.path.join(candidate, PROTO)):
            return os.path.abspath(candidate)
    raise SystemExit(f"retrybudget: {PROTO} not found; set RETRYBUDGET_PROTO_DIR to the "
                     "repository's proto/ directory")


def tool(env: str, name: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise SystemExit(f"retrybudget: {name} not found (Debian: protobuf-compiler, "
                         f"protobuf-compiler-grpc); or set ${env}")
    return path


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        out = os.path.abspath(self.build_lib)
        src = proto_dir()
        subprocess.run([tool("PROTOC", "protoc"), f"--proto_path={src}", f"--python_out={out}",
                        f"--pyi_out={out}", f"--grpc_out={out}",
                        f"--plugin=protoc-gen-grpc={tool('GRPC_PYTHON_PLUGIN', 'grpc_python_plugin')}",
                        os.path.join(src, PROTO)], check=True)
        # retrybudget.v1 is a regular package once installed.
        open(os.path.join(out, "retrybudget", "v1", "__init__.py"), "a").close()


# setuptools' scratch space (build/, retrybudget.egg-info) outside the source directory.
_scratch = tempfile.mkdtemp(prefix="retrybudget-build-")
atexit.register(shutil.rmtree, _scratch, True)

setup(cmdclass={"build_py": BuildPyWithStubs},
      options={"build": {"build_base": os.path.join(_scratch, "build")},
               "egg_info": {"egg_base": _scratch}})
