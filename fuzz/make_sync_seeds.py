#!/usr/bin/env python3
"""Writes seed inputs for sync_fuzzer into the directory given: realistic Sync sequences
(leases, reports, retries, a stale request, a final one) in the fuzzer's record format."""
import os
import sys


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, wire, payload):
    return varint((num << 3) | wire) + payload


def uint(num, v):
    return field(num, 0, varint(v)) if v else b""


def string(num, s):
    b = s.encode() if isinstance(s, str) else s
    return field(num, 2, varint(len(b)) + b)


def tenant(name, successes=0, spent=0, denied=0, returned=0, received=0, want=0, fallback=0):
    body = (string(1, name) + uint(2, successes) + uint(3, spent) + uint(4, denied) +
            uint(5, returned) + uint(6, received) + uint(7, want) + uint(8, fallback))
    return string(3, body)


def request(instance, seq, tenants, final=False):
    return string(1, instance) + uint(2, seq) + b"".join(tenants) + (uint(4, 1) if final else b"")


def record(step, req):
    return bytes([step, len(req) & 0xFF, len(req) >> 8]) + req


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    a1 = request("a", 1, [tenant("t", want=8)])
    seeds = {
        "lease_and_report": [
            (0, a1),
            (10, request("a", 2, [tenant("t", successes=40, spent=5, received=8, want=8)])),
            (10, request("b", 1, [tenant("t", want=30), tenant("u", want=2)])),
            (50, request("a", 3, [tenant("t", successes=90, spent=8, received=16, want=4)], )),
        ],
        "lost_and_replayed": [
            (0, a1), (0, a1),
            (20, request("a", 2, [tenant("t", received=0, want=8)])),
            (1, request("a", 1, [tenant("t", want=8)])),
        ],
        "baseline_and_final": [
            (0, request("ghost", 40, [tenant("t", successes=1000, spent=10, returned=5, received=20)])),
            (30, request("ghost", 41, [tenant("t", successes=1010, spent=12, returned=8, received=20)],
                         final=True)),
        ],
    }
    for name, records in seeds.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(b"".join(record(s, r) for s, r in records))


if __name__ == "__main__":
    main(sys.argv[1])
