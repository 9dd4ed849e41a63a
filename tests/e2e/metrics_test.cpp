// The Prometheus endpoint (docs/metrics.md) of a real daemon, scraped with a real HTTP client
// (Boost.Beast) over its Unix socket and over loopback TCP: the numbers are what the test made
// the daemon do, malformed or stalled scrapers are answered or cut off while the API keeps
// serving, and a non-loopback address stops the start.
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <map>
#include <regex>
#include <set>

#include "e2e/harness.hpp"

namespace custos::e2e {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using boost::system::error_code;

struct Reply {
  unsigned status = 0;
  std::string content_type;
  std::string allow;
  std::string body;
};

// One connection to the endpoint: requests written with Beast, answers read with Beast under a
// deadline (a daemon that never answers fails the test instead of hanging it).
template <class Protocol>
class Scraper {
 public:
  explicit Scraper(typename Protocol::endpoint const& ep) : socket_(io_) { socket_.connect(ep); }

  std::optional<Reply> get(std::string const& target, http::verb verb = http::verb::get) {
    http::request<http::empty_body> req{verb, target, 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::user_agent, "custos-e2e");
    error_code ec;
    http::write(socket_, req, ec);
    if (ec) return std::nullopt;
    return read();
  }

  // Any bytes (garbage, a partial request), then one answer if one comes.
  std::optional<Reply> raw(std::string const& bytes,
                           std::chrono::milliseconds timeout = std::chrono::seconds{10}) {
    error_code ec;
    asio::write(socket_, asio::buffer(bytes), ec);
    if (ec) return std::nullopt;
    return read(timeout);
  }

  // True when the daemon closed this connection within `timeout` (EOF or reset).
  bool closed_by_peer(std::chrono::milliseconds timeout) {
    std::array<char, 256> buf{};
    bool closed = false;
    socket_.async_read_some(asio::buffer(buf), [&](error_code ec, std::size_t) { closed = !!ec; });
    run(timeout);
    return closed;
  }

 private:
  std::optional<Reply> read(std::chrono::milliseconds timeout = std::chrono::seconds{10}) {
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    std::optional<error_code> result;
    http::async_read(socket_, buffer, res, [&](error_code ec, std::size_t) { result = ec; });
    run(timeout);
    if (!result || *result) return std::nullopt;
    return Reply{res.result_int(), std::string{res[http::field::content_type]},
                 std::string{res[http::field::allow]}, res.body()};
  }

  // Runs the pending operation for at most `timeout`; one still pending then is cancelled.
  void run(std::chrono::milliseconds timeout) {
    io_.restart();
    io_.run_for(timeout);
    if (!io_.stopped()) {
      error_code ignored;
      socket_.cancel(ignored);
      io_.restart();
      io_.run();
    }
  }

  asio::io_context io_;
  typename Protocol::socket socket_;
};

using UnixScraper = Scraper<asio::local::stream_protocol>;
using TcpScraper = Scraper<asio::ip::tcp>;

// The exposition, checked for form while it is read: every sample's family has HELP and TYPE
// lines before it. Samples are keyed by their name and label text, as printed.
struct Exposition {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;
  std::vector<std::string> problems;
  std::vector<std::pair<double, double>> buckets;  // custos_registry_commit_seconds: (le, count)

  [[nodiscard]] double at(std::string const& key) const {
    auto it = samples.find(key);
    return it == samples.end() ? -1 : it->second;
  }
};

Exposition parse(std::string const& text) {
  Exposition e;
  std::set<std::string> helped;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0) {
      helped.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      auto const rest = line.substr(7);
      auto const sp = rest.find(' ');
      e.types[rest.substr(0, sp)] = rest.substr(sp + 1);
      continue;
    }
    auto const sp = line.rfind(' ');
    if (line.empty() || sp == std::string::npos) {
      e.problems.push_back("not a sample: " + line);
      continue;
    }
    std::string const key = line.substr(0, sp);
    std::string name = key.substr(0, key.find('{'));
    std::string family = name;
    for (std::string suffix : {"_bucket", "_sum", "_count"}) {
      auto const base =
          name.size() > suffix.size() ? name.substr(0, name.size() - suffix.size()) : std::string{};
      if (name.ends_with(suffix) && e.types.contains(base) && e.types[base] == "histogram") {
        family = base;
      }
    }
    if (!e.types.contains(family) || !helped.contains(family)) {
      e.problems.push_back("no HELP/TYPE before " + key);
    }
    double const value = std::stod(line.substr(sp + 1));
    e.samples[key] = value;
    if (name == "custos_registry_commit_seconds_bucket") {
      auto const le = key.substr(key.find("le=\"") + 4);
      std::string const bound = le.substr(0, le.find('"'));
      e.buckets.emplace_back(bound == "+Inf" ? 1e300 : std::stod(bound), value);
    }
  }
  return e;
}

