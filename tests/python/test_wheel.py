"""The install path of client/python/README.md, as a new user follows it outside the repository:
`pip wheel --no-build-isolation --no-deps` builds a wheel carrying the generated modules and
py.typed without writing into the source tree; installed into a fresh virtualenv (with Debian's
grpcio / protobuf as system site-packages, no registry), the README's first example runs against
the real server with nothing on PYTHONPATH, and gets its retried success."""

import os
import re
import subprocess
import sys
import zipfile

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
PACKAGE = os.path.join(REPO, "client", "python")
README = os.path.join(PACKAGE, "README.md")
README_TARGET = "127.0.0.1:50051"


def tree(directory: str):
    """Every path under `directory` (files and directories), but the bytecode caches another
    test's interpreter may write."""
    found = set()
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(root, name), directory))
    return found


def outside_env():
    """The environment a user outside the repository has: nothing pointing into it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RETRYBUDGET_PROTO_DIR", "PYTHONHOME")
           and REPO not in v}
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    return env


def run(argv, cwd, **kwargs):
    out = subprocess.run(argv, cwd=cwd, env=outside_env(), capture_output=True, text=True,
                         timeout=240, **kwargs)
    assert out.returncode == 0, f"{argv} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out


def readme_blocks(language: str):
    with open(README) as f:
        return re.findall(r"```" + language + r"\n(.*?)```", f.read(), re.S)


def test_the_readme_wheel_installs_outside_the_repository_and_its_example_runs(start_server,
                                                                               tmp_path):
    work = os.path.realpath(str(tmp_path))
    assert not work.startswith(REPO + os.sep)
    before = tree(PACKAGE)

    # The README's recipe, step by step (its sh block names these exact commands).
    recipe = readme_blocks("sh")[0]
    assert "pip wheel --no-build-isolation --no-deps" in recipe
    assert "venv --system-site-packages" in recipe
    dist = os.path.join(work, "dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", dist,
         PACKAGE], cwd=work)

    assert tree(PACKAGE) == before, "the build wrote into client/python"
    assert not os.path.exists(os.path.join(PACKAGE, "build"))
    assert not any(p.endswith(".egg-info") for p in os.listdir(PACKAGE))

    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(os.path.join(dist, wheels[0])) as wheel:
        names = set(wheel.namelist())
    for needed in ("retrybudget/__init__.py", "retrybudget/py.typed",
                   "retrybudget/v1/__init__.py", "retrybudget/v1/budget_pb2.py",
                   "retrybudget/v1/budget_pb2.pyi", "retrybudget/v1/budget_pb2_grpc.py"):
        assert needed in names, f"{needed} missing from {sorted(names)}"

    venv = os.path.join(work, "venv")
    run([sys.executable, "-m", "venv", "--system-site-packages", venv], cwd=work)
    python = os.path.join(venv, "bin", "python")
    run([python, "-m", "pip", "install", "--no-index", os.path.join(dist, wheels[0])], cwd=work)
    where = run([python, "-c", "import retrybudget, retrybudget.v1.budget_pb2 as m, os; "
                 "print(retrybudget.__file__); print(m.__file__); "
                 "print(os.path.exists(os.path.join(os.path.dirname(retrybudget.__file__), "
                 "'py.typed')))"], cwd=work).stdout.split()
    assert all(p.startswith(venv + os.sep) for p in where[:2]), where
    assert where[2] == "True"

    # The README's first example, against the real server (the default policy's tenant).
    server = start_server()
    example = readme_blocks("python")[0]
    assert README_TARGET in example
    script = os.path.join(work, "example.py")
    with open(script, "w") as f:
        f.write(example.replace(README_TARGET, server.target))
    out = run([python, script], cwd=work).stdout
    # The first attempt fails, the retry is granted though the client was created just before.
    assert "result: row retries: 1" in out, out
    assert "not retried" not in out
