// Claiming the socket path safely. Private to daemon/.
#pragma once

#include <filesystem>

#include "custos/core/result.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::daemon {

// Takes an exclusive lock on `<path>.lock` (created 0600), then makes sure nothing listens on
// `path`: a live socket is never unlinked (rpc.unavailable: "another daemon listens"), a stale
// one (connect refused) is removed, a non-socket is refused. The parent directory is created
// (0755) when missing. The returned lock fd must be held for as long as the socket is served.
[[nodiscard]] Result<sys::UniqueFd> claim_socket_path(std::filesystem::path const& path);

// Exclusive lock of `<state_dir>/custos.lock` (state_dir created 0700 when missing).
// Errors: registry.locked when another daemon holds it.
[[nodiscard]] Result<sys::UniqueFd> lock_state_dir(std::filesystem::path const& state_dir);

}  // namespace custos::daemon
