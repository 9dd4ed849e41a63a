// host.info against its documentation and its side effects:
//  - the live result matches the schema in docs/openrpc.json member by member (every key the
//    daemon sends is documented, every required key is sent, types and enums hold), recursively;
//  - the daemon's host probe keeps its scratch cgroup (custos-probe-<pid>-<n>) inside the
//    daemon's own subtree: watched with inotify on the v2 mount while the daemon starts.
#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <sys/inotify.h>
#include <vector>

#include "harness.hpp"

namespace custos::e2e {
namespace {

json::object host_info_schema() {
  std::ifstream in(std::string{CUSTOS_SOURCE_DIR} + "/docs/openrpc.json");
  std::stringstream ss;
  ss << in.rdbuf();
  auto doc = json::parse(ss.str());
  for (auto const& m : doc.at("methods").as_array()) {
    if (m.at("name").as_string() == "host.info") return m.at("result").at("schema").as_object();
  }
  return {};
}

bool has_type(json::value const& v, std::string_view type) {
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_bool();
  if (type == "integer") return v.is_int64() || v.is_uint64();
  if (type == "number") return v.is_number();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "null") return v.is_null();
  return false;
}

// The subset of JSON Schema docs/openrpc.json uses for host.info. An object schema with
// `properties` is treated as closed: a member it does not list is a finding, so the document
// cannot fall behind the daemon silently. Findings are "pointer: problem" lines.
void check(json::value const& v, json::object const& schema, std::string const& ptr,
           std::vector<std::string>& out) {
  if (auto const* t = schema.if_contains("type")) {
    bool okay = false;
    if (t->is_string()) {
      okay = has_type(v, t->as_string());
    } else {
      for (auto const& each : t->as_array()) okay = okay || has_type(v, each.as_string());
    }
    if (!okay) {
      out.push_back(ptr + ": type is not " + json::serialize(*t));
      return;
    }
  }
  if (auto const* e = schema.if_contains("enum")) {
    auto const& values = e->as_array();
    if (std::find(values.begin(), values.end(), v) == values.end())
      out.push_back(ptr + ": " + json::serialize(v) + " is not in the enum");
  }
  if (auto const* min = schema.if_contains("minimum"); min != nullptr && v.is_number()) {
    if (v.to_number<double>() < min->to_number<double>())
      out.push_back(ptr + ": below the minimum");
  }
  if (v.is_object()) {
    auto const& obj = v.as_object();
    auto const* props = schema.if_contains("properties");
    if (props == nullptr) {
      out.push_back(ptr + ": an object whose members the schema does not list");
      return;
    }
    if (auto const* req = schema.if_contains("required")) {
      for (auto const& k : req->as_array()) {
        if (!obj.contains(k.as_string()))
          out.push_back(ptr + "/" + std::string{k.as_string()} + ": required, not sent");
      }
    }
    for (auto const& [key, member] : obj) {
      auto const* sub = props->as_object().if_contains(key);
      std::string const child = ptr + "/" + std::string{key};
      if (sub == nullptr) {
        out.push_back(child + ": sent but not in the schema");
        continue;
      }
      check(member, sub->as_object(), child, out);
    }
  }
  if (v.is_array()) {
    auto const* items = schema.if_contains("items");
    if (items == nullptr) {
      if (!v.as_array().empty()) out.push_back(ptr + ": array items not described");
      return;
    }
    std::size_t i = 0;
    for (auto const& item : v.as_array()) {
      check(item, items->as_object(), ptr + "/" + std::to_string(i++), out);
    }
  }
}

std::string joined(std::vector<std::string> const& v) {
  std::string s;
  for (auto const& x : v) s += x + "\n";
  return s;
}

TEST(HostInfo, ResultMatchesTheOpenRpcSchemaKeyForKey) {
  auto const schema = host_info_schema();
  ASSERT_FALSE(schema.empty()) << "host.info is missing from docs/openrpc.json";
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  auto r = c.call(1, "host.info");
  ASSERT_TRUE(r && r->contains("result"));
  auto const& result = r->at("result");
  std::vector<std::string> findings;
  check(result, schema, "", findings);
  EXPECT_TRUE(findings.empty()) << joined(findings);

  // The checker itself: an undocumented member, a missing required one and a wrong type are
  // each reported (so an empty list above means something).
  json::value tampered = result;
  tampered.as_object()["surprise"] = 1;
  tampered.as_object().erase("restart_policy");
  tampered.as_object()["capabilities"].as_object()["pidfd"] = "yes";
  std::vector<std::string> expected;
  check(tampered, schema, "", expected);
  std::string const all = joined(expected);
  EXPECT_NE(all.find("/surprise: sent but not in the schema"), std::string::npos) << all;
  EXPECT_NE(all.find("/restart_policy: required, not sent"), std::string::npos) << all;
  EXPECT_NE(all.find("/capabilities/pidfd: type"), std::string::npos) << all;
}

TEST(HostInfo, RepeatedCallsReturnTheSameBytes) {
  // The result is built once; a later call must not differ (nor lose the response framing).
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  ASSERT_TRUE(c.send_line(R"({"jsonrpc":"2.0","method":"host.info","id":7})"));
  auto first = c.read_line();
  ASSERT_TRUE(first);
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(c.send_line(R"({"jsonrpc":"2.0","method":"host.info","id":7})"));
    auto again = c.read_line();
    ASSERT_TRUE(again);
    ASSERT_EQ(*again, *first);
  }
  auto v = json::parse(*first);
  EXPECT_EQ(v.at("jsonrpc").as_string(), "2.0");
  EXPECT_EQ(v.at("id").as_int64(), 7);
  EXPECT_EQ(v.at("result").at("pid").as_int64(), d.pid());
  // A notification gets nothing back, a batch gets the same result inside an array.
  ASSERT_TRUE(c.send_line(R"({"jsonrpc":"2.0","method":"host.info"})"));
  ASSERT_TRUE(c.send_line(R"([{"jsonrpc":"2.0","method":"host.info","id":"b"}])"));
  auto batch = c.read_line();
  ASSERT_TRUE(batch);
  auto b = json::parse(*batch);
  ASSERT_TRUE(b.is_array());
  ASSERT_EQ(b.as_array().size(), 1U);
  EXPECT_EQ(b.as_array()[0].at("id").as_string(), "b");
  EXPECT_EQ(b.as_array()[0].at("result"), v.at("result"));
}

