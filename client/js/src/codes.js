// google.rpc.Code values (the same numbering as grpc-js's status enum), without importing
// grpc-js into the protocol code.

export const Status = Object.freeze({
  OK: 0, CANCELLED: 1, UNKNOWN: 2, INVALID_ARGUMENT: 3, DEADLINE_EXCEEDED: 4, NOT_FOUND: 5,
  ALREADY_EXISTS: 6, PERMISSION_DENIED: 7, RESOURCE_EXHAUSTED: 8, FAILED_PRECONDITION: 9,
  ABORTED: 10, OUT_OF_RANGE: 11, UNIMPLEMENTED: 12, INTERNAL: 13, UNAVAILABLE: 14, DATA_LOSS: 15,
  UNAUTHENTICATED: 16,
});

const NAMES = Object.fromEntries(Object.entries(Status).map(([k, v]) => [v, k]));

export function codeName(code) {
  return NAMES[code] ?? `CODE_${code}`;
}
