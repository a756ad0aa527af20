// The port file: how a process that started the server on port 0 (a test, the fleet tool, a
// script) learns the port. The server writes it once it is serving.
#ifndef RETRYBUDGET_SERVER_PORT_FILE_H_
#define RETRYBUDGET_SERVER_PORT_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace retrybudget {

// Writes `port` as decimal digits and a newline to `path`, atomically: to a temporary file in the
// same directory, fsync'd, then renamed over `path`. A reader therefore sees either no file (or
// an older one) or the complete number, never a partial write. INTERNAL naming the path and the
// system error on failure (the temporary file is removed).
absl::Status WritePortFile(const std::string& path, int port);

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_PORT_FILE_H_
