// custos logs [-f] ID: an execution's output.
//
// Without -f: what its spool files hold now (exec.output), stdout to stdout, stderr to stderr.
// With -f: exec.subscribe from seq 1 and the output events as they come, until the terminal
// event; nothing is polled. Events can be dropped for a slow reader and the event log keeps a
// bounded window (docs/api.md), so a gap in a stream's offsets is filled from the spool first,
// and the bytes after the last event are read from the spool at the end: every byte is printed
// once, in order. An exec.wait sent alongside ends the follow even if the terminal event itself
// was dropped (replies are never dropped).
//
// When the daemon closes the connection (a handover), the follow goes on over a new one
// (connects retried for up to kReconnectBudget): exec.subscribe from the seq after the last one
// handled, events up to it skipped if they come again, a `replay_from` past it said on stderr as
// a gap, and exec.wait sent again — it answers at once when the execution ended meanwhile, also
// when the new image numbers its events from 1 again. Output is printed by stream offset, so
// nothing is printed twice and what no event brought is read from the spool.
#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <optional>
#include <unistd.h>

#include "custos/core/base64.hpp"
#include "custos/rpc/protocol.hpp"

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace json = boost::json;

namespace {

bool write_all(int fd, std::uint8_t const* data, std::size_t size) {
  std::size_t off = 0;
  while (off < size) {
    ssize_t const n = ::write(fd, data + off, size - off);
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

int fd_for(std::string_view stream) {
  return stream == "stderr" ? STDERR_FILENO : STDOUT_FILENO;
}

class LogReader {
 public:
  LogReader(Globals const& g, RpcClient client, std::string id)
      : g_(g), client_(std::move(client)), id_(std::move(id)) {}

  // Prints `stream` from what was printed so far up to `upto` (to the spool's current end when
  // nullopt). Returns false when the stream is not there (exec.output refused it: a stream this
  // execution's io mode does not have) or the execution is unknown; `error` then says why.
  bool fill_from_spool(std::string const& stream, std::optional<std::uint64_t> upto,
                       std::optional<Error>& error) {
    auto& done = written_[stream];
    while (!upto || done < *upto) {
      std::uint64_t want = std::uint64_t{1} << 20U;
      if (upto) want = std::min<std::uint64_t>(want, *upto - done);
      auto r = client_.call(
          "exec.output",
          {{"execution_id", id_}, {"stream", stream}, {"offset", done}, {"max_bytes", want}});
      if (!r) {
        error = r.error();
        return false;
      }
      if (!r->is_object()) return true;
      auto const& o = r->get_object();
      auto data =
          core::base64_decode(str_field(o, "data_b64")).value_or(std::vector<std::uint8_t>{});
      if (!data.empty()) {
        (void)write_all(fd_for(stream), data.data(), data.size());
        done += data.size();
      }
      auto const* eof = o.if_contains("eof");
      if (data.empty() || (eof != nullptr && eof->is_bool() && eof->get_bool())) return true;
    }
    return true;
  }

  // One pass over the spools (no -f). Errors only when the execution cannot be read at all.
  Result<void> print_spools() {
    bool any = false;
    std::optional<Error> last;
    for (char const* s : {"stdout", "stderr", "pty"}) {
      std::optional<Error> e;
      if (fill_from_spool(s, std::nullopt, e)) {
        any = true;
        continue;
      }
      if (e && (e->code == Errc::exec_not_found || e->code == Errc::rpc_unavailable ||
                e->code == Errc::auth_denied))
        return *e;
      last = e;
    }
    if (!any && last) return *last;
    return ok();
  }

  // -f: subscribe, print output events live, stop at the terminal event (or exec.wait's reply);
  // over a new connection when the daemon closed ours.
  Result<void> follow() {
    for (;;) {
      auto done = follow_once();
      if (!done && connection_lost(done.error())) {
        auto fresh = CUSTOS_TRY(reconnect_daemon(g_));
        fresh.take_notifications(client_);
        client_ = std::move(fresh);
        continue;
      }
      CUSTOS_TRYV(done);
      // Whatever came after the last delivered event (or was never sent as one) is in the
      // spools.
      for (char const* s : {"stdout", "stderr", "pty"}) {
        std::optional<Error> e;
        if (!fill_from_spool(s, std::nullopt, e) && e && connection_lost(*e)) {
          auto fresh = CUSTOS_TRY(reconnect_daemon(g_));
          client_ = std::move(fresh);
          (void)fill_from_spool(s, std::nullopt, e);
        }
      }
      return ok();
    }
  }

 private:
  // One connection's part of the follow: the subscription from the seq after the last one
  // handled (seq 1 at first), and exec.wait alongside. Errors: connection_lost() ones mean go on
  // over a new connection.
  Result<void> follow_once() {
    std::uint64_t const from = last_seq_ + 1;
    auto sub = client_.call("exec.subscribe", {{"execution_id", id_}, {"from_seq", from}});
    // After a reconnect the new daemon may know the execution only from its registry (it ended
    // before): exec.wait below answers with its stored result.
    if (!sub && (from == 1 || sub.error().code != Errc::exec_not_found)) return sub.error();
    if (sub && from > 1 && sub->is_object()) {
      if (auto const* rf = sub->get_object().if_contains("replay_from");
          rf != nullptr && rf->is_number() && rf->to_number<std::uint64_t>() > from) {
        fmt::print(stderr,
                   "custos: reconnected; events {}..{} of {} were not kept by the daemon (a "
                   "gap; output is read back from the spool)\n",
                   from, rf->to_number<std::uint64_t>() - 1, id_);
      }
    }
    auto const wait_id = CUSTOS_TRY(client_.send("exec.wait", {{"execution_id", id_}}));
    for (;;) {
      auto msg = CUSTOS_TRY(client_.next(-1));
      if (!msg) continue;
      auto const& m = *msg;
      if (auto const* method = m.if_contains("method"); method != nullptr) {
        auto const* params = m.if_contains("params");
        if (method->is_string() && method->get_string() == "exec.event" && params != nullptr &&
            params->is_object()) {
          auto const& ev = params->get_object();
          std::uint64_t seq = 0;
          if (auto const* s = ev.if_contains("seq"); s != nullptr && s->is_number())
            seq = s->to_number<std::uint64_t>();
          // Seen before the reconnect, or an event log that started again (a terminal event of
          // it is followed by exec.wait's answer).
          if (seq != 0 && seq <= last_seq_) continue;
          bool const terminal = CUSTOS_TRY(on_event(ev));
          last_seq_ = std::max(last_seq_, seq);
          if (terminal) return ok();
        }
        continue;
      }
      auto const* idv = m.if_contains("id");
      bool const is_wait =
          idv != nullptr && idv->is_number() && idv->to_number<std::uint64_t>() == wait_id;
      if (!is_wait) continue;
      if (auto const* err = m.if_contains("error"); err != nullptr && err->is_object())
        return rpc::error_from_object(err->get_object());
      return ok();
    }
  }

  // True at the terminal event. Errors: a lost connection while reading a gap from the spool
  // (the event is then handled again over the next one).
  Result<bool> on_event(json::object const& ev) {
    std::string const kind = str_field(ev, "kind");
    if (kind == "terminal") return true;
    if (kind != "output") return false;
    auto data = core::base64_decode(str_field(ev, "data_b64"));
    if (!data) return false;
    std::string const stream = str_field(ev, "stream");
    auto& done = written_[stream];
    std::uint64_t offset = done;
    if (auto const* o = ev.if_contains("offset"); o != nullptr && o->is_number())
      offset = o->to_number<std::uint64_t>();
    if (offset > done) {
      // Events before this one were dropped or have left the event log: the spool has them.
      std::optional<Error> e;
      if (!fill_from_spool(stream, offset, e) && e && connection_lost(*e)) return *e;
    }
    if (offset + data->size() <= done) return false;  // already printed (replay overlap)
    auto const skip = done > offset ? done - offset : 0;
    (void)write_all(fd_for(stream), data->data() + skip, data->size() - skip);
    done = offset + data->size();
    return false;
  }

  Globals const& g_;
  RpcClient client_;
  std::string id_;
  std::uint64_t last_seq_ = 0;                    // the highest event seq handled
  std::map<std::string, std::uint64_t> written_;  // bytes printed per stream
};

}  // namespace

void add_logs(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("logs", "Print an execution's output");
  auto id = std::make_shared<std::string>();
  auto follow = std::make_shared<bool>(false);
  sub->add_option("id", *id, "Execution id")->required();
  sub->add_flag("-f,--follow", *follow,
                "Follow the execution's output events until it is terminal");
  sub->footer(reconnect_help());
  sub->callback([&g, id, follow] {
    auto client = connect_daemon(g);
    if (!client) {
      g.exit_code = report(client.error());
      return;
    }
    LogReader reader{g, std::move(*client), *id};
    auto r = *follow ? reader.follow() : reader.print_spools();
    g.exit_code = r ? kExitOk : report(r.error());
  });
}

}  // namespace custos::cli
