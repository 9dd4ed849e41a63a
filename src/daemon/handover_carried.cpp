// The executions part of the handover manifest (handover.hpp): what one image carries to the
// next for each live execution (supervisor::Carried) as JSON, and back. Each descriptor goes by
// its number with the device and inode it had when written; the next image takes it over only
// if the number still names that file (docs/supervisor.md, "Handover").
#include "handover_carried.hpp"

#include <cstdlib>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "custos/core/base64.hpp"

namespace custos::daemon::handover {

namespace json = boost::json;

namespace {

json::value fd_entry(sys::UniqueFd const& fd) {
  if (!fd.valid()) return nullptr;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return nullptr;
  return json::object{{"fd", fd.get()},
                      {"dev", static_cast<std::uint64_t>(st.st_dev)},
                      {"ino", static_cast<std::uint64_t>(st.st_ino)}};
}

std::uint64_t u64(json::object const& o, char const* key) {
  auto const* v = o.if_contains(key);
  if (v == nullptr) return 0;
  if (v->is_uint64()) return v->get_uint64();
  if (v->is_int64() && v->get_int64() >= 0) return static_cast<std::uint64_t>(v->get_int64());
  return 0;
}

json::value maybe(std::optional<std::uint64_t> v) {
  return v ? json::value(*v) : json::value(nullptr);
}

// A number the entry may leave null (not measured).
std::optional<std::uint64_t> maybe_u64(json::object const& o, char const* key) {
  auto const* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (v->is_uint64()) return v->get_uint64();
  if (v->is_int64() && v->get_int64() >= 0) return static_cast<std::uint64_t>(v->get_int64());
  return std::nullopt;
}

bool flag(json::object const& o, char const* key) {
  auto const* v = o.if_contains(key);
  return v != nullptr && v->is_bool() && v->get_bool();
}

std::string text(json::object const& o, char const* key) {
  auto const* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string{v->get_string()} : std::string{};
}

Error failed(std::string what) {
  return Error{Errc::daemon_handover_failed, std::move(what)};
}

// What a carried descriptor must be: a pipe or a terminal (stdio), or a connected stream socket
// (a backend's connection).
enum class Kind : std::uint8_t { stdio, connection };

// Takes over the descriptor an entry names (O_CLOEXEC from here), if it is still the file the
// entry recorded. A null entry is no descriptor.
Result<sys::UniqueFd> take_verified(json::value const* v, std::string const& what,
                                    Kind kind = Kind::stdio) {
  if (v == nullptr || v->is_null()) return sys::UniqueFd{};
  if (!v->is_object()) return failed(what + ": not an object");
  auto const& o = v->get_object();
  auto const n = u64(o, "fd");
  if (n < 3 || n > INT32_MAX) return failed(what + ": no descriptor number");
  int const fd = static_cast<int>(n);
  if (::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) return failed(what + ": descriptor not open");
  sys::UniqueFd held{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return failed(what + ": fstat failed");
  if (static_cast<std::uint64_t>(st.st_dev) != u64(o, "dev") ||
      static_cast<std::uint64_t>(st.st_ino) != u64(o, "ino")) {
    return failed(what + ": the descriptor is not the file the manifest recorded");
  }
  if (kind == Kind::stdio) {
    if (!S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) {
      return failed(what + ": neither a pipe nor a terminal");
    }
    return held;
  }
  int type = 0;
  int listening = 0;
  socklen_t len = sizeof type;
  bool const stream_socket = S_ISSOCK(st.st_mode) &&
                             ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 &&
                             type == SOCK_STREAM;
  len = sizeof listening;
  sockaddr_storage peer{};
  socklen_t peer_len = sizeof peer;
  if (!stream_socket || ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
      listening != 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
    return failed(what + ": not a connected stream socket");
  }
  return held;
}

}  // namespace

json::object carried_json(supervisor::Carried const& c) {
  json::array streams;
  for (auto const& s : c.streams) {
    streams.push_back(json::object{{"stream", core::stream_wire(s.stream)},
                                   {"ended", s.ended},
                                   {"limit_reported", s.limit_reported},
                                   {"observed", s.acc.observed},
                                   {"retained", s.acc.retained},
                                   {"dropped", s.acc.dropped},
                                   {"complete", s.acc.complete},
                                   {"spool_size", s.spool_size}});
  }
  json::array events;
  for (auto const& ev : c.events) {
    json::object e{{"seq", ev.seq}, {"kind", ev.kind}, {"fields", ev.fields}};
    if (!ev.data.empty()) e["data_b64"] = core::base64_encode(ev.data);
    events.push_back(std::move(e));
  }
  return json::object{{"id", c.execution_id},
                      {"stdio", json::object{{"pty", c.stdio.pty},
                                             {"out", fd_entry(c.stdio.out)},
                                             {"err", fd_entry(c.stdio.err)},
                                             {"in", fd_entry(c.stdio.in)},
                                             {"connection", fd_entry(c.stdio.connection)},
                                             {"state", c.stdio.state}}},
                      {"streams", std::move(streams)},
                      {"output_allowed", c.output_allowed},
                      {"output_events", c.output_events},
                      {"max_events_reported", c.max_events_reported},
                      {"input", json::object{{"queued_b64", core::base64_encode(c.input_queued)},
                                             {"accepted", c.input_accepted},
                                             {"eof_requested", c.input_eof_requested},
                                             {"closed", c.input_closed}}},
                      {"next_seq", c.next_seq},
                      {"events", std::move(events)},
                      {"resources", json::object{{"cpu_ms", maybe(c.peaks.cpu_ms)},
                                                 {"rss_bytes", maybe(c.peaks.rss_bytes)},
                                                 {"processes", maybe(c.peaks.processes)},
                                                 {"open_fds", maybe(c.peaks.open_fds)},
                                                 {"disk_growth", maybe(c.peaks.disk_growth)},
                                                 {"disk_baseline", maybe(c.disk_baseline)}}}};
}

std::vector<int> carried_fds(supervisor::Carried const& c) {
  std::vector<int> out;
  for (auto const* fd : {&c.stdio.out, &c.stdio.err, &c.stdio.in, &c.stdio.connection}) {
    if (fd->valid()) out.push_back(fd->get());
  }
  return out;
}

Result<supervisor::Carried> carried_from_json(json::value const& v) {
  if (!v.is_object()) return failed("an execution entry is not an object");
  auto const& o = v.get_object();
  supervisor::Carried c;
  c.execution_id = text(o, "id");
  std::string const who = "execution " + c.execution_id;
  auto const* stdio = o.if_contains("stdio");
  if (stdio == nullptr || !stdio->is_object()) return failed(who + ": no stdio");
  auto const& io = stdio->get_object();
  c.stdio.pty = flag(io, "pty");
  // Every descriptor is taken over first (so none stays open unowned), then checked.
  auto out = take_verified(io.if_contains("out"), who + " out");
  auto err = take_verified(io.if_contains("err"), who + " err");
  auto in = take_verified(io.if_contains("in"), who + " in");
  auto connection =
      take_verified(io.if_contains("connection"), who + " connection", Kind::connection);
  if (c.execution_id.empty()) return failed("an execution entry has no id");
  if (!out) return out.error();
  if (!err) return err.error();
  if (!in) return in.error();
  if (!connection) return connection.error();
  c.stdio.out = std::move(*out);
  c.stdio.err = std::move(*err);
  c.stdio.in = std::move(*in);
  c.stdio.connection = std::move(*connection);
  if (auto const* st = io.if_contains("state"); st != nullptr && st->is_object()) {
    c.stdio.state = st->get_object();  // the backend's own, read by it
  }

  if (auto const* streams = o.if_contains("streams"); streams != nullptr && streams->is_array()) {
    for (auto const& sv : streams->get_array()) {
      if (!sv.is_object()) return failed(who + ": a stream entry is not an object");
      auto const& so = sv.get_object();
      auto const stream = core::stream_from_wire(text(so, "stream"));
      if (!stream) return failed(who + ": unknown stream " + text(so, "stream"));
      supervisor::Carried::Stream s;
      s.stream = *stream;
      s.ended = flag(so, "ended");
      s.limit_reported = flag(so, "limit_reported");
      s.acc = core::StreamAccounting{u64(so, "observed"), u64(so, "retained"), u64(so, "dropped"),
                                     flag(so, "complete")};
      if (auto r = s.acc.check(); !r) return failed(who + ": " + r.error().message());
      s.spool_size = u64(so, "spool_size");
      c.streams.push_back(s);
    }
  }
  c.output_allowed = u64(o, "output_allowed");
  c.output_events = u64(o, "output_events");
  c.max_events_reported = flag(o, "max_events_reported");
  if (auto const* input = o.if_contains("input"); input != nullptr && input->is_object()) {
    auto const& io_in = input->get_object();
    auto queued = core::base64_decode(text(io_in, "queued_b64"));
    if (!queued) return failed(who + ": the queued input is not base64");
    c.input_queued = std::move(*queued);
    c.input_accepted = u64(io_in, "accepted");
    c.input_eof_requested = flag(io_in, "eof_requested");
    c.input_closed = flag(io_in, "closed");
  }
  if (auto const* r = o.if_contains("resources"); r != nullptr && r->is_object()) {
    auto const& ro = r->get_object();
    c.peaks.cpu_ms = maybe_u64(ro, "cpu_ms");
    c.peaks.rss_bytes = maybe_u64(ro, "rss_bytes");
    c.peaks.processes = maybe_u64(ro, "processes");
    c.peaks.open_fds = maybe_u64(ro, "open_fds");
    c.peaks.disk_growth = maybe_u64(ro, "disk_growth");
    c.disk_baseline = maybe_u64(ro, "disk_baseline");
  }
  c.next_seq = u64(o, "next_seq");
  if (c.next_seq < 1) return failed(who + ": no next seq");
  if (auto const* events = o.if_contains("events"); events != nullptr && events->is_array()) {
    for (auto const& ev : events->get_array()) {
      if (!ev.is_object()) return failed(who + ": an event is not an object");
      auto const& eo = ev.get_object();
      supervisor::Event e;
      e.seq = u64(eo, "seq");
      e.kind = text(eo, "kind");
      if (auto const* f = eo.if_contains("fields"); f != nullptr && f->is_object())
        e.fields = f->get_object();
      if (eo.contains("data_b64")) {
        auto data = core::base64_decode(text(eo, "data_b64"));
        if (!data) return failed(who + ": an event's data is not base64");
        e.data = std::move(*data);
      }
      c.events.push_back(std::move(e));
    }
  }
  return c;
}

}  // namespace custos::daemon::handover
