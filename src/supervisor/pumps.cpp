#include "pumps.hpp"

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <limits>
#include <system_error>
#include <unistd.h>

#include "custos/registry/artifacts.hpp"

#include "supervisor.hpp"

namespace custos::supervisor {
namespace {

// exec.output returns at most this much per call.
constexpr std::uint64_t kMaxSliceBytes = 16ULL << 20U;

std::uint64_t sat_sub(std::uint64_t a, std::uint64_t b) {
  return a > b ? a - b : 0;
}
std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
  return a > std::numeric_limits<std::uint64_t>::max() - b
             ? std::numeric_limits<std::uint64_t>::max()
             : a + b;
}

}  // namespace

void OutputPumps::open_streams(bool pty) {
  streams_.clear();
  auto add = [this](core::Stream s) {
    streams_.emplace_back();
    streams_.back().stream = s;
  };
  if (pty) {
    add(core::Stream::pty);
  } else {
    add(core::Stream::stdout_stream);
    add(core::Stream::stderr_stream);
  }
}

void OutputPumps::adopt_streams(bool pty, core::StreamAccounting out, core::StreamAccounting err) {
  open_streams(pty);
  for (auto& st : streams_) {
    core::StreamAccounting const& seed = st.stream == core::Stream::stderr_stream ? err : out;
    auto inc = core::account_mark_incomplete(seed);
    st.acc = inc ? *inc : core::StreamAccounting{seed.observed, seed.retained, seed.dropped, false};
    // The previous daemon's spool survived the restart: what it retained is still served.
    st.spool_size = st.acc.retained;
    end(st);
  }
}

void OutputPumps::carry(Carried& out) const {
  for (auto const& st : streams_) {
    out.streams.push_back(
        Carried::Stream{st.stream, st.ended, st.limit_reported, st.acc, st.spool_size});
  }
  out.output_allowed = total_allowed_;
  out.output_events = output_events_;
  out.max_events_reported = max_events_reported_;
  for (std::size_t i = 0; i < writer_.queue.size(); ++i) {
    auto const& chunk = writer_.queue[i];
    std::size_t const skip = i == 0 ? writer_.front_offset : 0;
    out.input_queued.insert(out.input_queued.end(),
                            chunk.begin() + static_cast<std::ptrdiff_t>(skip), chunk.end());
  }
  out.input_accepted = writer_.accepted;
  out.input_eof_requested = writer_.eof_requested;
  out.input_closed = writer_.closed;
}

void OutputPumps::resume(bool pty, Carried& in) {
  open_streams(pty);
  for (auto& st : streams_) {
    auto const it = std::find_if(in.streams.begin(), in.streams.end(),
                                 [&st](Carried::Stream const& c) { return c.stream == st.stream; });
    if (it == in.streams.end()) {
      // Not carried: nothing of it can be vouched for.
      st.acc.complete = false;
      end(st);
      continue;
    }
    st.acc = it->acc;
    st.limit_reported = it->limit_reported;
    st.spool_size = it->spool_size;
    if (it->ended) {
      end(st);
      continue;
    }
    if (st.spool_size > 0) {
      // The spool goes on at the size the previous image recorded: anything past it (a write
      // that image did not count) is cut, so the file is exactly the accounted prefix.
      sys::UniqueFd fd(::open(spool_path(st.stream).c_str(), O_WRONLY | O_CLOEXEC | O_APPEND));
      if (fd.valid() && ::ftruncate(fd.get(), static_cast<off_t>(st.spool_size)) == 0) {
        st.spool = std::move(fd);
      } else {
        // The spool cannot be continued: the stream is still read and counted, nothing more of
        // it is retained, and it is incomplete.
        st.spool_lost = true;
        if (auto inc = core::account_mark_incomplete(st.acc)) st.acc = *inc;
      }
    }
  }
  total_allowed_ = in.output_allowed;
  output_events_ = in.output_events;
  max_events_reported_ = in.max_events_reported;
  writer_ = Writer{};
  writer_.accepted = in.input_accepted;
  writer_.eof_requested = in.input_eof_requested;
  writer_.closed = in.input_closed;
  if (!in.input_queued.empty() && !writer_.closed) {
    writer_.queued = in.input_queued.size();
    writer_.queue.push_back(std::move(in.input_queued));
  }
}

OutputPumps::StreamState* OutputPumps::find(core::Stream s) noexcept {
  for (auto& st : streams_) {
    if (st.stream == s) return &st;
  }
  return nullptr;
}

OutputPumps::StreamState const* OutputPumps::find(core::Stream s) const noexcept {
  for (auto const& st : streams_) {
    if (st.stream == s) return &st;
  }
  return nullptr;
}