// Reads every pending inotify event of `fd`, keeping (watch descriptor, name) of creations.
void drain(int fd, std::vector<std::pair<int, std::string>>& created) {
  alignas(inotify_event) std::array<char, 65536> buf{};
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n <= 0) return;
    for (char const* p = buf.data(); p < buf.data() + n;) {
      auto const* ev = reinterpret_cast<inotify_event const*>(p);
      if ((ev->mask & IN_CREATE) != 0 && ev->len > 0) created.emplace_back(ev->wd, ev->name);
      p += sizeof(inotify_event) + ev->len;
    }
  }
}

TEST(HostInfo, ProbeScratchCgroupStaysInsideTheDaemonSubtree) {
  std::string const mount = "/sys/fs/cgroup/unified";
  if (!fs::exists(mount + "/cgroup.procs")) GTEST_SKIP() << "no cgroup v2 mount here";
  int const in = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(in, 0);
  // The harness puts the daemon's subtree directly under the mount, so a probe that creates its
  // scratch cgroup beside the subtree (under the mount, or the daemon's own cgroup "/" here)
  // shows up on this watch.
  int const wd_mount = ::inotify_add_watch(in, mount.c_str(), IN_CREATE);
  ASSERT_GE(wd_mount, 0);
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  std::vector<std::pair<int, std::string>> created;
  drain(in, created);
  ::close(in);
  std::string const mine = "custos-probe-" + std::to_string(d.pid()) + "-";
  for (auto const& [wd, name] : created) {
    EXPECT_NE(name.rfind(mine, 0), 0U) << name << " was created directly under " << mount;
  }
  // And the probe did run inside the subtree: host.info reports a writable cgroup whose check
  // names the subtree as the parent of its scratch cgroup.
  auto c = d.client();
  auto r = c.call(1, "host.info");
  ASSERT_TRUE(r && r->contains("result"));
  auto const& caps = r->at("result").at("capabilities").as_object();
  EXPECT_TRUE(caps.at("cgroup").at("writable").as_bool());
  bool named = false;
  for (auto const& check : caps.at("checks").as_array()) {
    auto const& o = check.as_object();
    if (o.at("name").as_string() != "cgroup_writable" &&
        o.at("name").as_string() != "clone3_into_cgroup")
      continue;
    std::string const detail{o.at("detail").as_string()};
    EXPECT_NE(detail.find(d.cgroup()), std::string::npos) << detail;
    named = true;
  }
  EXPECT_TRUE(named);
  EXPECT_EQ(r->at("result").at("cgroup_subtree").as_string(), d.cgroup());
}

}  // namespace
}  // namespace custos::e2e
