// custos logs [-f] ID: an execution's output from its spool files (exec.output). With -f it
// keeps polling until every stream reports eof (the execution is terminal).
#include <fmt/core.h>

#include <thread>
#include <unistd.h>

#include "custos/core/base64.hpp"

#include "common.hpp"
#include "exit_codes.hpp"

namespace custos::cli {

namespace json = boost::json;

namespace {

struct StreamState {
  char const* name;
  int fd;
  std::uint64_t offset = 0;
  bool eof = false;
  bool absent = false;
};

bool write_all(int fd, std::vector<std::uint8_t> const& data) {
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t const n = ::write(fd, data.data() + off, data.size() - off);
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

void add_logs(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("logs", "Print an execution's output");
  auto id = std::make_shared<std::string>();
  auto follow = std::make_shared<bool>(false);
  sub->add_option("id", *id, "Execution id")->required();
  sub->add_flag("-f,--follow", *follow, "Keep printing until the execution is terminal");
  sub->callback([&g, id, follow] {
    auto client = connect_daemon(g);
    if (!client) {
      g.exit_code = report(client.error());
      return;
    }
    StreamState streams[] = {
        {"stdout", STDOUT_FILENO}, {"stderr", STDERR_FILENO}, {"pty", STDOUT_FILENO}};
    bool first_round = true;
    for (;;) {
      bool progressed = false;
      bool all_done = true;
      for (auto& s : streams) {
        if (s.eof || s.absent) continue;
        auto r = client->call("exec.output", {{"execution_id", *id},
                                              {"stream", s.name},
                                              {"offset", s.offset},
                                              {"max_bytes", 1 << 20}});
        if (!r) {
          if (r.error().code == Errc::exec_not_found || r.error().code == Errc::rpc_unavailable) {
            g.exit_code = report(r.error());
            return;
          }
          // A stream this execution's mode does not have (pty vs pipes).
          s.absent = true;
          continue;
        }
        auto const& o = r->get_object();
        auto data =
            core::base64_decode(str_field(o, "data_b64")).value_or(std::vector<std::uint8_t>{});
        if (!data.empty()) {
          (void)write_all(s.fd, data);
          s.offset += data.size();
          progressed = true;
        }
        if (auto const* e = o.if_contains("eof"); e != nullptr && e->is_bool() && e->get_bool()) {
          s.eof = true;
        }
        if (!s.eof) all_done = false;
      }
      if (all_done || (!*follow && !progressed && !first_round)) break;
      first_round = false;
      if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    g.exit_code = kExitOk;
  });
}

}  // namespace custos::cli