template <class S>
Exposition scrape(S& scraper) {
  auto r = scraper.get("/metrics");
  EXPECT_TRUE(r.has_value()) << "no answer to GET /metrics";
  if (!r) return {};
  EXPECT_EQ(r->status, 200U);
  EXPECT_EQ(r->content_type.rfind("text/plain; version=0.0.4", 0), 0U) << r->content_type;
  auto e = parse(r->body);
  EXPECT_TRUE(e.problems.empty()) << e.problems.front() << "\n" << r->body;
  return e;
}

// Waits until `pred` holds for a fresh scrape (counters settle a loop turn after the event).
template <class S, class Pred>
Exposition scrape_until(S& scraper, Pred pred, std::chrono::milliseconds timeout = 10s) {
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  Exposition e = scrape(scraper);
  while (!pred(e) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    e = scrape(scraper);
  }
  return e;
}

std::string terminal_of(LineClient& c, std::string const& id) {
  auto rec = wait_record(
      c, id, [](json::object const& x) { return x.at("phase").as_string() == "terminal"; });
  EXPECT_TRUE(rec && rec->contains("terminal")) << id;
  if (!rec || !rec->contains("terminal")) return {};
  return json::serialize(rec->at("terminal"));
}

// exec.start without a pidfd on the root (a short program may be gone before one is opened).
std::string start_id(LineClient& c, std::vector<std::string> const& argv,
                     json::object limits = {}) {
  static std::int64_t id = 1000;
  auto r = c.call(id++, "exec.start", start_params(argv, std::move(limits)));
  EXPECT_TRUE(r && r->contains("result")) << (r ? json::serialize(*r) : "no reply");
  if (!r || !r->contains("result")) return {};
  return std::string{r->at("result").at("execution_id").as_string()};
}

std::uint64_t size_of(fs::path const& p) {
  std::error_code ec;
  auto const n = fs::file_size(p, ec);
  return ec ? 0 : n;
}

DaemonOptions with_metrics(std::string const& listen) {
  DaemonOptions opts;
  opts.extra_args = {"--metrics-listen", listen};
  return opts;
}

