// The I/O pumps of one execution: what its streams produced (accounting, the spool files, the
// output events, the output limits) and what its stdin queue holds. The bytes come from, and go
// to, the backend (BackendExecution); this type decides what is kept, counted and said.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "custos/core/accounting.hpp"
#include "custos/core/result.hpp"
#include "custos/supervisor/types.hpp"
#include "custos/sys/unique_fd.hpp"

namespace custos::supervisor {

class Supervisor;

class OutputPumps {
 public:
  explicit OutputPumps(Supervisor& owner) : owner_(&owner) {}

  // The streams of this execution's io mode, each open until its end is seen.
  void open_streams(bool pty);
  // An adopted execution's streams (supervisor/adopt.cpp): its output could not be kept across
  // the restart, so each starts from what was recorded (`out`: stdout or the PTY stream), is
  // marked incomplete, and has already ended here.
  void adopt_streams(bool pty, core::StreamAccounting out, core::StreamAccounting err);
  // A handover: where every stream and the input stood (carry), and the next image going on
  // from there (resume): accounting, limits, spools at their recorded size, the input queue.
  void carry(Carried& out) const;
  void resume(bool pty, Carried& in);
  // A chunk of `stream`: counted, spooled within output.spool_bytes, sent as an output event
  // within limits.output_bytes and output.max_events; a limit reached is reported once per
  // stream (and cancels when the plan says so).
  void on_chunk(core::Stream stream, std::span<std::uint8_t const> bytes);
  void on_end(core::Stream stream, bool complete);
  // A stream closed at its bound while something outside the tree still held its write end:
  // its output is incomplete.
  void mark_forced(core::Stream stream);
  [[nodiscard]] bool all_ended() const noexcept;
  [[nodiscard]] core::OutputAccounting accounting() const;
  [[nodiscard]] std::uint64_t observed_total() const noexcept;
  [[nodiscard]] Result<OutputSlice> slice(core::Stream stream, std::uint64_t offset,
                                          std::uint64_t max_bytes, bool spawn_failed) const;

  // stdin: queued within the manager's bound and limits.stdin_bytes; eof closes the input once
  // the queue drained.
  [[nodiscard]] Result<std::uint64_t> input(std::span<std::uint8_t const> data, bool eof);
  // The backend can take more (or the queue just grew): write what it takes.
  void drain_input();
  // The input is over: `reason` goes in the input_closed event.
  void close_input(std::string_view reason);
  [[nodiscard]] bool input_open() const noexcept { return !writer_.closed; }

 private:
  struct StreamState {
    core::Stream stream = core::Stream::stdout_stream;
    bool ended = false;
    bool limit_reported = false;
    core::StreamAccounting acc;
    sys::UniqueFd spool;
    std::uint64_t spool_size = 0;
    bool spool_lost = false;  // a handed-over spool could not be reopened: retain no more
  };
  struct Writer {
    std::deque<std::vector<std::uint8_t>> queue;
    std::size_t front_offset = 0;
    std::size_t queued = 0;
    std::uint64_t accepted = 0;
    bool eof_requested = false;
    bool closed = false;
  };
  [[nodiscard]] StreamState* find(core::Stream s) noexcept;
  [[nodiscard]] StreamState const* find(core::Stream s) const noexcept;
  [[nodiscard]] std::filesystem::path spool_path(core::Stream s) const;
  void end(StreamState& s);

  Supervisor* owner_;
  std::vector<StreamState> streams_;
  Writer writer_;
  std::uint64_t total_allowed_ = 0;  // output bytes within limits.output_bytes
  std::uint64_t output_events_ = 0;
  bool max_events_reported_ = false;
};

}  // namespace custos::supervisor
