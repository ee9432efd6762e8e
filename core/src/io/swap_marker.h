#pragma once
// The marker file of a swap directory, stale-directory detection, and file
// reservation: the parts of SwapDir that talk to the filesystem.

#include <cstdint>
#include <string>
#include <vector>

namespace megalith::io::detail {

/// First line of every marker: a directory whose marker lacks it is not ours.
constexpr const char* kMarkerMagic = "megalith swap directory v1";

/// Creates <dir>/megalith-swap.lock, takes its flock for the caller's life
/// and writes the magic line, id, pid, host, run name and time. Returns the fd.
int create_marker(const std::string& dir, const std::string& id, const std::string& run_name);

struct StaleDir {
  std::string path;
  std::string host;  // from the marker; empty when there is none
};

/// Directories under `root` named megalith-swap-* whose marker's lock is free
/// (the owner is gone), or that have no marker and are more than a minute old
/// (a crash between mkdir and the marker).
std::vector<StaleDir> find_stale(const std::string& root);

/// Removes the stale directories that this host made (flock is reliable
/// there; another host's are left to SwapDir::clean_stale).
void clean_stale_of_host(const std::string& root);

/// Creates `path` (it must not exist) and reserves `nbytes` on disk
/// (posix_fallocate; a sparse file where the filesystem cannot). On failure
/// the file is removed and disk_full / io_error is thrown.
void reserve_file(const std::string& path, std::uint64_t nbytes);

}  // namespace megalith::io::detail
