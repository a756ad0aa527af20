"""The generated protobuf / gRPC modules of proto/retrybudget/v1/budget.proto. They live in the
subpackage retrybudget.v1, generated at build time (CMake target retrybudget_python_stubs, or
`pip install`), never committed."""

try:
    from retrybudget.v1 import budget_pb2, budget_pb2_grpc  # noqa: F401
except ImportError as error:  # pragma: no cover - a build step was skipped
    raise ImportError(
        "retrybudget: the generated modules retrybudget/v1/budget_pb2.py and budget_pb2_grpc.py "
        "are missing. Build them (cmake --build build --target retrybudget_python_stubs, then "
        "put build/client/python/gen on PYTHONPATH) or install the package with "
        "`pip install ./client/python`.") from error

__all__ = ["budget_pb2", "budget_pb2_grpc"]
