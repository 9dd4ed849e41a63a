// Shared helpers of the registry tests: temp state dirs, fabricated executions, raw SQL.
#pragma once

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "custos/core/plan_json.hpp"
#include "custos/registry/ownership.hpp"
#include "custos/registry/registry.hpp"
#include "custos/registry/sqlite.hpp"

namespace custos::registry::test {

// A fresh directory under $TMPDIR, removed with everything in it when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "custos-registry-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) std::abort();
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(TempDir const&) = delete;
  TempDir& operator=(TempDir const&) = delete;

  [[nodiscard]] std::filesystem::path const& path() const { return path_; }
  [[nodiscard]] std::filesystem::path state() const { return path_ / "state"; }
  [[nodiscard]] std::filesystem::path db() const { return state() / "registry.db"; }

 private:
  std::filesystem::path path_;
};

// Opens the registry of `t`'s state dir; a failure is a test failure (and nullptr).
inline std::unique_ptr<Registry> open_ok(TempDir const& t, OpenOptions const& o = {}) {
  auto r = Registry::open(t.state(), o);
  EXPECT_TRUE(r) << (r ? "" : r.error().message());
  return r ? std::move(*r) : nullptr;
}

// A real execution: identity + plan parsed by core and encoded canonically. `pad` grows argv
// (bigger rows).
inline NewExecution make_execution(std::string const& id, std::string const& action,
                                   std::string const& process = "proc-1",
                                   std::string const& session = "s1", std::size_t pad = 0) {
  boost::json::object ident{
      {"project_id", "p1"},       {"session_id", session}, {"run_id", "r1"},
      {"attempt_id", "a1"},       {"turn_id", "t1"},       {"action_id", action},
      {"process_id", process},    {"workspace_id", "w1"},  {"resource_id", "res1"},
      {"environment_id", "env1"}, {"generation", 3},       {"revision", 17}};
  boost::json::array argv{"true", boost::json::string(id)};
  if (pad > 0) argv.emplace_back(boost::json::string(std::string(pad, 'x')));
  boost::json::object plan{{"command", {{"executable", "/bin/true"}, {"argv", argv}}},
                           {"workspace", {{"root", "/tmp"}, {"access", "read_only"}}},
                           {"cwd", "."},
                           {"env", boost::json::array{}},
                           {"io", {{"mode", "pipes"}}}};
  auto i = core::parse_identity(ident);
  auto p = core::parse_plan(plan);
  if (!i || !p) std::abort();  // the fixture itself is wrong
  auto ex = make_new_execution(id, *i, *p);
  if (!ex) std::abort();
  return std::move(*ex);
}

// A syntactically valid pidfs identity that names no live process.
inline Ownership fake_staged(std::int32_t pid = 4242, std::uint64_t ino = 987654) {
  Ownership o;
  o.state = OwnershipState::staged;
  o.boot_id = "01234567-89ab-cdef-0123-456789abcdef";
  o.pidfs_dev = 15;
  o.pidfs_ino = ino;
  o.pid = pid;
  o.start_time_ticks = 1234;
  o.pid_ns_ino = 4026531836;
  return o;
}

inline TerminalBlob fake_terminal(std::string const& classification = "exited",
                                  std::string const& recovery = "observed") {
  TerminalBlob t;
  std::string const body = "terminal bytes " + classification + "/" + recovery;
  t.bytes.assign(body.begin(), body.end());
  t.digest = sha256_tagged(t.bytes);
  t.classification = classification;
  t.recovery = recovery;
  return t;
}

// Runs raw SQL on a closed registry file (tests damage rows on purpose).
inline void raw_exec(std::filesystem::path const& db_file, std::string const& sql_text) {
  auto db = sql::Db::open(db_file.string(), false);
  ASSERT_TRUE(db) << db.error().message();
  auto r = db->exec(sql_text);
  ASSERT_TRUE(r) << r.error().message();
}

#define CUSTOS_ASSERT_OK(expr)                                           \
  do {                                                                   \
    auto const& custos_assert_r_ = (expr);                               \
    ASSERT_TRUE(custos_assert_r_) << custos_assert_r_.error().message(); \
  } while (0)

#define CUSTOS_EXPECT_ERRC(expr, errc)                                                    \
  do {                                                                                    \
    auto const& custos_expect_r_ = (expr);                                                \
    ASSERT_FALSE(custos_expect_r_) << "expected " << errc_wire(errc);                     \
    EXPECT_EQ(custos_expect_r_.error().code, errc) << custos_expect_r_.error().message(); \
  } while (0)

}  // namespace custos::registry::test