TEST(Metrics, UnixSocketCountsWhatTheDaemonDid) {
  TempDir dir{"/var/tmp"};
  fs::path const sock = dir.path() / "metrics.sock";
  Daemon d{with_metrics("unix:" + sock.native())};
  ASSERT_TRUE(d.ready()) << d.log();
  LineClient c = d.client();
  ASSERT_TRUE(c.connected());
  UnixScraper s{asio::local::stream_protocol::endpoint{sock.native()}};

  // A fresh daemon: nothing launched yet, every family present.
  auto e = scrape(s);
  EXPECT_EQ(e.at("custos_launches_total"), 0);
  EXPECT_EQ(e.types["custos_registry_commit_seconds"], "histogram");
  EXPECT_EQ(e.types["custos_launches_total"], "counter");
  EXPECT_EQ(e.types["custos_executions"], "gauge");
  EXPECT_EQ(e.at("custos_events_dropped_total"), 0);

  // Known outcomes: two exit 0, one exit 3, 100000 bytes of output, one cancelled, one past its
  // deadline.
  std::vector<std::string> ids;
  for (auto const& argv :
       std::vector<std::vector<std::string>>{{"/bin/true"},
                                             {"/bin/true"},
                                             {"/bin/sh", "-c", "exit 3"},
                                             {"/usr/bin/head", "-c", "100000", "/dev/zero"}}) {
    ids.push_back(start_id(c, argv));
  }
  for (auto const& id : ids) EXPECT_NE(terminal_of(c, id).find("\"exited\""), std::string::npos);

  auto sleeper = start_execution(c, {"/bin/sleep", "30"}, true);
  if (sleeper.pidfd >= 0) ::close(sleeper.pidfd);
  e = scrape(s);
  EXPECT_EQ(e.at("custos_executions{phase=\"running\"}"), 1);
  auto x = c.call(50, "exec.cancel", {{"execution_id", sleeper.id}, {"reason", "metrics test"}});
  ASSERT_TRUE(x && x->contains("result")) << (x ? json::serialize(*x) : "no reply");
  EXPECT_NE(terminal_of(c, sleeper.id).find("\"cancelled\""), std::string::npos);
  ids.push_back(sleeper.id);

  std::string const late = start_id(c, {"/bin/sleep", "30"}, {{"wall_ms", 300}});
  EXPECT_NE(terminal_of(c, late).find("\"timed_out\""), std::string::npos);
  ids.push_back(late);

  // Cleanup as each terminal record says it.
  int unconfirmed = 0;
  for (auto const& id : ids) {
    if (terminal_of(c, id).find("\"cleanup\":\"unconfirmed\"") != std::string::npos) ++unconfirmed;
  }

  e = scrape(s);
  EXPECT_EQ(e.at("custos_launches_total"), 6);
  EXPECT_EQ(e.at("custos_executions_terminal_total{classification=\"exited\"}"), 4);
  EXPECT_EQ(e.at("custos_executions_terminal_total{classification=\"cancelled\"}"), 1);
  EXPECT_EQ(e.at("custos_executions_terminal_total{classification=\"timed_out\"}"), 1);
  EXPECT_EQ(e.at("custos_executions_terminal_total{classification=\"spawn_failed\"}"), 0);
  for (auto const* phase : {"authorized", "starting", "running", "stopping", "exited", "closed"}) {
    EXPECT_EQ(e.at(std::string{"custos_executions{phase=\""} + phase + "\"}"), 0) << phase;
  }
  EXPECT_EQ(e.at("custos_cleanup_unconfirmed_total"), unconfirmed);
  EXPECT_GE(e.at("custos_spool_bytes_total"), 100000);

  // The commit histogram: cumulative, monotone, +Inf equal to the count, and used.
  ASSERT_EQ(e.buckets.size(), 17U);
  for (std::size_t i = 1; i < e.buckets.size(); ++i) {
    EXPECT_GT(e.buckets[i].first, e.buckets[i - 1].first);
    EXPECT_GE(e.buckets[i].second, e.buckets[i - 1].second) << "bucket " << i;
  }
  EXPECT_EQ(e.buckets.front().first, 1e-5);
  EXPECT_EQ(e.buckets[15].first, 1.0);
  EXPECT_GT(e.at("custos_registry_commit_seconds_count"), 0);
  EXPECT_EQ(e.buckets.back().second, e.at("custos_registry_commit_seconds_count"));
  EXPECT_GT(e.at("custos_registry_commit_seconds_sum"), 0);

  // The output store: the 100,000 bytes of `head` are published as an artifact (after the
  // terminal record, on the publisher's thread), and the gauges are host.info's figure.
  e = scrape_until(s, [](Exposition const& now) { return now.at("custos_artifact_bytes") >= 1e5; });
  EXPECT_GE(e.at("custos_artifact_bytes"), 100000);
  EXPECT_GE(e.at("custos_artifacts"), 1);
  // A later publication batch may move the figure between the two reads: read both again
  // until they agree (they are one measurement, so they do once the publisher is idle).
  bool agree = false;
  std::string last;
  for (int i = 0; i < 200 && !agree; ++i) {
    if (i > 0) std::this_thread::sleep_for(50ms);
    e = scrape(s);
    auto info = c.call(900 + i, "host.info");
    ASSERT_TRUE(info && info->contains("result"));
    auto const& store = info->at("result").at("output").as_object();
    last = json::serialize(store);
    agree = e.at("custos_artifact_bytes") == store.at("artifact_bytes").to_number<double>() &&
            e.at("custos_artifacts") == store.at("artifacts").to_number<double>() &&
            e.at("custos_spool_retained_bytes") == store.at("spool_bytes").to_number<double>();
  }
  EXPECT_TRUE(agree) << "host.info output: " << last;

  // The registry's size is its file and WAL as they are now (re-read if a write came between).
  auto const on_disk = [&] {
    return static_cast<double>(size_of(d.state() / "registry.db") +
                               size_of(d.state() / "registry.db-wal"));
  };
  e = scrape_until(
      s, [&](Exposition const& now) { return now.at("custos_registry_size_bytes") == on_disk(); });
  EXPECT_EQ(e.at("custos_registry_size_bytes"), on_disk());
  EXPECT_GT(e.at("custos_registry_size_bytes"), 0);

  // Connected clients: this test's API connection, then two more, then those two gone.
  {
    LineClient more1 = d.client();
    LineClient more2 = d.client();
    ASSERT_TRUE(more1.call(1, "host.info") && more2.call(1, "host.info"));
    e = scrape_until(s,
                     [](Exposition const& now) { return now.at("custos_rpc_connections") == 3; });
    EXPECT_EQ(e.at("custos_rpc_connections"), 3);
  }
  e = scrape_until(s, [](Exposition const& now) { return now.at("custos_rpc_connections") == 1; });
  EXPECT_EQ(e.at("custos_rpc_connections"), 1);
}

