// Exit codes of the custos binary (docs/cli.md is the reference). Private to cli/.
#pragma once

namespace custos::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitDaemonFailed = 1;  // `custos daemon` could not start
// 1..255 from `custos run`/`wait`: the child's own exit code; 128+N when killed by signal N.
inline constexpr int kExitUsage = 64;         // EX_USAGE: bad flags or arguments
inline constexpr int kExitRefused = 65;       // EX_DATAERR: the daemon refused the request
inline constexpr int kExitUnavailable = 69;   // EX_UNAVAILABLE: a subcommand of a later issue
inline constexpr int kExitInternal = 70;      // EX_SOFTWARE: protocol or internal error
inline constexpr int kExitUnreachable = 75;   // EX_TEMPFAIL: no daemon answers on the socket
inline constexpr int kExitTimedOut = 124;     // the execution hit its deadline (`run --timeout`)
inline constexpr int kExitCancelled = 125;    // the execution was cancelled (Ctrl-C, custos cancel)
inline constexpr int kExitAbnormal = 126;     // output/resource limit, sandbox, supervisor failure,
                                              // indeterminate recovery: no trustworthy exit code
inline constexpr int kExitSpawnFailed = 127;  // the executable could not be started

}  // namespace custos::cli