std::filesystem::path OutputPumps::spool_path(core::Stream s) const {
  return registry::spool_path(owner_->config().state_dir, owner_->id_, core::stream_wire(s));
}

void OutputPumps::on_chunk(core::Stream stream, std::span<std::uint8_t const> bytes) {
  StreamState* st = find(stream);
  if (st == nullptr || st->ended) return;
  StreamState& r = *st;
  PlanView const& plan = owner_->plan_;
  std::size_t const n = bytes.size();
  // Budget 1: limits.output_bytes over all streams. Bytes beyond it are neither spooled nor sent
  // in events. Budget 2: output.spool_bytes per stream file.
  std::uint64_t const room_total =
      plan.output_bytes ? sat_sub(*plan.output_bytes, total_allowed_) : n;
  std::uint64_t const allowed = std::min<std::uint64_t>(n, room_total);
  total_allowed_ = sat_add(total_allowed_, allowed);
  std::uint64_t const spool_room = sat_sub(plan.spool_bytes, r.spool_size);
  std::uint64_t keep = std::min(allowed, spool_room);

  // Write what is kept to the spool first; the accounting then says exactly what is there.
  if (keep > 0) {
    if (!r.spool.valid() && !r.spool_lost) {
      std::error_code ec;
      std::filesystem::create_directories(spool_path(r.stream).parent_path(), ec);
      int const fd = ::open(spool_path(r.stream).c_str(),
                            O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0600);
      if (fd >= 0) r.spool.reset(fd);
    }
    std::uint64_t written = 0;
    while (r.spool.valid() && written < keep) {
      ssize_t const w = ::write(r.spool.get(), bytes.data() + written, keep - written);
      if (w > 0) {
        written += static_cast<std::uint64_t>(w);
      } else if (w < 0 && errno == EINTR) {
        continue;
      } else {
        break;
      }
    }
    keep = written;  // a failed spool write means those bytes were not retained
  }
  // Stream offset of this chunk. The spool and the event data both keep a prefix of the stream,
  // so for kept bytes this is also their offset in the spool (exec.output).
  std::uint64_t const offset = r.acc.observed;
  if (auto acc = core::account_chunk(r.acc, n, sat_add(r.acc.retained, keep))) {
    r.acc = *acc;
  } else if (auto inc = core::account_mark_incomplete(r.acc)) {
    r.acc = *inc;
  }
  r.spool_size += keep;
  owner_->count_spooled(keep);

  if (allowed > 0) {
    if (output_events_ < plan.max_events) {
      ++output_events_;
      boost::json::object f;
      f["stream"] = core::stream_wire(r.stream);
      f["offset"] = offset;
      owner_->emit("output", std::move(f),
                   std::vector<std::uint8_t>(bytes.begin(),
                                             bytes.begin() + static_cast<std::ptrdiff_t>(allowed)));
    } else if (!max_events_reported_) {
      max_events_reported_ = true;
      boost::json::object f;
      f["limit"] = "max_events";
      f["stream"] = core::stream_wire(r.stream);
      f["action"] = "suppress_events";
      owner_->emit("limit", std::move(f));
    }
  }

  bool const output_limit = allowed < n;
  bool const spool_limit = keep < allowed && plan.spool_bytes > 0;
  if ((output_limit || spool_limit) && !r.limit_reported) {
    r.limit_reported = true;
    boost::json::object f;
    f["limit"] = output_limit ? "output_bytes" : "spool_bytes";
    f["stream"] = core::stream_wire(r.stream);
    f["action"] = plan.cancel_on_limit ? "cancel" : "truncate";
    owner_->emit("limit", std::move(f));
    if (plan.cancel_on_limit) {
      (void)owner_->offer(core::Trigger::output_limit, output_limit ? "limits.output_bytes reached"
                                                                    : "output.spool_bytes reached");
    }
  }
}

void OutputPumps::end(StreamState& s) {
  s.ended = true;
  s.spool.reset();
}

void OutputPumps::on_end(core::Stream stream, bool complete) {
  StreamState* st = find(stream);
  if (st == nullptr || st->ended) return;
  if (!complete) {
    if (auto a = core::account_mark_incomplete(st->acc)) st->acc = *a;
  }
  end(*st);
}

void OutputPumps::mark_forced(core::Stream stream) {
  StreamState* st = find(stream);
  if (st == nullptr) return;
  if (auto a = core::account_mark_incomplete(st->acc)) st->acc = *a;
  end(*st);
}

bool OutputPumps::all_ended() const noexcept {
  return std::all_of(streams_.begin(), streams_.end(),
                     [](StreamState const& s) { return s.ended; });
}

