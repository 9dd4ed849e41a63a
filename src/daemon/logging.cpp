// spdlog set-up. The journald sink writes through sd_journal_send (structured PRIORITY), so
// `journalctl -u custos -p warning` works; elsewhere plain text goes to stderr or a file.
#include "logging.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <exception>

namespace custos::daemon {

bool under_systemd() noexcept {
  return std::getenv("JOURNAL_STREAM") != nullptr || std::getenv("INVOCATION_ID") != nullptr;
}

namespace {

Result<spdlog::level::level_enum> parse_level(std::string const& name) {
  auto const level = spdlog::level::from_str(name);
  // from_str maps unknown names to "off"; only accept "off" when it was asked for.
  if (level == spdlog::level::off && name != "off") {
    return Error{Errc::daemon_config_invalid,
                 "log-level must be trace, debug, info, warning, error, critical or off"};
  }
  return level;
}

}  // namespace

Result<void> setup_logging(DaemonConfig const& config) {
  auto level = CUSTOS_TRY(parse_level(config.log_level));
  LogTarget target = config.log_target;
  if (target == LogTarget::automatic) {
    target = !config.log_file.empty() ? LogTarget::file
             : under_systemd()        ? LogTarget::journal
                                      : LogTarget::console;
  }
  std::shared_ptr<spdlog::logger> logger;
  try {
    switch (target) {
      case LogTarget::journal: {
        // The journal adds its own timestamp and identifier; the message stays bare.
        auto sink = std::make_shared<spdlog::sinks::systemd_sink_mt>("custos");
        logger = std::make_shared<spdlog::logger>("custos", sink);
        logger->set_pattern("%v");
        break;
      }
      case LogTarget::file: {
        auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(config.log_file.string());
        logger = std::make_shared<spdlog::logger>("custos", sink);
        logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %l %v");
        break;
      }
      case LogTarget::console:
      case LogTarget::automatic: {
        auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
        logger = std::make_shared<spdlog::logger>("custos", sink);
        logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
        break;
      }
    }
  } catch (std::exception const& e) {
    return Error{Errc::sys_error, std::string{"opening the log: "} + e.what()};
  }
  logger->set_level(level);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
  return ok();
}

Result<void> reopen_logs(DaemonConfig const& config) {
  bool const file = config.log_target == LogTarget::file ||
                    (config.log_target == LogTarget::automatic && !config.log_file.empty());
  if (!file) return ok();
  return setup_logging(config);
}

}  // namespace custos::daemon