TEST(Metrics, WrongRequestsAreRefusedAndTheApiKeepsServing) {
  TempDir dir{"/var/tmp"};
  fs::path const sock = dir.path() / "metrics.sock";
  Daemon d{with_metrics("unix:" + sock.native())};
  ASSERT_TRUE(d.ready()) << d.log();
  asio::local::stream_protocol::endpoint const ep{sock.native()};

  // Another path, another method: 404 and 405, and the connection stays usable.
  UnixScraper s{ep};
  auto r = s.get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404U);
  r = s.get("/metrics", http::verb::post);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405U);
  EXPECT_EQ(r->allow, "GET");
  r = s.get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200U);

  // Garbage: 400, then the connection is closed.
  UnixScraper garbage{ep};
  r = garbage.raw("GARBAGE\r\n\r\n");
  ASSERT_TRUE(r) << "no answer to garbage";
  EXPECT_EQ(r->status, 400U);
  EXPECT_TRUE(garbage.closed_by_peer(5s));

  // A head over the bound (8 KiB): 400, not an unbounded read.
  UnixScraper huge{ep};
  r = huge.raw("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(32768, 'a') +
               "\r\n\r\n");
  ASSERT_TRUE(r) << "no answer to an oversized head";
  EXPECT_EQ(r->status, 400U);

  // A body (a GET has none): 400.
  UnixScraper body{ep};
  r = body.raw("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400U);

  // A scraper that stalls mid-request holds nothing: others are served meanwhile, and it is
  // closed once the read timeout (5 s) passed.
  UnixScraper stalled{ep};
  auto const began = std::chrono::steady_clock::now();
  EXPECT_FALSE(stalled.raw("GET /metr", 200ms)) << "answered a partial request";
  UnixScraper other{ep};
  EXPECT_EQ(scrape(other).at("custos_launches_total"), 0);
  EXPECT_TRUE(stalled.closed_by_peer(10s)) << "a stalled scraper was never closed";
  EXPECT_GE(std::chrono::steady_clock::now() - began, 4s);

  // The API served all along.
  LineClient c = d.client();
  auto info = c.call(1, "host.info");
  ASSERT_TRUE(info && info->contains("result")) << d.log();
  EXPECT_TRUE(d.alive());
}

