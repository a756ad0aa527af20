#include "server/port_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace retrybudget {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat("port file: ", what, " ", path, ": ",
                                          std::strerror(errno)));
}

}  // namespace

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", tmp);
  const std::string text = absl::StrCat(port, "\n");
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const bool synced = written && fsync(fd) == 0;
  const absl::Status write_error = synced ? absl::OkStatus() : ErrnoError("cannot write", tmp);
  close(fd);
  if (!write_error.ok()) {
    unlink(tmp.c_str());
    return write_error;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const absl::Status s = ErrnoError("cannot rename to", path);
    unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

}  // namespace retrybudget
