// Daemon logging: journald when systemd runs us, a file or stderr otherwise. Private to daemon/.
#pragma once

#include "custos/core/result.hpp"
#include "custos/daemon/config.hpp"

namespace custos::daemon {

// True when $JOURNAL_STREAM or $INVOCATION_ID say systemd started this process.
[[nodiscard]] bool under_systemd() noexcept;

// Installs the default spdlog logger for `config` (target, level). Errors: daemon.config_invalid
// for an unknown level, sys.error when the log file cannot be opened.
[[nodiscard]] Result<void> setup_logging(DaemonConfig const& config);

// SIGHUP: reopens the log file (after logrotate moved it); other targets need nothing.
[[nodiscard]] Result<void> reopen_logs(DaemonConfig const& config);

}  // namespace custos::daemon