// A handover keeps the endpoint like the API socket: a scrape that connects while the images
// change waits in the backlog and is answered by the new one (failpoint builds make the window
// 3 s wide). The new image says it serves the handed-over endpoint.
TEST(Metrics, TheEndpointIsKeptAcrossAHandover) {
  TempDir dir{"/var/tmp"};
  fs::path const sock = dir.path() / "metrics.sock";
  auto opts = with_metrics("unix:" + sock.native());
  opts.env = {"CUSTOS_FAILPOINT=handover_slow"};
  Daemon d{opts};
  ASSERT_TRUE(d.ready()) << d.log();
  {
    UnixScraper s{asio::local::stream_protocol::endpoint{sock.native()}};
    EXPECT_EQ(scrape(s).at("custos_launches_total"), 0);
  }
  ASSERT_TRUE(d.signal(SIGHUP));
  auto const deadline = std::chrono::steady_clock::now() + 20s;
  while (d.log().find("live execution(s) detached for the next image") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_NE(d.log().find("live execution(s) detached for the next image"), std::string::npos)
      << d.log();
  // Between the images: the path still names a listening socket.
  try {
    UnixScraper s{asio::local::stream_protocol::endpoint{sock.native()}};
    auto e = scrape(s);
    EXPECT_EQ(e.at("custos_launches_total"), 0);
  } catch (boost::system::system_error const& e) {
    ADD_FAILURE() << "connect during the handover: " << e.what() << "\n" << d.log();
  }
  EXPECT_NE(d.log().find("(handed over)"), std::string::npos) << d.log();
}

class MetricsTcp : public ::testing::TestWithParam<std::string> {};

TEST_P(MetricsTcp, LoopbackPortZeroServesTheSameCounts) {
  Daemon d{with_metrics(GetParam() + ":0")};
  ASSERT_TRUE(d.ready()) << d.log();
  // The bound port is in the log: "metrics: serving http://HOST:PORT/metrics".
  std::smatch m;
  std::string const log = d.log();
  ASSERT_TRUE(std::regex_search(
      log, m, std::regex{R"(metrics: serving http://\[?([0-9a-f.:]+)\]?:(\d+)/metrics)"}))
      << log;
  auto const address = asio::ip::make_address(m[1].str());
  auto const port = static_cast<std::uint16_t>(std::stoul(m[2].str()));
  EXPECT_TRUE(address.is_loopback());
  EXPECT_NE(port, 0U);

  LineClient c = d.client();
  std::string const id = start_id(c, {"/bin/sh", "-c", "exit 3"});
  EXPECT_NE(terminal_of(c, id).find("\"exited\""), std::string::npos);

  TcpScraper s{asio::ip::tcp::endpoint{address, port}};
  auto e = scrape(s);
  EXPECT_EQ(e.at("custos_launches_total"), 1);
  EXPECT_EQ(e.at("custos_executions_terminal_total{classification=\"exited\"}"), 1);
  EXPECT_GE(e.at("custos_rpc_connections"), 1);
  // Keep-alive: a second scrape on the same connection.
  EXPECT_EQ(scrape(s).at("custos_launches_total"), 1);
}

INSTANTIATE_TEST_SUITE_P(Loopback, MetricsTcp, ::testing::Values("127.0.0.1", "[::1]"),
                         [](auto const& param) { return param.index == 0 ? "v4" : "v6"; });

// Anything but a Unix socket or a loopback address stops the start, at its named step, with
// daemon.config_invalid; no API socket is left behind.
TEST(Metrics, NonLoopbackAddressIsRefusedAtStartup) {
  for (std::string const listen : {"0.0.0.0:9464", "192.0.2.1:9464", "[::]:9464", "localhost:9464",
                                   "unix:relative.sock", "127.0.0.1:99999"}) {
    Daemon d{with_metrics(listen)};
    EXPECT_FALSE(d.ready()) << listen;
    auto status = d.wait_exit(20s);
    ASSERT_TRUE(status) << listen;
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << listen;
    std::string const log = d.log();
    EXPECT_NE(log.find("start-up step 'serve metrics' failed: daemon.config_invalid: "
                       "metrics-listen " +
                       listen),
              std::string::npos)
        << log;
    EXPECT_FALSE(fs::exists(d.socket())) << listen;
  }
}

}  // namespace
}  // namespace custos::e2e