core::OutputAccounting OutputPumps::accounting() const {
  core::OutputAccounting out;
  if (owner_->plan_.pty) {
    out[core::Stream::pty] = core::StreamAccounting{};
  } else {
    out[core::Stream::stdout_stream] = core::StreamAccounting{};
    out[core::Stream::stderr_stream] = core::StreamAccounting{};
  }
  for (auto const& s : streams_) out[s.stream] = s.acc;
  return out;
}

std::uint64_t OutputPumps::observed_total() const noexcept {
  std::uint64_t observed = 0;
  for (auto const& s : streams_) observed = sat_add(observed, s.acc.observed);
  return observed;
}

Result<OutputSlice> OutputPumps::slice(core::Stream stream, std::uint64_t offset,
                                       std::uint64_t max_bytes, bool spawn_failed) const {
  StreamState const* r = find(stream);
  // A terminal has one stream; a client asking for stdout of a PTY execution gets it.
  if (r == nullptr && owner_->plan_.pty && stream == core::Stream::stdout_stream)
    r = find(core::Stream::pty);
  OutputSlice slice;
  if (r == nullptr) {
    if (spawn_failed) {
      slice.eof = true;  // nothing ever ran: an empty, complete, ended stream
      return slice;
    }
    return Error(
        Errc::plan_invalid_value,
        std::string{"no stream "} + std::string{core::stream_wire(stream)} + " in this execution");
  }
  slice.complete = r->acc.complete;
  std::uint64_t const size = r->spool_size;
  std::uint64_t const want = std::min({max_bytes, kMaxSliceBytes, sat_sub(size, offset)});
  if (want > 0) {
    auto const path = spool_path(r->stream);
    sys::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return Error(Errc::sys_error, "open spool " + path.string(), errno);
    slice.data.resize(want);
    std::uint64_t got = 0;
    while (got < want) {
      ssize_t const n =
          ::pread(fd.get(), slice.data.data() + got, want - got, static_cast<off_t>(offset + got));
      if (n > 0) {
        got += static_cast<std::uint64_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        break;
      }
    }
    slice.data.resize(got);
  }
  slice.eof = r->ended && offset + slice.data.size() >= size;
  return slice;
}

// ------------------------------------------------------------------------------ stdin

Result<std::uint64_t> OutputPumps::input(std::span<std::uint8_t const> data, bool eof) {
  PlanView const& plan = owner_->plan_;
  if (writer_.closed || writer_.eof_requested) return Error(Errc::exec_input_closed, owner_->id_);
  if (plan.stdin_bytes && sat_add(writer_.accepted, data.size()) > *plan.stdin_bytes) {
    return Error(Errc::exec_input_limit, "limits.stdin_bytes=" + std::to_string(*plan.stdin_bytes) +
                                             ", already accepted " +
                                             std::to_string(writer_.accepted));
  }
  std::size_t const bound = owner_->config().stdin_queue_bytes;
  std::size_t const room = bound > writer_.queued ? bound - writer_.queued : 0;
  std::size_t const take = std::min(room, data.size());
  if (take > 0) {
    writer_.queue.emplace_back(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(take));
    writer_.queued += take;
    writer_.accepted += take;
  }
  // EOF applies only once everything offered with it was taken; otherwise the caller resends.
  if (eof && take == data.size()) writer_.eof_requested = true;
  drain_input();
  return static_cast<std::uint64_t>(take);
}

void OutputPumps::drain_input() {
  if (writer_.closed || owner_->detached_) return;
  auto& be = *owner_->backend_;
  while (!writer_.queue.empty()) {
    auto& front = writer_.queue.front();
    auto const w = be.write_input(std::span<std::uint8_t const>(
        front.data() + writer_.front_offset, front.size() - writer_.front_offset));
    writer_.front_offset += w.written;
    writer_.queued -= w.written;
    if (writer_.front_offset == front.size()) {
      writer_.queue.pop_front();
      writer_.front_offset = 0;
    }
    if (w.closed) return close_input("peer_closed");
    if (w.would_block) return be.await_input_writable();
  }
  if (writer_.eof_requested) close_input("eof");
}

void OutputPumps::close_input(std::string_view reason) {
  if (writer_.closed) return;
  writer_.closed = true;
  writer_.queue.clear();
  writer_.queued = 0;
  writer_.front_offset = 0;
  // The program reads end of file after an eof, and when its sandbox allows no input.
  owner_->backend_->close_input(reason == "eof" || reason == "sandbox");
  if (reason == "none" || owner_->detached_) return;  // no input channel: nothing to say
  boost::json::object f;
  f["reason"] = reason;
  f["accepted_bytes"] = writer_.accepted;
  owner_->emit("input_closed", std::move(f));
}

}  // namespace custos::supervisor
